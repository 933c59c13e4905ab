"""Norms and re-weighted sums of per-example gradients held as tensors (Algorithm 3, line 4, before the noise).

Per-example gradients come either as one tensor ``[B, ...]`` or as a mapping name → ``[B, ...]`` (one entry per
trainable parameter). An example's norm is taken over *all* its entries; the sum Σ_i f_i·g_i is formed without
copying the scaled gradients. An example with factor 0 (dropped by clipping for a non-finite norm) contributes
exactly 0, even if its entries are NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import torch
from torch import Tensor

__all__ = ["PerTupleGrads", "per_tuple_norms", "weighted_sum", "dropped_rows", "zero_rows"]

#: One tensor ``[B, ...]`` or a mapping parameter name → ``[B, ...]``.
PerTupleGrads = Union[Tensor, Mapping[str, Tensor]]


def _tensors(grads: PerTupleGrads) -> list[Tensor]:
    if isinstance(grads, Tensor):
        return [grads]
    if isinstance(grads, Mapping):
        if not grads:
            raise ValueError("`grads` is an empty mapping; pass at least one per-tuple gradient tensor.")
        return list(grads.values())
    raise TypeError(f"`grads` must be a Tensor [B, ...] or a mapping name -> Tensor [B, ...], got {type(grads).__name__}.")


def per_tuple_norms(grads: PerTupleGrads) -> Tensor:
    """‖g(T_i)‖₂ over every parameter of tuple i; returns ``[B]``."""
    tensors = _tensors(grads)
    size = tensors[0].shape[0]
    for t in tensors:
        if t.shape[0] != size:
            raise ValueError(f"All per-tuple gradients must share the leading batch size {size}, got {t.shape[0]}.")
    sq = [torch.linalg.vector_norm(t.reshape(size, -1) if t.numel() else t.reshape(size, 0), dim=1).pow(2) for t in tensors]
    return torch.stack(sq, 0).sum(0).sqrt()


def dropped_rows(factors: Tensor) -> Tensor | None:
    """Mask of the examples with factor 0 (non-finite norms), or None when there are none (the usual case)."""
    zero = factors == 0
    return zero if bool(zero.any()) else None


def zero_rows(t: Tensor, dropped: Tensor | None) -> Tensor:
    """``t`` with the dropped examples set to 0 (0·NaN would still be NaN)."""
    if dropped is None:
        return t
    return torch.where(dropped.reshape((-1,) + (1,) * (t.dim() - 1)), torch.zeros((), dtype=t.dtype, device=t.device), t)


def weighted_sum(grads: PerTupleGrads, factors: Tensor) -> PerTupleGrads:
    """Σ_i factor_i·g_i without materialising the clipped copies; drops the leading ``B`` dimension."""

    dropped = dropped_rows(factors)

    def one(t: Tensor) -> Tensor:
        return torch.tensordot(factors.to(t.dtype), zero_rows(t, dropped), dims=([0], [0]))

    if isinstance(grads, Tensor):
        return one(grads)
    return {name: one(t) for name, t in grads.items()}
