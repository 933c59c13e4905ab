r"""Privacy callback: live entity-level ε, a halt before the budget, σ calibration, resumable state.

The callback reads the facts the accountant needs from the run and never guesses them: *how the data
is sampled* from ``trainer.datamodule.sampling_spec`` (or an explicit ``sampling_spec``) and *how the
module clips and noises* from ``pl_module.noise_spec``. After every optimizer step it records one step
of Algorithm 3 in an :class:`~lightning_dprel.accounting.Accountant`, logs ε (and δ), and stops training
*before* the step that would take ε past ``target_epsilon``.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithm 3 (training loop), Eq. 3 (FREQ-CLIP accounting), Theorem C.1 (standard
    clipping), Theorem D.1 (RDP → (ε, δ)). The corrected FREQ-CLIP profile is the project's
    (``shared/spec/entity_dp_relational.md``): Proposition 4.1 does not hold as stated.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks.callback import Callback
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_dprel.accounting import MECHANISMS, Accountant, noise_multiplier_for
from lightning_dprel.specs import NoiseSpec, SamplingSpec

__all__ = ["PrivacyCallback", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]

#: How a summary names the accounting that produced an ε.
ACCOUNTING_LABELS = {
    "freq_corrected": "FREQ-CLIP corrected",
    "freq_paper": "FREQ-CLIP paper Eq. 3",
    "standard": "standard (Thm C.1)",
    "naive": "naive Δ ≡ C, no amplification",
}

#: Warned once when the paper's Eq. 3 accounting (or the naive bound, which shares its Δ ≡ C) is chosen.
PAPER_EQ3_WARNING = (
    "PrivacyCallback: ε is computed with the paper's Eq. 3 (sensitivity Δ ≡ C). Eq. 3 rests on "
    "Proposition 4.1 (FREQ-CLIP has sensitivity C), which does not hold as stated: removing a node changes "
    "the clip thresholds of other tuples (a counterexample moves the clipped sum by 6.75·C for K=5, k=4). "
    "This ε reproduces the paper and under-states the privacy loss; use accounting='corrected' for a bound "
    "that holds."
)

# The accountant mechanisms that fit a module's NoiseSpec.mechanism. ``naive`` (α/(2σ²), no amplification)
# assumes sensitivity C per step, which only the paper's Eq. 3 reading of FREQ-CLIP claims.
_COMPATIBLE = {
    "freq_corrected": ("freq_corrected",),
    "freq_paper": ("freq_paper", "naive"),
    "standard": ("standard",),
}
_RESTS_ON_PROP_41 = ("freq_paper", "naive")

_STATE_KEYS = ("accountant", "mechanism", "delta", "target_epsilon", "noise_multiplier", "steps_seen")


class PrivacyCallback(Callback):
    r"""Tracks entity-level (ε, δ) after every optimizer step and halts before the budget (Algorithm 3).

    Each optimizer step of the module is one step of Algorithm 3: a Poisson sample of capped edges at
    rate γ, NEG-SAMPLE-WOR negatives, clipping, and N(0, σ²C²) noise. The callback charges it to an
    :class:`~lightning_dprel.accounting.Accountant` (FREQ-CLIP corrected, FREQ-CLIP paper Eq. 3, or
    standard clipping, Theorem C.1) and converts the composed RDP to (ε, δ) with Theorem D.1.

    Logged after every step: ``epsilon`` (loggers and progress bar) and ``delta`` (loggers);
    ``noise_multiplier`` once when calibrated. A one-line summary is logged at the end of fit (rank zero).

    Budget: after step t it asks the accountant for ε after step t+1; if that exceeds ``target_epsilon``
    it sets ``trainer.should_stop``, agreed across ranks by ``trainer.strategy.reduce_boolean_decision``
    (any rank stopping stops all). In Lightning 2.6 ``TrainingEpochLoop.done`` and ``FitLoop.done`` read
    ``should_stop`` before the next batch is run, so no step beyond the budget runs (a validation pass
    may still run, as with ``EarlyStopping``); ``min_epochs``/``min_steps`` would override the stop and
    are refused. Before the first step it raises if even one step exceeds the budget; a run resumed
    with the budget already spent stops before its first step.

    Args:
        target_epsilon: the ε budget; ``None`` only tracks and logs ε.
        delta: δ of the (ε, δ) guarantee; default 1/m, m the number of capped training edges.
        mechanism: the accountant mechanism; default the module's ``noise_spec.mechanism``. Given
            explicitly, it must agree with the module (e.g. ``"standard"`` for a module that clips with
            FREQ-CLIP is refused); ``"naive"`` (α/(2σ²), Δ ≡ C) only with the paper's FREQ-CLIP accounting.
        calibrate: choose σ at fit start so that ``trainer.estimated_stepping_batches`` steps spend at
            most ``target_epsilon``, and set it with ``pl_module.set_noise_multiplier``.
        sampling_spec: the :class:`~lightning_dprel.specs.SamplingSpec` for projects without a datamodule
            that exposes one; if both exist they must be equal.
        orders: Rényi orders for the accountant (default: the accountant's).

    Attributes:
        accountant: the :class:`Accountant` (``None`` before the first fit starts).
        mechanism: the accountant mechanism in use.
        delta: the δ in use (resolved to 1/m at fit start when not given).
        noise_multiplier: the σ of the last recorded step (or the calibrated σ).
        stopped_step: the step count at which the budget stopped training, else ``None``.
        summary: the end-of-fit one-line summary.

    Raises:
        ValueError: bad arguments; at fit start, missing or contradictory facts, trainer settings that
            would override a stop or break the accounting, or a budget that not even one step fits.
        TypeError: arguments or facts of the wrong type.

    Example::

        >>> from callbacks import PrivacyCallback
        >>> cb = PrivacyCallback(target_epsilon=4.0, delta=1e-5)
        >>> cb.target_epsilon, cb.delta, cb.epsilon
        (4.0, 1e-05, 0.0)
    """

    def __init__(
        self,
        *,
        target_epsilon: Optional[float] = None,
        delta: Optional[float] = None,
        mechanism: Optional[str] = None,
        calibrate: bool = False,
        sampling_spec: Optional[SamplingSpec] = None,
        orders: Optional[Sequence[float]] = None,
    ) -> None:
        super().__init__()
        if target_epsilon is not None:
            target_epsilon = _positive_finite("target_epsilon", target_epsilon, "e.g. target_epsilon=4.0")
        if delta is not None:
            delta = _positive_finite("delta", delta, "e.g. delta=1e-5, or leave it None for 1/m")
            if delta >= 1.0:
                raise ValueError(f"`delta` must be in (0, 1), got {delta}. Leave it None for δ = 1/m.")
        if mechanism is not None and mechanism not in MECHANISMS:
            raise ValueError(
                f"`mechanism` must be one of {tuple(MECHANISMS)} or None (take it from the module's "
                f"noise_spec), got {mechanism!r}."
            )
        if not isinstance(calibrate, bool):
            raise TypeError(f"`calibrate` must be a bool, got {type(calibrate).__name__} ({calibrate!r}).")
        if calibrate and target_epsilon is None:
            raise ValueError("`calibrate=True` chooses σ from the budget and needs `target_epsilon`, got None.")
        if sampling_spec is not None and not isinstance(sampling_spec, SamplingSpec):
            raise TypeError(
                f"`sampling_spec` must be a lightning_dprel.specs.SamplingSpec or None, got "
                f"{type(sampling_spec).__name__}."
            )
        self.target_epsilon = target_epsilon
        self.calibrate = calibrate
        self.orders = None if orders is None else tuple(float(a) for a in orders)
        self._delta_arg = delta
        self._mechanism_arg = mechanism
        self._sampling_arg = sampling_spec

        self.accountant: Optional[Accountant] = None
        self.mechanism: Optional[str] = mechanism
        self.delta: Optional[float] = delta
        self.noise_multiplier: Optional[float] = None
        self.stopped_step: Optional[int] = None
        self.summary: Optional[str] = None
        self._calibrated_sigma: Optional[float] = None
        self._sampling: Optional[SamplingSpec] = None
        self._steps_seen = 0  # trainer.global_step at the last recorded step
        self._lookahead = 1  # optimizer steps per training batch, as last observed
        self._pending_state: Optional[dict[str, Any]] = None
        self._warned_paper = False
        self._warned_delta = False

    # ------------------------------------------------------------------ public read-outs
    @property
    def epsilon(self) -> float:
        """ε spent so far at :attr:`delta` (0.0 before any step)."""
        if self.accountant is None or self.accountant.steps == 0:
            return 0.0
        return float(self.accountant.get_epsilon(self.delta))

    @property
    def steps(self) -> int:
        """Optimizer steps charged to the accountant."""
        return 0 if self.accountant is None else int(self.accountant.steps)

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage == "fit":
            _check_trainer(trainer)

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        sampling, noise = self._read_facts(trainer, pl_module)
        self._start_accountant(sampling)
        if self.calibrate:
            self._apply_calibration(trainer, pl_module, sampling)
            noise = _noise_spec(pl_module)
        _check_private(noise, self.target_epsilon)
        self.noise_multiplier = float(noise.noise_multiplier)
        self._sync_steps(trainer, self.noise_multiplier)
        if self.mechanism in _RESTS_ON_PROP_41 and not self._warned_paper:
            rank_zero_warn(PAPER_EQ3_WARNING, category=UserWarning)
            self._warned_paper = True
        if self.target_epsilon is not None:
            self._check_budget_at_start(trainer, sampling, noise)

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        new_steps = int(trainer.global_step) - self._steps_seen
        if new_steps <= 0:
            return
        noise = _noise_spec(pl_module)
        self._check_mechanism(noise)
        if new_steps > 1 and self._lookahead == 1:
            rank_zero_warn(
                f"PrivacyCallback: {new_steps} optimizer steps ran in one training batch; each is charged as a "
                "full step of the SamplingSpec (conservative). Modules should take one step per batch."
            )
        self._lookahead = new_steps
        self.accountant.step(self._sampling, float(noise.noise_multiplier), num_steps=new_steps)
        self._steps_seen = int(trainer.global_step)
        self.noise_multiplier = float(noise.noise_multiplier)
        epsilon = self.epsilon
        pl_module.log("epsilon", epsilon, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        # δ goes to the loggers only: the progress bar rounds to 3 decimals and would show δ = 1e-5 as 0.000
        pl_module.log("delta", self.delta, prog_bar=False, on_step=True, on_epoch=False, batch_size=1)
        if self.target_epsilon is None:
            return
        if epsilon > self.target_epsilon:  # only reachable if something overrode our stop
            raise RuntimeError(
                f"PrivacyCallback: ε = {epsilon:.6g} exceeds target_epsilon = {self.target_epsilon} after "
                f"{self.steps} steps: a step ran after the callback set `trainer.should_stop`. Do not reset "
                "`trainer.should_stop` or call `fit` again without raising the budget."
            )
        self._stop_if_next_step_exceeds(trainer, float(noise.noise_multiplier))

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.accountant is None:
            return
        self.summary = self._summary_line()
        rank_zero_info(self.summary)

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": None if self.accountant is None else self.accountant.state_dict(),
            "mechanism": self.mechanism,
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "noise_multiplier": self._calibrated_sigma,
            "steps_seen": self._steps_seen,
            "stopped_step": self.stopped_step,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            raise ValueError("PrivacyCallback.load_state_dict got an empty state; the spent ε cannot be restored.")
        missing = [key for key in _STATE_KEYS if key not in state_dict]
        if missing:
            raise ValueError(
                f"PrivacyCallback state is missing {missing}; found keys {sorted(state_dict)}. Resume from a "
                "checkpoint written by PrivacyCallback."
            )
        saved = state_dict["mechanism"]
        if self._mechanism_arg is not None and saved is not None and saved != self._mechanism_arg:
            raise ValueError(
                f"The checkpoint's privacy state was accounted with mechanism={saved!r}, but this callback was "
                f"built with mechanism={self._mechanism_arg!r}. Resume with PrivacyCallback(mechanism={saved!r})."
            )
        self._pending_state = dict(state_dict)

    # ------------------------------------------------------------------ fit-start steps
    def _read_facts(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> tuple[SamplingSpec, NoiseSpec]:
        noise = _noise_spec(pl_module)
        sampling = _sampling_spec(trainer, self._sampling_arg)
        module_mech = noise.mechanism
        if module_mech == "none":
            raise ValueError(
                "PrivacyCallback: `pl_module.noise_spec.clipping` is 'none' (the non-private baseline), so there "
                "is no ε to account. Use clipping='freq' or 'standard' with noise_multiplier > 0, or remove "
                "PrivacyCallback from the trainer."
            )
        mechanism = self._mechanism_arg or module_mech
        if mechanism not in _COMPATIBLE.get(module_mech, ()):
            raise ValueError(
                f"PrivacyCallback(mechanism={mechanism!r}) contradicts the module, which clips with "
                f"noise_spec.clipping={noise.clipping!r}, accounting={noise.accounting!r} (mechanism "
                f"{module_mech!r}). Build the callback with mechanism={module_mech!r} or None."
            )
        if self.mechanism is not None and self.mechanism != mechanism:
            raise ValueError(
                f"PrivacyCallback already accounted steps with mechanism={self.mechanism!r}; the module now "
                f"gives {mechanism!r}. One callback cannot mix accountings; use a new PrivacyCallback."
            )
        self.mechanism = mechanism
        self._sampling = sampling
        return sampling, noise

    def _start_accountant(self, sampling: SamplingSpec) -> None:
        state, self._pending_state = self._pending_state, None
        if state is not None:
            if state["mechanism"] is not None and state["mechanism"] != self.mechanism:
                raise ValueError(
                    f"The checkpoint's privacy state was accounted with mechanism={state['mechanism']!r}, but "
                    f"the module now gives {self.mechanism!r}. Resume with the module configured as before."
                )
            self.accountant = Accountant(self.mechanism, orders=self.orders)
            if state["accountant"] is not None:
                self.accountant.load_state_dict(state["accountant"])
            self._steps_seen = int(state["steps_seen"])
            self._calibrated_sigma = state["noise_multiplier"]
            self.stopped_step = state.get("stopped_step")
            self._restore_budget_settings(state)
        elif self.accountant is None:
            self.accountant = Accountant(self.mechanism, orders=self.orders)
        if self.delta is None:
            self.delta = 1.0 / sampling.num_edges  # the paper's δ = 1/|E_train|, edges after capping
        if self.delta >= 1.0 / sampling.num_nodes and not self._warned_delta:
            self._warned_delta = True
            rank_zero_warn(
                f"PrivacyCallback: δ = {self.delta:.3g} is not below 1/n = {1.0 / sampling.num_nodes:.3g} (n = "
                f"{sampling.num_nodes} entities). The privacy unit is an entity, so a δ ≥ 1/n allows releasing "
                "one entity outright; pass a smaller `delta` (e.g. 1/(10·n)) for a meaningful guarantee.",
                category=UserWarning,
            )

    def _restore_budget_settings(self, state: dict[str, Any]) -> None:
        for name, ours, saved in (
            ("target_epsilon", self.target_epsilon, state["target_epsilon"]),
            ("delta", self._delta_arg, state["delta"]),
        ):
            if ours is not None and saved is not None and not math.isclose(ours, saved, rel_tol=1e-12):
                rank_zero_warn(f"PrivacyCallback: resuming with {name}={ours}; the checkpoint used {name}={saved}.")
        if self._delta_arg is None and state["delta"] is not None:
            self.delta = float(state["delta"])

    def _sync_steps(self, trainer: "pl.Trainer", sigma: float) -> None:
        global_step = int(trainer.global_step)
        if self.accountant.steps == 0 and self._steps_seen == 0 and global_step > 0:
            raise ValueError(
                f"PrivacyCallback: the trainer resumes at global_step={global_step} but has no PrivacyCallback "
                "state, so the ε spent by those steps is unknown. Resume from a checkpoint saved with "
                "PrivacyCallback in the trainer's callbacks, or start a fresh run."
            )
        if global_step > self._steps_seen:  # steps taken after the state was saved: charge them (conservative)
            rank_zero_warn(
                f"PrivacyCallback: {global_step - self._steps_seen} optimizer steps ran after the privacy state "
                f"was saved; they are charged now at σ = {sigma:.6g}."
            )
            self.accountant.step(self._sampling, sigma, num_steps=global_step - self._steps_seen)
        self._steps_seen = global_step

    def _apply_calibration(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", sampling: SamplingSpec) -> None:
        setter = getattr(pl_module, "set_noise_multiplier", None)
        if not callable(setter):
            raise ValueError(
                f"PrivacyCallback(calibrate=True) sets σ with `pl_module.set_noise_multiplier(sigma)`, which "
                f"{type(pl_module).__name__} lacks. Add it, or calibrate yourself with "
                "lightning_dprel.accounting.noise_multiplier_for and pass calibrate=False."
            )
        sigma = self._calibrated_sigma
        if sigma is None:
            total = _planned_steps(trainer, sampling)
            sigma = float(
                noise_multiplier_for(
                    self.target_epsilon, delta=self.delta, steps=total, sampling=sampling, mechanism=self.mechanism,
                    orders=self.orders,
                )
            )
            self._calibrated_sigma = sigma
            rank_zero_info(
                f"PrivacyCallback: calibrated σ = {sigma:.6g} so that {total} steps spend ε ≤ "
                f"{self.target_epsilon} at δ = {self.delta:.3g} ({ACCOUNTING_LABELS[self.mechanism]})."
            )
        setter(sigma)
        for logger in trainer.loggers:
            logger.log_metrics({"noise_multiplier": sigma}, step=trainer.global_step)

    def _check_budget_at_start(self, trainer: "pl.Trainer", sampling: SamplingSpec, noise: NoiseSpec) -> None:
        sigma = float(noise.noise_multiplier)
        next_eps = float(self.accountant.epsilon_after(sampling, sigma, self.delta, num_steps=1))
        if next_eps <= self.target_epsilon:
            return
        if self.accountant.steps == 0:
            raise ValueError(
                f"PrivacyCallback: target_epsilon={self.target_epsilon} is below the ε of a single step "
                f"({next_eps:.6g} at δ = {self.delta:.3g}, σ = {sigma:.6g}, "
                f"{ACCOUNTING_LABELS[self.mechanism]}). Raise target_epsilon or the module's noise_multiplier, "
                "or use calibrate=True."
            )
        self._set_stop(trainer, next_eps)

    def _stop_if_next_step_exceeds(self, trainer: "pl.Trainer", sigma: float) -> None:
        next_eps = float(
            self.accountant.epsilon_after(self._sampling, sigma, self.delta, num_steps=self._lookahead)
        )
        should_stop = trainer.strategy.reduce_boolean_decision(next_eps > self.target_epsilon, all=False)
        if should_stop:
            self._set_stop(trainer, next_eps)

    def _set_stop(self, trainer: "pl.Trainer", next_eps: float) -> None:
        trainer.should_stop = True
        if self.stopped_step is None or self.stopped_step != self.steps:
            self.stopped_step = self.steps
            rank_zero_info(
                f"PrivacyCallback: stopping after {self.steps} steps at ε = {self.epsilon:.6g}; the next step "
                f"would reach ε = {next_eps:.6g} > target_epsilon = {self.target_epsilon}."
            )

    def _check_mechanism(self, noise: NoiseSpec) -> None:
        if self.mechanism not in _COMPATIBLE.get(noise.mechanism, ()):
            raise ValueError(
                f"PrivacyCallback: the module switched to noise_spec.mechanism={noise.mechanism!r} during fit; "
                f"the accountant uses {self.mechanism!r}. Keep clipping and accounting fixed for a run."
            )

    def _summary_line(self) -> str:
        line = (
            f"PrivacyCallback: spent ε = {self.epsilon:.4f} at δ = {self.delta:.3g} over {self.steps} steps, "
            f"σ = {self.noise_multiplier if self.noise_multiplier is not None else float('nan'):.4g}, "
            f"accounting: {ACCOUNTING_LABELS[self.mechanism]}"
        )
        if self.target_epsilon is not None:
            line += f", target ε = {self.target_epsilon}"
            if self.stopped_step is not None and self.stopped_step == self.steps:
                line += f" (stopped: step {self.steps + 1} would exceed it)"
        return line + "."


# ---------------------------------------------------------------------- checks (pure helpers)
def _positive_finite(name: str, value: Any, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} ({value!r}); {example}.")
    value = float(value)
    if not (value > 0.0) or math.isinf(value):
        raise ValueError(f"`{name}` must be > 0 and finite, got {value}; {example}.")
    return value


def _check_trainer(trainer: "pl.Trainer") -> None:
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


def _noise_spec(pl_module: "pl.LightningModule") -> NoiseSpec:
    noise = getattr(pl_module, "noise_spec", None)
    if not isinstance(noise, NoiseSpec):
        raise TypeError(
            f"PrivacyCallback needs `pl_module.noise_spec`, a lightning_dprel.specs.NoiseSpec (σ, C, clipping, "
            f"accounting); {type(pl_module).__name__} gives {type(noise).__name__}. Use DPRelationalModule or "
            "add a `noise_spec` property to your module."
        )
    return noise


def _sampling_spec(trainer: "pl.Trainer", explicit: Optional[SamplingSpec]) -> SamplingSpec:
    datamodule = trainer.datamodule
    found = getattr(datamodule, "sampling_spec", None) if datamodule is not None else None
    if found is not None and not isinstance(found, SamplingSpec):
        raise TypeError(
            f"`trainer.datamodule.sampling_spec` must be a lightning_dprel.specs.SamplingSpec, got "
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


def _check_private(noise: NoiseSpec, target_epsilon: Optional[float]) -> None:
    if noise.noise_multiplier > 0.0:
        return
    budget = f" but target_epsilon={target_epsilon} was asked" if target_epsilon is not None else ""
    raise ValueError(
        f"PrivacyCallback: the module's noise_multiplier is 0, so ε is infinite{budget}. Set "
        "noise_multiplier > 0 on the module, or use PrivacyCallback(target_epsilon=..., calibrate=True)."
    )


def _planned_steps(trainer: "pl.Trainer", sampling: SamplingSpec) -> int:
    total = trainer.estimated_stepping_batches
    if math.isinf(total) or total <= 0:
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs <= 0:
            raise ValueError(
                f"PrivacyCallback(calibrate=True) needs a finite number of steps, got max_steps="
                f"{trainer.max_steps}, max_epochs={max_epochs}. Set Trainer(max_steps=...) or max_epochs."
            )
        total = max_epochs * sampling.steps_per_epoch
    return int(total)
