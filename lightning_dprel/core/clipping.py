"""Per-tuple clipping: FREQ-CLIP (Algorithm 1) and standard clipping, as factors from per-tuple norms.

The rules map per-tuple norms to factors, factor_i = 1 / max{1, ‖g_i‖ / t_i}, so the clipped sum Σ_i factor_i·g_i is
formed without copying. The norms and sums themselves come from the per-example gradient providers
(:mod:`lightning_dprel.grad_sample`); the helpers on formed gradients (one tensor ``[B, ...]`` or a mapping
name → ``[B, ...]``) take their norms from :func:`lightning_dprel.grad_sample.sums.per_tuple_norms`.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 1 (FREQ-CLIP: t_i = C / (2·max-freq(T_i))) and Eq. 2
    (standard clipping: t_i = C).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dprel.grad_sample.sums import PerTupleGrads, dropped_rows, per_tuple_norms, zero_rows

__all__ = [
    "clip_factors",
    "freq_clip_thresholds",
    "factors_from_norms",
    "freq_clip_factors",
    "standard_clip_factors",
    "apply_factors",
    "freq_clip",
    "standard_clip",
]


def _check_clip_norm(clip_norm: float) -> float:
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)):
        raise TypeError(f"`clip_norm` must be a float, got {type(clip_norm).__name__}.")
    if not (float(clip_norm) > 0.0) or clip_norm == float("inf"):
        raise ValueError(f"`clip_norm` must be > 0 and finite, got {clip_norm}.")
    return float(clip_norm)


def clip_factors(norms: Tensor, thresholds: Tensor | float) -> Tensor:
    """factor_i = 1 / max{1, ‖g_i‖ / t_i} = min{1, t_i / ‖g_i‖}, so ‖factor_i·g_i‖ = min{‖g_i‖, t_i}.

    A tuple with a non-finite norm (NaN/inf entries, or a squared norm that overflows) gets factor 0 and is
    dropped by :func:`apply_factors` and the providers' weighted sums: otherwise one tuple would turn the whole noised
    sum into NaN, an event of unbounded sensitivity. 0 is within every threshold, so the analysis holds.
    """
    thresholds = torch.as_tensor(thresholds, dtype=norms.dtype, device=norms.device)
    factors = thresholds / torch.maximum(norms, thresholds)
    return torch.where(torch.isfinite(norms), factors, torch.zeros((), dtype=factors.dtype, device=factors.device))


def freq_clip_thresholds(max_freq: Tensor, clip_norm: float) -> Tensor:
    """Algorithm 1's per-tuple threshold t_i = C / (2·max-freq(T_i)); ``max_freq`` ``[B]``, entries ≥ 1."""
    clip_norm = _check_clip_norm(clip_norm)
    if not isinstance(max_freq, Tensor) or max_freq.dim() != 1:
        raise ValueError(f"`max_freq` must be a 1-D tensor [B], got {getattr(max_freq, 'shape', type(max_freq))}.")
    if max_freq.numel() and int(max_freq.min()) < 1:
        raise ValueError(
            f"`max_freq` entries must be >= 1 (every node of a tuple occurs in it), got min {int(max_freq.min())}; "
            "compute it with lightning_dprel.datamodules.edge_tuples.sampling.max_freq over the global batch."
        )
    return clip_norm / (2.0 * max_freq.double())


def factors_from_norms(norms: Tensor, clipping: str, *, clip_norm: float, max_freq: Tensor | None = None) -> Tensor:
    """Per-tuple factors ``[B]`` of one clipping mode from the norms (the optimizer's training path uses this).

    ``"freq"``: t_i = C / (2·max-freq(T_i)) (Algorithm 1); ``"standard"``: t_i = C (Eq. 2); ``"none"``: 1.
    """
    if clipping == "freq":
        if max_freq is None or max_freq.shape != norms.shape:
            got = None if max_freq is None else tuple(max_freq.shape)
            raise ValueError(f"`max_freq` must have shape [B] = {tuple(norms.shape)}, got {got}; take it from TupleBatch.max_freq.")
        return clip_factors(norms, freq_clip_thresholds(max_freq.to(norms.device), clip_norm).to(norms.dtype))
    if clipping == "standard":
        return clip_factors(norms, _check_clip_norm(clip_norm))
    if clipping == "none":
        return torch.ones_like(norms)
    raise ValueError(f"`clipping` must be 'freq', 'standard' or 'none', got {clipping!r}.")


def freq_clip_factors(grads: PerTupleGrads, max_freq: Tensor, *, clip_norm: float) -> Tensor:
    """FREQ-CLIP factors (Algorithm 1): clip tuple i to C / (2·max-freq(T_i)); returns ``[B]``."""
    return factors_from_norms(per_tuple_norms(grads), "freq", clip_norm=clip_norm, max_freq=max_freq)


def standard_clip_factors(grads: PerTupleGrads, *, clip_norm: float) -> Tensor:
    """Standard clipping factors (Eq. 2 baseline): clip every tuple to C; returns ``[B]``."""
    return factors_from_norms(per_tuple_norms(grads), "standard", clip_norm=clip_norm)


def _scale(t: Tensor, factors: Tensor, dropped: Tensor | None = None) -> Tensor:
    return zero_rows(t, dropped) * factors.to(t.dtype).reshape((-1,) + (1,) * (t.dim() - 1))


def apply_factors(grads: PerTupleGrads, factors: Tensor) -> PerTupleGrads:
    """The clipped per-tuple gradients factor_i·g_i, in the structure of ``grads``."""
    dropped = dropped_rows(factors)
    if isinstance(grads, Tensor):
        return _scale(grads, factors, dropped)
    return {name: _scale(t, factors, dropped) for name, t in grads.items()}


def freq_clip(grads: PerTupleGrads, max_freq: Tensor, *, clip_norm: float) -> PerTupleGrads:
    """FREQ-CLIP (Algorithm 1) per tuple: ḡ(T_i) = g(T_i) / max{1, 2·max-freq(T_i)·‖g(T_i)‖ / C}."""
    return apply_factors(grads, freq_clip_factors(grads, max_freq, clip_norm=clip_norm))


def standard_clip(grads: PerTupleGrads, *, clip_norm: float) -> PerTupleGrads:
    """Standard clipping per tuple: ḡ(T_i) = g(T_i) / max{1, ‖g(T_i)‖ / C}."""
    return apply_factors(grads, standard_clip_factors(grads, clip_norm=clip_norm))
