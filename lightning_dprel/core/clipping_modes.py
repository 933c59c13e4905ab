"""Clipping as a registered strategy: name → how per-row factors follow from norms, and the bound
each row then has.

The core registers the generic modes (``"standard"``: every row clipped to C; ``"none"``: the
non-private baseline); a method registers its own (:func:`register_clipping`) and the mechanisms a
(clipping, accounting) pair selects (:func:`register_mechanism_choice`). Light: no torch at import
(the factor rules use the norms' own methods).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lightning_dprel.core.discovery import MethodRegistry

__all__ = [
    "Clipping",
    "CLIPPINGS",
    "register_clipping",
    "clipping_mode",
    "clip_factors",
    "register_mechanism_choice",
    "chosen_mechanism",
]

#: (norms ``[B]``, C, the batch's facts such as ``max_freq``) → factors ``[B]``.
FactorRule = Callable[..., Any]


@dataclass(frozen=True)
class Clipping:
    """A clipping mode: its factor rule and what each row's clipped gradient is bounded by (for
    reports)."""

    name: str
    factors: FactorRule
    bound: str
    private: bool = True
    needs_max_freq: bool = False  # the factor rule reads each row's max-freq from the batch


CLIPPINGS: MethodRegistry[Clipping] = MethodRegistry("clipping modes")
#: "clipping:accounting" → mechanism name ("clipping:" for the clipping's own bound, when
#: ``accounting`` is None).
_CHOICES: MethodRegistry[str] = MethodRegistry("mechanism choices")


def register_clipping(mode: Clipping) -> Clipping:
    """Make a clipping mode known by name (a taken name is refused unless it is the same mode)."""
    known = CLIPPINGS.peek(mode.name)
    if known is not None and known != mode:
        raise ValueError(f"A different clipping mode is already named {mode.name!r}.")
    CLIPPINGS[mode.name] = mode
    return mode


def clipping_mode(name: str) -> Clipping:
    """The registered clipping mode ``name``, else a clear ``ValueError``."""
    if not isinstance(name, str) or name not in CLIPPINGS:
        raise ValueError(
            f"`clipping` must be one of {tuple(sorted(CLIPPINGS))}, got "
            f"{name!r}{CLIPPINGS.failures()}."
        )
    return CLIPPINGS[name]


def register_mechanism_choice(clipping: str, accounting: str | None, mechanism: str) -> None:
    """``NoiseSpec(clipping=clipping, accounting=accounting)`` accounts with ``mechanism`` (None:
    the clipping's own); a taken pair is refused for a different mechanism."""
    key = f"{clipping}:{accounting or ''}"
    known = _CHOICES.peek(key)
    if known is not None and known != mechanism:
        raise ValueError(f"(clipping, accounting) = {key!r} already selects {known!r}, not {mechanism!r}.")
    _CHOICES[key] = mechanism


def chosen_mechanism(clipping: str, accounting: str | None) -> str:
    """The mechanism a (clipping, accounting) pair selects: a registered choice, else ``accounting``
    itself (a mechanism's name, checked by the ledger), else a ``ValueError`` asking for one."""
    if not clipping_mode(clipping).private:
        return "none"
    key = f"{clipping}:{accounting or ''}"
    if key in _CHOICES:
        return _CHOICES[key]
    if accounting is None:
        raise ValueError(
            f"No mechanism is registered as clipping={clipping!r}'s own bound; pass `accounting=` "
            "a "
            "registered mechanism name."
        )
    return accounting


def clip_factors(norms: Any, thresholds: Any) -> Any:
    """factor_i = 1 / max{1, ‖g_i‖ / t_i} = min{1, t_i / ‖g_i‖}, so ‖factor_i·g_i‖ = min{‖g_i‖,
    t_i}.

    A row with a non-finite norm (NaN/inf entries, or a squared norm that overflows) gets factor 0
    and is dropped by
    the weighted sums: otherwise one row would turn the whole noised sum into NaN, an event of
    unbounded sensitivity. 0 is within every threshold, so the analysis holds.
    """
    if hasattr(thresholds, "to"):
        thresholds = thresholds.to(dtype=norms.dtype, device=norms.device)
    else:
        thresholds = norms.new_full((), float(thresholds))
    factors = thresholds / norms.maximum(thresholds)
    return factors.where(norms.isfinite(), factors.new_zeros(()))


def _standard(norms: Any, clip_norm: float, **facts: Any) -> Any:
    return clip_factors(norms, clip_norm)


def _none(norms: Any, clip_norm: float, **facts: Any) -> Any:
    return norms.new_ones(norms.shape)


register_clipping(Clipping("standard", _standard, "every row clipped to C"))
register_clipping(
    Clipping("none", _none, "unbounded (the non-private baseline: σ must be 0)", private=False)
)
