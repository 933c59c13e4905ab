"""The privacy callback's checks for models that release without optimizer steps (DP-GPL's PATE answers)."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytorch_lightning as pl

from lightning_dprel.accounting.mechanisms import check_unit
from lightning_dprel.core.checks import resolve_delta
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.privacy_layer import PrivacyLayer

__all__ = ["release_unit_of", "release_delta", "check_planned_releases", "check_releases_charged"]


def release_unit_of(trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> tuple[Any, int]:
    """(PrivacyUnit, number of units) of the data a release-making module answers on: the datamodule declares both."""
    from lightning_dprel.core.specs import privacy_unit

    dm = trainer.datamodule
    declared = getattr(dm, "privacy_unit", None) if dm is not None else None
    units = getattr(dm, "num_private_units", None) if dm is not None else None
    if declared is None or not isinstance(units, int) or units < 1:
        raise TypeError(
            f"PrivacyCallback: {type(pl_module).__name__} releases without optimizer steps; its datamodule must be a "
            f"PrivateDataModule declaring `privacy_unit` and `num_private_units`, got {type(dm).__name__}."
        )
    return privacy_unit(declared), units


def release_delta(layer: PrivacyLayer, given: Optional[float], unit: Any, units: int, *, warn: bool,
                  allow_large: bool = False) -> float:
    """δ of the releases: the callback's or the model's (the one it calibrates to; both given must
    agree), else 1/(10·n)."""
    declared = layer.declared_delta
    if declared is not None and given is not None and not math.isclose(declared, given, rel_tol=1e-12):
        raise ValueError(f"PrivacyCallback(delta={given}) contradicts the module's delta={declared}; give one.")
    return resolve_delta(given if given is not None else declared, unit, units, warn=warn, allow_large=allow_large)


def check_planned_releases(pl_module: "pl.LightningModule", planned: list, unit: Any, ledger: PrivacyLedger, *,
                           delta: float, target: Optional[float]) -> float:
    """Refuse, before the first release, planned releases for another unit or whose ε would pass ``target``; returns
    the ε the ledger must hold once they are made."""
    name = type(pl_module).__name__
    for event in planned:
        check_unit(event.mechanism, unit.name)
        if event.unit != unit.name:
            raise ValueError(f"{name} plans releases for the unit {event.unit!r}; the data declares {unit.name!r}.")
    after = ledger.after(planned).epsilon(delta)
    if target is not None and after > target:
        raise ValueError(
            f"PrivacyCallback: the {sum(e.count for e in planned)} releases {name} plans would spend ε = {after:.6g} at "
            f"δ = {delta:.3g} > target_epsilon = {target} (after ε = {ledger.epsilon(delta):.6g} already spent); refused "
            "before the first release. Raise the noise or the budget, or use calibrate=True."
        )
    return after


def check_releases_charged(pl_module: "pl.LightningModule", ledger: PrivacyLedger, *, delta: float, planned: float) -> None:
    """Refuse to train on releases the module made without charging them as it planned (ε below the planned ε)."""
    spent = ledger.epsilon(delta)
    if spent < planned * (1.0 - 1e-9):
        raise RuntimeError(
            f"{type(pl_module).__name__} planned releases worth ε = {planned:.6g} at δ = {delta:.3g}, but its ledger holds "
            f"ε = {spent:.6g}: releases were made without being charged. Charge every release with `charge(event)`."
        )
