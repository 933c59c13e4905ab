"""Clipping and noise diagnostics of a private step (issue 10): computed without noise, OUTSIDE the guarantee.

For diagnosis only, never to be released: per-tuple norm quantiles, the cosine between the clipped and the
unclipped sums, the norms of the clipped sum, of the noise and of the parameter update.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["norm_stats", "sum_stats", "update_norm"]


def norm_stats(norms: Tensor, factors: Tensor) -> dict[str, float]:
    """Per-tuple norm quantiles (q10, q50, q90) before clipping and the mean clipped norm."""
    if not norms.numel():
        return {}
    finite = norms[torch.isfinite(norms)].double()
    out = {f"norm_q{int(q * 100)}": float(torch.quantile(finite, q)) if finite.numel() else float("nan") for q in (0.1, 0.5, 0.9)}
    clipped = norms.double() * factors.double()
    out["mean_clipped_norm"] = float(clipped[torch.isfinite(clipped)].mean()) if finite.numel() else 0.0
    return out


def sum_stats(names: list[str], clipped: dict[str, Tensor], unclipped: dict[str, Tensor], noised: dict[str, Tensor]) -> dict[str, float]:
    """Cosine(clipped sum, unclipped sum) and the norms of the clipped sum, the unclipped sum and the noise."""
    flat_c = torch.cat([clipped[n].reshape(-1).double() for n in names])
    flat_r = torch.cat([unclipped[n].reshape(-1).double() for n in names])
    flat_n = torch.cat([(noised[n] - clipped[n]).reshape(-1).double() for n in names])
    denom = float(flat_c.norm() * flat_r.norm())
    return {
        "cos_clipped_unclipped": float(flat_c @ flat_r) / denom if denom > 0 else float("nan"),
        "clipped_sum_norm": float(flat_c.norm()),
        "unclipped_sum_norm": float(flat_r.norm()),
        "noise_norm": float(flat_n.norm()),
    }


def update_norm(params: list[Tensor], before: list[Tensor]) -> float:
    """‖θ_after − θ_before‖₂ over every parameter."""
    return math.sqrt(sum(float((p.detach() - b).double().pow(2).sum()) for p, b in zip(params, before)))
