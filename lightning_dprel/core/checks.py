"""The library's argument checks: ints, numbers, probabilities, δ, choices (one rule each)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "ArgumentTypeError", "check_int", "positive_finite", "non_negative", "check_probability",
    "check_delta", "check_choice", "check_bool", "resolve_delta", "refuse_unsafe_trainer_settings",
]

_NUMBER = (int, float, np.integer, np.floating)


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: a ``TypeError``, and a ``ValueError`` to code catching one."""


def _got(value: Any) -> str:
    return f"got {type(value).__name__} ({value!r})"


def _arg(name: str) -> str:
    """``name`` as messages show it: backticked, a label after a space outside (`k` (K))."""
    head, _, label = name.partition(" ")
    return f"`{head}` {label}" if label else f"`{head}`"


def check_int(name: str, value: Any, minimum: int, remedy: str = "", *, maximum: int | None = None,
              optional: bool = False) -> Any:
    """``value`` as an int (None if ``optional``); ``TypeError`` unless an int, else ValueError."""
    if optional and value is None:
        return None
    wanted = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
    wanted = f"None or {wanted}" if optional else wanted
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{_arg(name)} must be {wanted}, {_got(value)}.{remedy}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{_arg(name)} must be {wanted}, got {value}.{remedy}")
    return int(value)


def _number(name: str, value: Any, wanted: str, example: str) -> float:
    """``value`` as a float; ``TypeError`` (saying what is ``wanted``) unless a number."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        raise ArgumentTypeError(f"{_arg(name)} must be {wanted}, {_got(value)}{example}.")
    return float(value)


def positive_finite(name: str, value: Any, example: str = "") -> float:
    """``value`` as a float; ``TypeError`` unless a number, ``ValueError`` unless > 0 and finite."""
    example = f"; {example}" if example else ""
    value = _number(name, value, "a number > 0", example)
    if not (value > 0.0) or math.isinf(value):
        raise ValueError(f"{_arg(name)} must be > 0 and finite, got {value}{example}.")
    return value


def non_negative(name: str, value: Any, example: str = "") -> float:
    """``value`` as a float; ``TypeError`` unless a number, ``ValueError`` if below 0 or NaN."""
    example = f"; {example}" if example else ""
    value = _number(name, value, "a number >= 0", example)
    if not value >= 0.0:
        raise ValueError(f"{_arg(name)} must be >= 0, got {value}{example}.")
    return value


def check_probability(name: str, value: Any, *, zero: bool = False, one: bool = False) -> float:
    """``value`` as a float in (0, 1), closed at 0 if ``zero``, at 1 if ``one``; else ValueError."""
    interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
    value = _number(name, value, f"a number in {interval}", "")
    if not ((0.0 <= value if zero else 0.0 < value) and (value <= 1.0 if one else value < 1.0)):
        raise ValueError(f"{_arg(name)} must be in {interval}, got {value}.")
    return value


def check_delta(delta: Any) -> float:
    """δ as a float; ``ValueError`` unless 0 < δ < 1."""
    remedy = "; pick δ well below 1/n for n privacy units"
    delta = _number("delta", delta, "a float in (0, 1)", remedy)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"`delta` must be in (0, 1), got {delta}{remedy}.")
    return delta


def check_choice(name: str, value: Any, options: Any, remedy: str = "") -> Any:
    """``value`` unchanged; ``ValueError`` unless one of ``options`` (a bool only if listed)."""
    try:
        ok = value in options and (not isinstance(value, bool) or any(o is value for o in options))
    except TypeError:  # unhashable: no option
        ok = False
    if not ok:
        raise ValueError(f"{_arg(name)} must be one of {tuple(options)}, got {value!r}.{remedy}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool; ``TypeError`` unless it is one (numpy's included)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{_arg(name)} must be a bool, {_got(value)}.")
    return bool(value)


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
