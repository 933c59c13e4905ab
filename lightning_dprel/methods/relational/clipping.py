"""FREQ-CLIP (Algorithm 1), the relational method's clipping mode ``"freq"``, registered on import.

Tuple i is clipped to t_i = C / (2·max-freq(T_i)), where max-freq counts how often the tuple's most
frequent node occurs in the global batch
(:func:`lightning_dprel.datamodules.edge_tuples.sampling.max_freq`).

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 1 (FREQ-CLIP: t_i = C / (2·max-freq(T_i))).
"""

from __future__ import annotations

from torch import Tensor

from lightning_dprel.core.clipping import check_clip_norm, clip_factors, clip_grads, grads_factors
from lightning_dprel.core.clipping_modes import Clipping, register_clipping

#: One tensor ``[B, ...]`` or a mapping name → ``[B, ...]`` of per-tuple gradients.
PerTupleGrads = "Tensor | dict[str, Tensor]"

__all__ = ["FREQ", "freq_clip_thresholds", "freq_clip_factors", "freq_clip"]


def freq_clip_thresholds(max_freq: Tensor, clip_norm: float) -> Tensor:
    """Algorithm 1's per-tuple threshold t_i = C / (2·max-freq(T_i)); ``max_freq`` ``[B]``, entries
    ≥ 1."""
    clip_norm = check_clip_norm(clip_norm)
    if not isinstance(max_freq, Tensor) or max_freq.dim() != 1:
        raise ValueError(
            "`max_freq` must be a 1-D tensor [B], got "
            f"{getattr(max_freq, 'shape', type(max_freq))}."
        )
    if max_freq.numel() and int(max_freq.min()) < 1:
        raise ValueError(
            "`max_freq` entries must be >= 1 (every node of a tuple occurs in it), got min "
            f"{int(max_freq.min())}; "
            "compute it with lightning_dprel.datamodules.edge_tuples.sampling.max_freq over the "
            "global batch."
        )
    return clip_norm / (2.0 * max_freq.double())


def _freq_factors(norms: Tensor, clip_norm: float, max_freq: Tensor | None = None) -> Tensor:
    if max_freq is None or max_freq.shape != norms.shape:
        got = None if max_freq is None else tuple(max_freq.shape)
        raise ValueError(
            f"`max_freq` must have shape [B] = {tuple(norms.shape)}, got {got}; take it from "
            "TupleBatch.max_freq."
        )
    return clip_factors(
        norms, freq_clip_thresholds(max_freq.to(norms.device), clip_norm).to(norms.dtype)
    )


FREQ = register_clipping(
    Clipping("freq", _freq_factors, "tuple i clipped to C / (2·max-freq(T_i)) (Algorithm 1)",
             needs_max_freq=True)
)


def freq_clip_factors(grads: PerTupleGrads, max_freq: Tensor, *, clip_norm: float) -> Tensor:
    """FREQ-CLIP factors (Algorithm 1): clip tuple i to C / (2·max-freq(T_i)); returns ``[B]``."""
    return grads_factors(grads, "freq", clip_norm=clip_norm, max_freq=max_freq)


def freq_clip(grads: PerTupleGrads, max_freq: Tensor, *, clip_norm: float) -> PerTupleGrads:
    """FREQ-CLIP (Algorithm 1) per tuple: ḡ(T_i) = g(T_i) / max{1, 2·max-freq(T_i)·‖g(T_i)‖ / C}."""
    return clip_grads(grads, "freq", clip_norm=clip_norm, max_freq=max_freq)
