"""Fit-start checks and fact lookups of the privacy callback (pure functions, clear errors)."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from lightning_dprel.accounting import get_mechanism, registered_mechanisms
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec

def positive_finite(name: str, value: Any, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} ({value!r}); {example}.")
    value = float(value)
    if not (value > 0.0) or math.isinf(value):
        raise ValueError(f"`{name}` must be > 0 and finite, got {value}; {example}.")
    return value


def check_trainer(trainer: "pl.Trainer") -> None:
    """Refuse trainer settings that would override a budget stop or break the accounting."""
    fit_loop = trainer.fit_loop
    if fit_loop.min_steps:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(min_steps={fit_loop.min_steps})`: Lightning ignores a stop until "
            "min_steps are done, so training could run past the privacy budget. Remove min_steps."
        )
    if fit_loop.min_epochs:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(min_epochs={fit_loop.min_epochs})`: Lightning ignores a stop until "
            "min_epochs are done, so training could run past the privacy budget. Remove min_epochs."
        )
    if trainer.accumulate_grad_batches != 1:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})`: one "
            "optimizer step must use exactly one sampled batch (Algorithm 3). Raise the datamodule's "
            "expected batch size instead."
        )
    if trainer.overfit_batches:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(overfit_batches={trainer.overfit_batches})`: replaying fixed "
            "batches is not Poisson sampling, so the accounting does not apply. Remove overfit_batches."
        )


def _fact(pl_module: "pl.LightningModule", name: str, kind: type, what: str, remedy: str) -> Any:
    value = getattr(pl_module, name, None)
    if not isinstance(value, kind):
        raise TypeError(
            f"PrivacyCallback needs `pl_module.{name}`, {what}; {type(pl_module).__name__} gives "
            f"{type(value).__name__}. {remedy}"
        )
    return value


def noise_spec_of(pl_module: "pl.LightningModule") -> NoiseSpec:
    return _fact(pl_module, "noise_spec", NoiseSpec, "a lightning_dprel.core.specs.NoiseSpec (σ, C, clipping, accounting)",
                 "Use DPRelationalModule or add a `noise_spec` property to your module.")


def ledger_of(pl_module: "pl.LightningModule") -> PrivacyLedger:
    return _fact(pl_module, "privacy_ledger", PrivacyLedger,
                 "a lightning_dprel.core.ledger.PrivacyLedger (what the model spent)",
                 "Use a PrivateModule (DPRelationalModule, DPNodeModule), or hold a PrivacyLedger and charge every "
                 "release with the training batch as its sample: DPOptimizer.attach_step_hook(lambda r: "
                 "ledger.charge(r, sample=<this batch's id>)) (releases of one sample are one step at σ/√r).")


def sampling_spec_of(trainer: "pl.Trainer", explicit: Optional[SamplingSpec]) -> SamplingSpec:
    datamodule = trainer.datamodule
    found = getattr(datamodule, "sampling_spec", None) if datamodule is not None else None
    if found is not None and not isinstance(found, SamplingSpec):
        raise TypeError(
            f"`trainer.datamodule.sampling_spec` must be a lightning_dprel.core.specs.SamplingSpec, got "
            f"{type(found).__name__}."
        )
    if found is not None and explicit is not None and found != explicit:
        raise ValueError(
            f"PrivacyCallback(sampling_spec={explicit}) contradicts trainer.datamodule.sampling_spec={found}. "
            "Pass sampling_spec=None to use the datamodule's."
        )
    spec = found if found is not None else explicit
    if spec is None:
        where = "no datamodule" if datamodule is None else f"datamodule {type(datamodule).__name__}"
        raise ValueError(
            f"PrivacyCallback needs a SamplingSpec (m, n, K, γ, k, b); the trainer has {where} exposing "
            "`sampling_spec` after setup. Use RelationalDataModule, add a `sampling_spec` property to your "
            "datamodule, or pass PrivacyCallback(sampling_spec=...)."
        )
    return spec


def resolve_delta(delta: Optional[float], sampling: SamplingSpec, *, warn: bool) -> float:
    """δ, by default for entities the paper's 1/m (capped relations), for other units 1/(10·N); warns if δ ≥ 1/N units."""
    unit, n = sampling.unit, sampling.units
    if delta is None:
        delta = 1.0 / sampling.num_edges if unit.name == "entity" else 1.0 / (10 * n)
    if warn and delta >= 1.0 / n:
        rank_zero_warn(
            f"PrivacyCallback: δ = {delta:.3g} is not below 1/n = {1.0 / n:.3g} (n = {n} {unit.counted_as}). "
            f"The privacy unit is {unit.name!r}, so a δ ≥ 1/n allows releasing one unit outright; pass a smaller "
            "`delta` (e.g. 1/(10·n)) for a meaningful guarantee.",
            category=UserWarning,
        )
    return delta


def check_not_over(epsilon: float, target: float, steps: int, *, releases: int, planned: int) -> None:
    """Raise if a step ran past the budget: more releases on one sample than planned, or a stop was overridden."""
    if epsilon <= target:
        return
    if releases > planned:
        raise RuntimeError(
            f"PrivacyCallback: ε = {epsilon:.6g} exceeds target_epsilon = {target}: the last batch released {releases} "
            f"noised sums on one sample where {planned} were planned. Set the module's `releases_per_sample = "
            f"{releases}` so that the budget and calibration plan for them."
        )
    raise RuntimeError(
        f"PrivacyCallback: ε = {epsilon:.6g} exceeds target_epsilon = {target} after {steps} steps: a step ran after "
        "the callback set `trainer.should_stop`. Do not reset `trainer.should_stop` or call `fit` again without "
        "raising the budget."
    )


def check_private(noise: NoiseSpec, target_epsilon: Optional[float]) -> None:
    if noise.noise_multiplier > 0.0:
        return
    budget = f" but target_epsilon={target_epsilon} was asked" if target_epsilon is not None else ""
    raise ValueError(
        f"PrivacyCallback: the module's noise_multiplier is 0, so ε is infinite{budget}. Set "
        "noise_multiplier > 0 on the module, or use PrivacyCallback(target_epsilon=..., calibrate=True)."
    )


def planned_steps(trainer: "pl.Trainer", sampling: SamplingSpec) -> int:
    """Steps this fit will still take: the trainer's planned total minus its (resumed) global step."""
    total = trainer.estimated_stepping_batches
    if math.isinf(total) or total <= 0:
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs <= 0:
            raise ValueError(
                f"PrivacyCallback(calibrate=True) needs a finite number of steps, got max_steps="
                f"{trainer.max_steps}, max_epochs={max_epochs}. Set Trainer(max_steps=...) or max_epochs."
            )
        total = max_epochs * sampling.steps_per_epoch
    remaining = int(total) - int(trainer.global_step)
    if remaining < 1:
        raise ValueError(f"PrivacyCallback(calibrate=True): no steps left to plan (total {int(total)}, done {trainer.global_step}).")
    return remaining


class _Labels(dict):
    """Mechanism name → report label, read from the registry (so registered mechanisms have one too)."""

    def __missing__(self, name: str) -> str:
        return get_mechanism(name).label

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in registered_mechanisms() else default


#: How a summary names the accounting that produced an ε (from the mechanism registry).
ACCOUNTING_LABELS = _Labels()


def sigma_setter_of(pl_module: "pl.LightningModule") -> Any:
    """``pl_module.set_noise_multiplier``, or a clear error for calibration without it."""
    setter = getattr(pl_module, "set_noise_multiplier", None)
    if not callable(setter):
        raise ValueError(
            f"PrivacyCallback(calibrate=True) sets σ with `pl_module.set_noise_multiplier(sigma)`, which "
            f"{type(pl_module).__name__} lacks. Add it, or calibrate yourself with "
            "lightning_dprel.accounting.noise_multiplier_for and pass calibrate=False."
        )
    return setter
