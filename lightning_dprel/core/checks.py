"""Argument checks shared by the whole library: ints, positive numbers, δ (one home for each rule)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_int", "positive_finite", "check_delta", "resolve_delta", "refuse_unsafe_trainer_settings"]


def check_int(name: str, value: Any, minimum: int, remedy: str = "") -> int:
    """``value`` as an int; ``TypeError`` unless it is an int, ``ValueError`` if it is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} ({value!r}).")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.{remedy}")
    return int(value)


def positive_finite(name: str, value: Any, example: str) -> float:
    """``value`` as a float; ``TypeError`` unless it is a number, ``ValueError`` unless it is > 0 and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} ({value!r}); {example}.")
    value = float(value)
    if not (value > 0.0) or math.isinf(value):
        raise ValueError(f"`{name}` must be > 0 and finite, got {value}; {example}.")
    return value


def check_delta(delta: Any) -> float:
    """δ as a float; ``ValueError`` unless 0 < δ < 1."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise TypeError(f"`delta` must be a float in (0, 1), got {type(delta).__name__} ({delta!r}).")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(
            f"`delta` must be in (0, 1), got {delta}; the paper uses delta = 1/|E_train| (edges after capping)."
        )
    return delta


#: δ must sit well below 1/n: n·δ above this warns (n·δ bounds the chance that some unit is released outright).
DELTA_TIMES_UNITS_WARN = 0.5


def resolve_delta(delta: float | None, unit: Any, units: int, *, population: int | None = None,
                  warn: bool, who: str = "PrivacyCallback: ", allow_large: bool = False) -> float:
    """δ, by default 1/(10·n), or 1/population where the unit asks for it (``delta_per_row``: the
    relational paper's 1/m over capped relations) and that is below 1/n; refuses
    n·δ ≥ 1 unless ``allow_large`` (one of the n units could be released outright with probability about n·δ) and
    warns unless δ is well below 1/n."""
    n = int(units)  # ``unit``: a PrivacyUnit (its name and what it counts); core.specs imports this module
    if delta is None:
        per_row = unit.delta_per_row and population and population > n
        delta = 1.0 / population if per_row else 1.0 / (10 * n)
    delta = check_delta(delta)
    how = "not below" if delta * n >= 1.0 else "not well below"
    said = (f"{who}δ = {delta:.3g} is {how} 1/n = {1.0 / n:.3g} (n = {n} {unit.counted_as}). The privacy unit is "
            f"{unit.name!r}, so a δ near or above 1/n allows releasing one unit outright (n·δ = {n * delta:.2g})")
    if delta * n >= 1.0 and not allow_large:
        raise ValueError(f"{said}: no meaningful guarantee. Pass a smaller `delta` (e.g. 1/(10·n) = {0.1 / n:.3g}), "
                         "or allow_large_delta=True to report such a δ anyway.")
    if warn and delta * n > DELTA_TIMES_UNITS_WARN:
        from pytorch_lightning.utilities.rank_zero import rank_zero_warn

        rank_zero_warn(f"{said}; pass a smaller `delta` (e.g. 1/(10·n)) for a meaningful guarantee.", category=UserWarning)
    return delta


def refuse_unsafe_trainer_settings(trainer: Any) -> None:
    """Raise ``ValueError`` when the Trainer would clip or accumulate gradients behind the DP step (the one check)."""
    clip = getattr(trainer, "gradient_clip_val", None)
    if clip not in (None, 0, 0.0):
        raise ValueError(
            f"Trainer(gradient_clip_val={clip}) would clip the already-noised gradient and is not part of the "
            "privacy analysis; remove it and set `clip_norm` on the module instead."
        )
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if accumulate != 1:
        raise ValueError(
            f"Trainer(accumulate_grad_batches={accumulate}) would split one logical batch across steps, while "
            "the clipping frequencies and the noise are per logical batch (one optimizer step must use exactly one "
            "sampled batch, Algorithm 3); set it to 1 and raise the datamodule's expected batch size instead."
        )
