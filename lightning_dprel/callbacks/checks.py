"""Fit-start checks and fact lookups of the privacy callback (pure functions, clear errors)."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytorch_lightning as pl

from lightning_dprel.accounting import get_mechanism, registered_mechanisms
from lightning_dprel.accounting.mechanisms import check_accounting_choice, check_fit_sampling, check_module_mechanism
from lightning_dprel.core.checks import check_bool, check_delta, positive_finite, refuse_unsafe_trainer_settings
from lightning_dprel.core.checks import resolve_delta as _resolve_delta
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.privacy_layer import PrivacyLayer
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec

def check_trainer(trainer: "pl.Trainer") -> None:
    """Refuse trainer settings that would override a budget stop or break the accounting."""
    if trainer.min_steps:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(min_steps={trainer.min_steps})`: Lightning "
            "ignores a stop until min_steps are done, so training could run past the privacy "
            "budget. Remove min_steps."
        )
    if trainer.min_epochs:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(min_epochs={trainer.min_epochs})`: Lightning "
            "ignores a stop until min_epochs are done, so training could run past the privacy "
            "budget. Remove min_epochs."
        )
    refuse_unsafe_trainer_settings(trainer)
    from pytorch_lightning.callbacks import GradientAccumulationScheduler

    if any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks):
        raise ValueError(
            "PrivacyCallback refuses GradientAccumulationScheduler: it would split one sampled batch's step over "
            "several batches, while one optimizer step must use exactly one Poisson sample. Raise the expected batch "
            "size instead."
        )
    if trainer.reload_dataloaders_every_n_epochs:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(reload_dataloaders_every_n_epochs="
            f"{trainer.reload_dataloaders_every_n_epochs})`: a reloaded loader may sample at another rate or from "
            "other data than the fit's charged sampling. Fit again with the new loader (the ledger continues)."
        )
    if trainer.overfit_batches:
        raise ValueError(
            f"PrivacyCallback refuses `Trainer(overfit_batches={trainer.overfit_batches})`: replaying fixed "
            "batches is not Poisson sampling, so the accounting does not apply. Remove overfit_batches."
        )


def check_arguments(target_epsilon: Optional[float], delta: Optional[float], mechanism: Optional[str], calibrate: bool,
                    sampling_spec: Optional[SamplingSpec]) -> tuple[Optional[float], Optional[float]]:
    """PrivacyCallback's arguments checked (clear errors); returns (target_epsilon, delta) as floats."""
    if target_epsilon is not None:
        target_epsilon = positive_finite("target_epsilon", target_epsilon, "e.g. target_epsilon=4.0")
    if delta is not None:
        delta = check_delta(delta)
    if mechanism is not None and mechanism not in registered_mechanisms():
        raise ValueError(
            f"`mechanism` must be one of {registered_mechanisms()} or None (take it from the module's "
            f"noise_spec), got {mechanism!r}."
        )
    check_bool("calibrate", calibrate)
    if calibrate and target_epsilon is None:
        raise ValueError("`calibrate=True` chooses σ from the budget and needs `target_epsilon`, got None.")
    if sampling_spec is not None and not isinstance(sampling_spec, SamplingSpec):
        raise TypeError(
            f"`sampling_spec` must be a lightning_dprel.core.specs.SamplingSpec or None, got "
            f"{type(sampling_spec).__name__}."
        )
    return target_epsilon, delta


def noise_spec_of(layer: PrivacyLayer) -> NoiseSpec:
    """The noise spec; a clear error for a model without DP-SGD steps or planned releases."""
    spec = layer.noise_spec
    if not isinstance(spec, NoiseSpec):
        raise TypeError(
            f"PrivacyCallback needs the noise spec of {type(layer).__name__} (σ, C, clipping, "
            f"accounting), got {type(spec).__name__}: it takes no DP-SGD steps and plans no "
            "releases. Build on PrivateModule (DP-SGD steps), or declare the releases with "
            "planned_releases() (LedgerModule)."
        )
    return spec


def ledger_of(layer: PrivacyLayer) -> PrivacyLedger:
    """The layer's ledger, or a clear error for a model built without one."""
    ledger = layer.privacy_ledger
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"{type(layer).__name__}.privacy_ledger must be a PrivacyLedger, got "
                        f"{type(ledger).__name__}; create it with "
                        "LedgerModule._setup_ledger(noise_seed=None) in __init__.")
    return ledger


def refuse_foreign_clip_norm(layer: PrivacyLayer, clip_norm: Optional[float]) -> None:
    """Refuse the callback's ``clip_norm`` for a model that chose another C (it was ignored)."""
    if clip_norm is None or not layer.owns_clip_norm:
        return
    spec = layer.noise_spec
    own = None if spec is None else float(spec.clip_norm)
    if own is not None and math.isclose(own, clip_norm, rel_tol=1e-12):
        return
    said = "takes no DP-SGD steps (no C)" if own is None else f"clips to its own C = {own:g}"
    raise ValueError(
        f"PrivacyCallback(clip_norm={clip_norm:g}) is for a plain LightningModule the callback "
        f"makes private; {type(layer).__name__} {said}, so the callback's would be ignored. Set C "
        "on the module (clip_norm=...) and leave the callback's clip_norm None."
    )


def sampling_spec_of(trainer: "pl.Trainer", explicit: Optional[SamplingSpec]) -> SamplingSpec:
    datamodule = trainer.datamodule
    found = getattr(datamodule, "sampling_spec", None) if datamodule is not None else None
    if found is None:  # a DPDataLoader states its own
        loaders = trainer.train_dataloader
        found = next((getattr(x, "sampling_spec") for x in (loaders if isinstance(loaders, (list, tuple)) else [loaders])
                      if isinstance(getattr(x, "sampling_spec", None), SamplingSpec)), None)
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
            "`sampling_spec` after setup. Train on a DPDataLoader (Poisson rows) or a lightning_dprel datamodule, "
            "or pass PrivacyCallback(sampling_spec=...)."
        )
    return spec


def resolve_delta(delta: Optional[float], sampling: SamplingSpec, *, warn: bool, allow_large: bool = False) -> float:
    """δ for a SamplingSpec's unit (:func:`lightning_dprel.core.checks.resolve_delta`)."""
    return _resolve_delta(delta, sampling.unit, sampling.units, population=sampling.population,
                          warn=warn,
                          allow_large=allow_large)


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


def check_private(noise: NoiseSpec, target_epsilon: Optional[float], ledger: PrivacyLedger) -> None:
    """Refuse a module without noise, or whose ledger already holds steps without noise (no finite ε holds)."""
    if ledger.unprotected_steps:
        raise ValueError(
            f"PrivacyCallback: this model already took {ledger.unprotected_steps} steps without noise "
            "(its ledger says so), so no finite ε holds for it. Start from a model that never trained non-privately."
        )
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


def resolve_mechanism(noise: NoiseSpec, sampling: SamplingSpec, mechanism_arg: Optional[str], current: Optional[str]) -> str:
    """The accounting mechanism of a fit: the module's (or the callback's stand-in for it), proven for the data's unit,
    and the one this callback accounted with before; clear errors otherwise."""
    if noise.mechanism == "none":
        raise ValueError(
            "PrivacyCallback: `pl_module.noise_spec.clipping` is 'none' (the non-private baseline), so there "
            "is no ε to account. Use clipping='freq' or 'standard' with noise_multiplier > 0, or remove "
            "PrivacyCallback from the trainer."
        )
    check_module_mechanism(noise.mechanism, noise.clipping)
    mechanism = mechanism_arg or noise.mechanism
    for name in {noise.mechanism, mechanism}:  # the module's and a stand-in's bound must both be for this unit
        check_fit_sampling(name, sampling)
    check_accounting_choice(noise.mechanism, mechanism)
    if current is not None and current != mechanism:
        raise ValueError(
            f"PrivacyCallback already accounted steps with mechanism={current!r}; the module now "
            f"gives {mechanism!r}. One callback cannot mix accountings; use a new PrivacyCallback."
        )
    return mechanism


def calibrated_sigma(trainer: "pl.Trainer", sampling: SamplingSpec, *, target: float, delta: float, mechanism: str,
                     releases: int, spent: Any, kind: str) -> float:
    """σ such that the planned steps, after what ``spent`` holds, end at ε ≤ ``target`` (r releases per sample: one
    sample at σ/√r); says so on rank 0."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_info

    from lightning_dprel.accounting import noise_multiplier_for

    total = -(-planned_steps(trainer, sampling) // releases)
    sigma = math.sqrt(releases) * float(noise_multiplier_for(target, delta=delta, steps=total, sampling=sampling,
                                                             mechanism=mechanism, spent=spent))
    already = f", after the {spent.steps} private steps the model already took" if spent.steps else ""
    rank_zero_info(
        f"PrivacyCallback: calibrated σ = {sigma:.6g} so that {total} steps{already} spend ε ≤ {target} at δ = "
        f"{delta:.3g} ({ACCOUNTING_LABELS[mechanism]}, "
        f"{'the smaller of the PLD and RDP bounds' if kind == 'pld' else 'RDP'})."
    )
    return sigma


def horizon_end(trainer: "pl.Trainer", sampling: SamplingSpec, ledger: Any) -> Optional[int]:
    """The ledger's private steps when this fit's plan ends (None if the trainer plans no finite number of steps)."""
    try:
        return ledger.private_steps + planned_steps(trainer, sampling)
    except ValueError:
        return None


class _Labels(dict):
    """Mechanism name → report label, read from the registry (so registered mechanisms have one too)."""

    def __missing__(self, name: str) -> str:
        return get_mechanism(name).label

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in registered_mechanisms() else default


#: How a summary names the accounting that produced an ε (from the mechanism registry).
ACCOUNTING_LABELS = _Labels()


_STATE_KEYS = ("mechanism", "delta", "target_epsilon")


def check_saved_state(state: dict[str, Any], *, mechanism: Optional[str], target_epsilon: Optional[float],
                      delta: Optional[float]) -> None:
    """Refuse a PrivacyCallback state that is empty, incomplete or for another mechanism; warn on changed settings."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_warn

    if not state:
        raise ValueError("PrivacyCallback.load_state_dict got an empty state.")
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise ValueError(
            f"PrivacyCallback state is missing {missing}; found keys {sorted(state)}. Resume from a checkpoint written "
            "by PrivacyCallback."
        )
    saved = state["mechanism"]
    if mechanism is not None and saved is not None and saved != mechanism:
        raise ValueError(
            f"The checkpoint's privacy state was accounted with mechanism={saved!r}, but this callback was built with "
            f"mechanism={mechanism!r}. Resume with PrivacyCallback(mechanism={saved!r})."
        )
    for name, ours, theirs in (("target_epsilon", target_epsilon, state["target_epsilon"]), ("delta", delta, state["delta"])):
        if ours is not None and theirs is not None and not math.isclose(ours, theirs, rel_tol=1e-12):
            rank_zero_warn(f"PrivacyCallback: resuming with {name}={ours}; the checkpoint used {name}={theirs}.")


def step_summary(epsilon: float, delta: float, steps: int, sigma: Optional[float], label: str, target: Optional[float],
                 stopped: bool, bound: Optional[str] = None) -> str:
    """The end-of-fit line of a DP-SGD fit (``bound``: "pld" or "rdp", the bound that gave ε)."""
    line = (f"PrivacyCallback: spent ε = {epsilon:.4f} at δ = {delta:.3g} over {steps} steps, "
            f"σ = {sigma if sigma is not None else float('nan'):.4g}, accounting: {label}"
            + (f" ({bound.upper()} bound)" if bound in ("pld", "rdp") else ""))
    if target is not None:
        line += f", target ε = {target}" + (f" (stopped: step {steps + 1} would exceed it)" if stopped else "")
    return line + "."


def release_summary(epsilon: float, delta: float, releases: int, target: Optional[float]) -> str:
    """The end-of-fit line of a fit that released without optimizer steps."""
    line = f"PrivacyCallback: spent ε = {epsilon:.4f} at δ = {delta:.3g} over {releases} releases"
    return line + (f", target ε = {target}." if target is not None else ".")
