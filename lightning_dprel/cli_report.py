"""The main job's report beyond base vs trained: the privacy of a plain module made private, the datamodule's own
baselines (e.g. DP popularity at the same ε), a reference row read from a committed benchmark, and ``report.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["callback_privacy", "baseline_rows", "reference_row", "unit_text", "write_report"]


def _privacy_callback(trainer: Any) -> Any:
    return next((cb for cb in trainer.callbacks if getattr(cb, "charges_privacy_ledger", False)), None)


def callback_privacy(trainer: Any) -> dict[str, Any] | None:
    """The privacy line of a plain module that ``PrivacyCallback`` made private: ε at δ, its bound (PLD / RDP), σ, C."""
    cb = _privacy_callback(trainer)
    ledger = getattr(cb, "ledger", None)
    if cb is None or ledger is None or not ledger.segments or cb.delta is None:
        return None
    bounds = ledger.epsilon_bounds(cb.delta, mechanism=cb.mechanism, orders=cb.orders, accountant=cb.accountant_kind)
    eps = float(cb.epsilon)
    if math.isinf(eps):
        return {"text": "none: a step ran without noise (epsilon = inf)", "epsilon": eps}
    bound = str(bounds.get("bound", "rdp")).upper()
    other = {k: v for k, v in bounds.items() if k in ("pld", "rdp") and v is not None}
    text = (f"epsilon = {eps:.4f} (delta = {cb.delta:.3g}, target {cb.target_epsilon}; proven by the {bound} bound; "
            + ", ".join(f"{k.upper()} {v:.4f}" for k, v in other.items())
            + f"), steps = {cb.steps}, sigma = {cb.noise_multiplier:.4g}, C = {cb.clip_norm}")
    return {"text": text, "epsilon": eps, "delta": float(cb.delta), "target": cb.target_epsilon, "steps": cb.steps,
            "sigma": float(cb.noise_multiplier), "clip_norm": cb.clip_norm, "bound": bound.lower(),
            "bounds": {k: float(v) for k, v in other.items()}}


def baseline_rows(datamodule: Any, privacy: dict[str, Any] | None, ledger: Any = None) -> list[dict[str, Any]]:
    """The datamodule's baselines at the run's (ε, δ) (``report_baselines``), each ``{"name", "metrics", ...}``; the
    model's ``ledger`` lets a baseline that is a release of its own say what both spend together."""
    make = getattr(datamodule, "report_baselines", None)
    if not callable(make) or not privacy or not math.isfinite(privacy.get("epsilon", math.inf)):
        return []
    return list(make(privacy["target"] or privacy["epsilon"], privacy["delta"], ledger=ledger))


def reference_row(path: str | None, row: str, metrics: tuple[tuple[str, str], ...]) -> dict[str, Any] | None:
    """Row ``row`` of a committed benchmark summary (``{"summary": {row: {"map": …}}}``), labelled as a reference."""
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        return {"name": f"{row} (reference: {path} not found)", "metrics": {}, "reference": str(path)}
    summary = json.loads(file.read_text()).get("summary", {})
    if row not in summary:
        raise ValueError(f"--reference_row {row!r} is not a row of {path}; its rows: {sorted(summary)}.")
    values = {key: summary[row].get(key.removeprefix("test_")) for key, _ in metrics}
    return {"name": f"{row} (reference from {file.name}; not trained here)",
            "metrics": {k: float(v) for k, v in values.items() if v is not None}, "reference": str(path)}


def unit_text(datamodule: Any) -> str | None:
    """What one privacy unit is, in the data's words (``unit_text``), else the declared unit's name."""
    text = getattr(datamodule, "unit_text", None)
    if text:
        return str(text)
    unit = getattr(datamodule, "privacy_unit", None)
    if unit is None:
        return None
    from lightning_dprel.core.specs import privacy_unit

    try:
        return f"{unit}: {privacy_unit(unit).description}"
    except ValueError:
        return f"privacy unit {unit}"


def write_report(path: Path, rows: list[dict[str, Any]], privacy: dict[str, Any] | None, unit: str | None,
                 extra: dict[str, Any]) -> Path:
    """``report.json``: the rows printed, ε, δ, the bound and the unit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = ("epsilon", "delta", "bound", "bounds", "target", "steps", "sigma", "clip_norm")
    body = {"rows": rows, **{k: (privacy or {}).get(k) for k in keys}, "privacy_unit": unit, **extra}
    path.write_text(json.dumps(body, indent=2, default=str))
    return path
