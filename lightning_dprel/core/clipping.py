"""Per-row clipping as factors from per-row norms, by the registered clipping mode
(:mod:`.clipping_modes`).

The rules map per-row norms to factors, factor_i = 1 / max{1, ‖g_i‖ / t_i}, so the clipped sum Σ_i
factor_i·g_i is formed without copying. The norms and sums themselves come from the per-example
gradient providers (:mod:`lightning_dprel.grad_sample`); the helpers on formed gradients (one tensor
``[B, ...]`` or a mapping name → ``[B, ...]``) take their norms from
:func:`lightning_dprel.grad_sample.sums.per_tuple_norms`. The core's modes are ``"standard"`` (t_i =
C) and ``"none"``; a method registers its own (the relational method's FREQ-CLIP).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_dprel.core.checks import positive_finite
from lightning_dprel.core.clipping_modes import clip_factors, clipping_mode
from lightning_dprel.grad_sample.sums import PerTupleGrads, dropped_rows, per_tuple_norms, zero_rows

__all__ = [
    "clip_factors",
    "check_clip_norm",
    "factors_from_norms",
    "grads_factors",
    "clip_grads",
    "standard_clip_factors",
    "apply_factors",
    "standard_clip",
]


def check_clip_norm(clip_norm: float) -> float:
    """C as a float, or a clear error unless it is a finite number > 0."""
    return positive_finite("clip_norm", clip_norm)


def factors_from_norms(norms: Tensor, clipping: str, *, clip_norm: float, **facts: Any) -> Tensor:
    """Per-row factors ``[B]`` of a registered clipping mode from the norms (the optimizer's
    training path uses this).

    ``facts``: what the mode reads from the batch besides the norms (FREQ-CLIP's ``max_freq``); None
    entries are dropped, so a mode that needs one names it in its error.
    """
    mode = clipping_mode(clipping)
    if not mode.private:
        return mode.factors(norms, clip_norm)
    given = {k: v for k, v in facts.items() if v is not None}
    return mode.factors(norms, check_clip_norm(clip_norm), **given)


def grads_factors(grads: PerTupleGrads, clipping: str, *, clip_norm: float, **facts: Any) -> Tensor:
    """Per-row factors ``[B]`` of a clipping mode for formed per-row gradients."""
    return factors_from_norms(per_tuple_norms(grads), clipping, clip_norm=clip_norm, **facts)


def clip_grads(
    grads: PerTupleGrads, clipping: str, *, clip_norm: float, **facts: Any
) -> PerTupleGrads:
    """The per-row gradients clipped by a clipping mode, in the structure of ``grads``."""
    return apply_factors(grads, grads_factors(grads, clipping, clip_norm=clip_norm, **facts))


def standard_clip_factors(grads: PerTupleGrads, *, clip_norm: float) -> Tensor:
    """Standard clipping factors (Eq. 2 baseline): clip every row to C; returns ``[B]``."""
    return grads_factors(grads, "standard", clip_norm=clip_norm)


def _scale(t: Tensor, factors: Tensor, dropped: Tensor | None = None) -> Tensor:
    return zero_rows(t, dropped) * factors.to(t.dtype).reshape((-1,) + (1,) * (t.dim() - 1))


def apply_factors(grads: PerTupleGrads, factors: Tensor) -> PerTupleGrads:
    """The clipped per-row gradients factor_i·g_i, in the structure of ``grads``."""
    dropped = dropped_rows(factors)
    if isinstance(grads, Tensor):
        return _scale(grads, factors, dropped)
    return {name: _scale(t, factors, dropped) for name, t in grads.items()}


def standard_clip(grads: PerTupleGrads, *, clip_norm: float) -> PerTupleGrads:
    """Standard clipping per row: ḡ_i = g_i / max{1, ‖g_i‖ / C}."""
    return clip_grads(grads, "standard", clip_norm=clip_norm)
