r"""Privacy callback: live entity-level ε, a halt before the budget, σ calibration (Algorithm 3).

Keeps only the budget, calibration, logging and stopping; talks to the model's privacy layer alone
(:class:`~lightning_dprel.core.privacy_layer.PrivacyLayer`, from the attach seam :mod:`.attach`).

References:
    Huang et al., Differentially Private Relational Learning with Entity-level Privacy Guarantees: Algorithm 3,
    Eq. 3, Theorems C.1 and D.1; the corrected FREQ-CLIP profile is the project's (Proposition 4.1 does not hold).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks.callback import Callback
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_dprel.accounting import Accountant, get_mechanism
from lightning_dprel.accounting.accountant import check_accountant
from lightning_dprel.datamodules.edge_tuples.accounting import PAPER_EQ3_WARNING
from lightning_dprel.core.events import effective_noise_multiplier
from lightning_dprel.core.budget import PrivacyBudget
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec
from lightning_dprel.core.privacy_layer import PrivacyLayer
from lightning_dprel.callbacks.checks import (
    ACCOUNTING_LABELS, calibrated_sigma, check_arguments, refuse_foreign_clip_norm, check_not_over,
    check_private, check_saved_state, check_trainer, horizon_end, ledger_of, noise_spec_of,
    release_summary, resolve_delta, resolve_mechanism, sampling_spec_of, step_summary,
)
from lightning_dprel.callbacks.releases import check_planned_releases, check_releases_charged, release_delta, release_unit_of
from lightning_dprel.callbacks.attach import attach_arguments, close_layer, open_layer, privacy_layer, saved_ledger_of, watch_updates
from lightning_dprel.callbacks.correlated import install_noise, noise_mode, one_step_per_batch, refuse_for_releases

__all__ = ["PrivacyCallback", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]


class PrivacyCallback(Callback):
    r"""Reports (ε, δ) for the data's privacy unit after every release and halts before the budget (Algorithm 3).

    Any LightningModule: a lightning_dprel model states its own noise and ledger; any other gets the DP-SGD layer attached
    for its loader's unit (``DPDataLoader``: one example). Parameters moved without a charged release stop it (ε = ∞).

    Each training batch is one sampled step (r noised releases on it count once at σ/√r); after step t the callback
    asks :class:`~lightning_dprel.core.budget.PrivacyBudget` whether step t+1 fits and, if not, stops (agreed across
    ranks). Models that release without optimizer steps (DP-GPL's answers, :meth:`planned_releases`) are calibrated and
    checked before the first release. The ledger holds every release the model made, so refitting or resuming never
    restarts ε at 0; a mechanism proven for another unit than the data's is refused. Logs ``epsilon``, ``delta``.

    Args:
        target_epsilon: the ε budget; ``None`` only tracks and logs ε.
        delta: δ of the (ε, δ) guarantee; default for the entity unit 1/m, m the number of capped training edges
            (the paper's), for other units 1/(10·N), N the number of privacy units; a δ not well below 1/N warns.
        mechanism: the accountant mechanism; default the module's ``noise_spec.mechanism``. Given
            explicitly, it must be the module's or stand in for it (``"naive"``, α/(2σ²), Δ ≡ C, only for
            the paper's FREQ-CLIP accounting).
        calibrate: choose σ at fit start so that the planned steps (``trainer.estimated_stepping_batches``
            minus the trainer's ``global_step``), composed with what the model already spent, end at most at
            ``target_epsilon``; set with ``pl_module.set_noise_multiplier`` (a new σ is a new ledger segment).
        sampling_spec: the :class:`~lightning_dprel.core.specs.SamplingSpec` for projects without a datamodule
            that exposes one; if both exist they must be equal.
        orders: Rényi orders for the accountant (default: the accountant's).
        accountant: ``"pld"`` (default): ε is the smaller of the privacy-loss-distribution bound (for mechanisms with
            a proven dominating pair) and the RDP bound — calibration, the bar and the halt use it; ``"rdp"``: RDP only.
        clip_norm, noise_multiplier, log_private_metrics: for a plain LightningModule, C (required;
            refused if a model owns another C), σ (default 1.0; ``calibrate=True`` replaces it), and
            whether its training logs (computed without noise) are kept.
        allow_large_delta: report a δ with n·δ ≥ 1 (refused otherwise: one unit could be released outright).
        noise, bands, coefficients: ``"independent"`` (DP-SGD) or ``"banded"`` (b-banded MF on ``DPDataLoader(...,
            partitions=b)``, :mod:`~lightning_dprel.callbacks.correlated`; c: the optimal for the planned steps).

    Attributes:
        accountant: an :class:`Accountant` over the model's ledger (``None`` before the first fit starts).
        mechanism: the accountant mechanism in use.
        delta: the δ in use (resolved to 1/m at fit start when not given).
        noise_multiplier: the σ of the last recorded step (or the calibrated σ). summary: the end-of-fit line.
        stopped_step: the private step count at which the budget stopped training, else ``None``.
        history: ``(private steps, ε)`` after every step of this callback's fits (saved in its state).

    Example::

        >>> from lightning_dprel.callbacks import PrivacyCallback
        >>> cb = PrivacyCallback(target_epsilon=4.0, delta=1e-5)
        >>> cb.target_epsilon, cb.delta, cb.epsilon
        (4.0, 1e-05, 0.0)
    """

    #: The module refuses a private fit unless some callback says it charges and checks the ledger.
    charges_privacy_ledger = True

    def __init__(
        self,
        *,
        target_epsilon: Optional[float] = None,
        delta: Optional[float] = None,
        mechanism: Optional[str] = None,
        calibrate: bool = False,
        sampling_spec: Optional[SamplingSpec] = None,
        orders: Optional[Sequence[float]] = None,
        accountant: str = "pld",
        clip_norm: Optional[float] = None,
        noise_multiplier: Optional[float] = None,
        log_private_metrics: bool = False,
        allow_large_delta: bool = False,
        noise: str = "independent", bands: Optional[int] = None, coefficients: Optional[Sequence[float]] = None,
    ) -> None:
        super().__init__()
        target_epsilon, delta = check_arguments(target_epsilon, delta, mechanism, calibrate, sampling_spec)
        self.target_epsilon = target_epsilon
        self.calibrate = calibrate
        self.clip_norm, self._sigma_arg, self._log_private = attach_arguments(clip_norm, noise_multiplier, log_private_metrics)
        self._layer: Optional[PrivacyLayer] = None  # the model itself, or the layer attached to it
        self._watch: Any = None  # parameters after the last charged release (lightning_dprel.core.update_watch)
        self._saved_ledger: Optional[dict] = None  # an attached layer's, from the checkpoint
        self.orders = None if orders is None else tuple(float(a) for a in orders)
        self.accountant_kind = check_accountant(accountant)
        self._delta_arg, self._mechanism_arg, self._sampling_arg = delta, mechanism, sampling_spec
        self._allow_large_delta, self._noise_mode = bool(allow_large_delta), noise_mode(noise, bands, coefficients)
        self.mechanism, self.delta, self.noise_multiplier = mechanism, delta, None  # σ: Optional[float]
        self.stopped_step, self.summary = None, None  # Optional[int], Optional[str]
        self.history: list[tuple[int, float]] = []  # (private steps in the ledger, ε) after every step
        self._calibrated = False  # σ was calibrated for this plan (its value lives in the module's DP optimizer)
        self._sampling: Optional[SamplingSpec] = None
        self._ledger: Optional[PrivacyLedger] = None
        self._lookahead, self._shown = 1, None  # samples (steps) per training batch, as last observed; ε on the bar
        self._releases = 1  # noised sums released per sample, as last observed
        self._steps_seen = 0  # the ledger's private steps at the last batch end
        self._horizon_end: Optional[int] = None  # private steps the ledger will hold when this fit's plan ends
        self._warned: set[str] = set()

    @property  # ------------------------------------------------------ public read-outs
    def ledger(self) -> Optional[PrivacyLedger]:
        """The model's ledger: every release it made (an attached layer's for a plain LightningModule)."""
        return self._ledger

    @property
    def accountant(self) -> Optional[Accountant]:
        """An accountant over every private step of the model's ledger (None before anything accountable)."""
        led, how = self._ledger, self._how
        return led.accountant(**how) if led and (led.accountable or how.get("mechanism")) else None

    @property
    def epsilon(self) -> float:
        """ε the model has spent at :attr:`delta` (0.0 before any step; ``inf`` after an un-noised step)."""
        if self._ledger is None or self.delta is None:
            return 0.0
        return self._ledger.epsilon(self.delta, **self._how)

    @property
    def _how(self) -> dict[str, Any]:
        """How this callback reads the ledger: the mechanism, the orders and the accountant kind."""
        return {"mechanism": self.mechanism, "orders": self.orders, "accountant": self.accountant_kind}

    @property
    def steps(self) -> int:
        """Private steps in the model's ledger."""
        return 0 if self._ledger is None else self._ledger.private_steps

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage == "fit":
            check_trainer(trainer)  # and run first: averaging callbacks (SWA, EMA) write released averages after its checks
            trainer.callbacks.insert(0, trainer.callbacks.pop(trainer.callbacks.index(self)))

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """The model's privacy layer; planned releases (DP-GPL's): δ, calibration, budget, before
        the first (this hook runs before the model's)."""
        self._layer = layer = privacy_layer(
            trainer, pl_module, clip_norm=self.clip_norm, noise_multiplier=self._sigma_arg,
            log_private_metrics=self._log_private, saved_ledger=self._saved_ledger)
        refuse_foreign_clip_norm(layer, self.clip_norm)
        if (planned := layer.planned_releases()) is None:
            return
        refuse_for_releases(layer, self._noise_mode)  # banded noise is for DP-SGD steps
        self._ledger = ledger = ledger_of(layer)
        unit, units = release_unit_of(trainer, pl_module)
        layer.charge_data_releases(trainer.datamodule)  # released on the data already: counts
        self.delta = release_delta(layer, self.delta, unit, units, warn="delta" not in self._warned,
                                   allow_large=self._allow_large_delta)
        self._warned.add("delta")
        if self.calibrate:
            layer.calibrate_releases(self.target_epsilon, self.delta)
            planned = layer.planned_releases()
        self._planned_epsilon = check_planned_releases(pl_module, planned, unit, ledger,
                                                       delta=self.delta, target=self.target_epsilon)

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        layer = self._layer
        if layer.planned_releases() is not None:  # releases, no optimizer steps
            check_releases_charged(pl_module, self._ledger, delta=self.delta, planned=self._planned_epsilon)
            self._log_epsilon(trainer, pl_module, self.epsilon, on_step=False)  # Lightning logs per epoch at train start
            return
        install_noise(trainer, layer, self._noise_mode)  # banded correlated noise, before step 1
        open_layer(trainer, pl_module, layer, keep_logs=self._log_private)  # sampler, hooks, logs
        sampling, noise = self._read_facts(trainer)
        self._ledger = ledger_of(layer)
        layer.open_fit(sampling, noise)  # once per fit: the ledger's sampling and the mechanism check
        self._watch = watch_updates(trainer, pl_module, self._ledger, keep_logs=self._log_private)
        self._steps_seen, self._shown = self._ledger.private_steps, None
        declared = int(layer.releases_per_sample)  # noised sums one batch releases on its sample
        self._releases = max(declared, self._ledger.last_releases if self._ledger.private_steps else 1)
        self._resolve_delta(sampling)
        if self.calibrate:
            self._apply_calibration(trainer, sampling)
            noise = noise_spec_of(layer)
        check_private(noise, self.target_epsilon, self._ledger)
        self.noise_multiplier = float(noise.noise_multiplier)
        warning = get_mechanism(self.mechanism).warning
        if warning and warning not in self._warned:
            rank_zero_warn(warning, category=UserWarning)
            self._warned.add(warning)
        self._horizon_end = horizon_end(trainer, sampling, self._ledger)
        self._check_budget_at_start(trainer, sampling, noise)  # the fit's ε curve, once; the halt with a target

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        if self._watch is not None:  # moved between batches (a hook after this callback's, an epoch-end edit)?
            self._watch.check(type(pl_module).__name__)
            self._watch.seal(batch)  # the batch as sampled: a later hook must not rewrite it (checked at the release)

    @override
    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.on_train_batch_start(trainer, pl_module, None, -1)

    @override
    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.on_train_batch_start(trainer, pl_module, None, -1)  # what training kept, before public data runs

    @override
    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._watch is not None:
            self._watch.rebase(plain_only=True)  # what validation (public data) kept on the module is not a release

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        steps = self._ledger.private_steps  # edits after the release are caught at the next batch start or train end
        new_steps, self._steps_seen = one_step_per_batch(self._noise_mode, steps - self._steps_seen), steps
        if new_steps <= 0:
            return
        self._lookahead = new_steps
        expected, self._releases = self._releases, max(self._releases, self._ledger.last_releases)
        self.noise_multiplier = self._ledger.last_noise_multiplier
        # ≥ the exact ε; near the budget the exact ε, or the budget where the halting search proved these steps fit it
        epsilon = self._ledger.epsilon(self.delta, **self._how, live=True, target=self.target_epsilon)
        self.history.append((steps, epsilon))
        self._log_epsilon(trainer, pl_module, epsilon)
        if self.target_epsilon is None:
            return
        check_not_over(epsilon, self.target_epsilon, self.steps, releases=self._releases, planned=expected)
        sigma = self._next_sigma(noise_spec_of(self._layer))
        stop, next_eps = self._budget().next_step(self._ledger.composed(**self._how), self._sampling, sigma, self._lookahead,
                                                  horizon=self._horizon())
        if trainer.strategy.reduce_boolean_decision(stop, all=False):  # another rank may stop this one: ε_next for it
            self._set_stop(trainer, next_eps if stop else self._ledger.composed(**self._how).epsilon_after(
                self._sampling, sigma, self.delta, self._lookahead))

    def _log_epsilon(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", epsilon: float, *, on_step: bool = True) -> None:
        if not on_step or epsilon != self._shown:  # the bar and callback_metrics keep a value until it is logged again
            pl.LightningModule.log(pl_module, "epsilon", epsilon, prog_bar=True, on_step=on_step, on_epoch=not on_step, batch_size=1, logger=False)
        self._shown = epsilon if on_step else None  # loggers get ε every step; δ too (the bar would show 1e-5 as 0.000)
        for logger in trainer.loggers:
            logger.log_metrics({"epsilon": epsilon, "delta": self.delta}, step=trainer.global_step)

    @override
    def on_save_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]) -> None:
        if self._layer is not None:  # what the model does not save (an attached layer's ledger)
            self._layer.save_layer(checkpoint)

    @override
    def on_load_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]) -> None:
        self._saved_ledger = saved_ledger_of(pl_module, checkpoint)

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._layer, self._watch = close_layer(pl_module, self._layer, self._watch, failed=True)

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._layer, self._watch = close_layer(pl_module, self._layer, self._watch)
        if self._ledger is None:
            return
        self.summary = self._summary_line()
        rank_zero_info(self.summary)

    # ------------------------------------------------------------------ state (settings only: the ledger is the module's)
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "delta": self.delta, "target_epsilon": self.target_epsilon,
                "calibrated": self._calibrated, "stopped_step": self.stopped_step, "accountant": self.accountant_kind,
                "history": [[int(t), float(e)] for t, e in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_saved_state(state_dict, mechanism=self._mechanism_arg, target_epsilon=self.target_epsilon, delta=self._delta_arg)
        saved = state_dict["mechanism"]
        if self._delta_arg is None and state_dict["delta"] is not None:
            self.delta = float(state_dict["delta"])
        self.mechanism = self.mechanism or saved
        self._calibrated = bool(state_dict.get("calibrated", state_dict.get("noise_multiplier") is not None))
        self.stopped_step = state_dict.get("stopped_step")
        self.history = [(int(t), float(e)) for t, e in state_dict.get("history", [])]

    # ------------------------------------------------------------------ fit-start steps
    def _next_sigma(self, noise: NoiseSpec) -> float:
        """σ the next step will be charged: σ_eff of as many releases on one sample as the last step made."""
        return effective_noise_multiplier([float(noise.noise_multiplier)] * self._releases)

    def _horizon(self) -> int:
        """Steps the halting search looks ahead: what the fit still plans (the PLD of far longer runs is costly)."""
        return max(1, self._horizon_end - self.steps) if self._horizon_end is not None else 2**20

    def _budget(self) -> PrivacyBudget:
        return PrivacyBudget(self.target_epsilon, self.delta)

    def _read_facts(self, trainer: "pl.Trainer") -> tuple[SamplingSpec, NoiseSpec]:
        noise, sampling = noise_spec_of(self._layer), sampling_spec_of(trainer, self._sampling_arg)
        self.mechanism = resolve_mechanism(noise, sampling, self._mechanism_arg, self.mechanism)
        self._sampling = sampling
        return sampling, noise

    def _resolve_delta(self, sampling: SamplingSpec) -> None:
        self.delta = resolve_delta(self.delta, sampling, warn="delta" not in self._warned, allow_large=self._allow_large_delta)
        self._warned.add("delta")

    def _apply_calibration(self, trainer: "pl.Trainer", sampling: SamplingSpec) -> None:
        """Choose σ for the planned steps and set it on the layer; a resumed fit keeps its σ."""
        if not self._calibrated:
            sigma = calibrated_sigma(trainer, sampling, target=self.target_epsilon, delta=self.delta, mechanism=self.mechanism,
                                     releases=self._releases, spent=self.accountant, kind=self.accountant_kind)
            self._calibrated = True
            self._layer.set_noise_multiplier(sigma)
            for logger in trainer.loggers:
                logger.log_metrics({"noise_multiplier": sigma}, step=trainer.global_step)

    def _check_budget_at_start(self, trainer: "pl.Trainer", sampling: SamplingSpec, noise: NoiseSpec) -> None:
        sigma, acc = self._next_sigma(noise), self.accountant
        if acc is not None and (self.target_epsilon is not None or self._horizon_end is not None):
            acc.plan(self.delta, sampling, sigma, min(self._horizon(), 2**16))  # read per step; later counts lazily
        if self.target_epsilon is None:  # no budget to halt at
            return
        stop, next_eps = self._budget().next_step(acc, sampling, sigma, horizon=self._horizon())
        if not stop:
            return
        if self.steps == 0:
            raise ValueError(f"PrivacyCallback: target_epsilon={self.target_epsilon} is below the ε of a single step "
                             f"({next_eps:.6g} at δ = {self.delta:.3g}, σ = {sigma:.6g}, {ACCOUNTING_LABELS[self.mechanism]}"
                             "). Raise target_epsilon or the module's noise_multiplier, or use calibrate=True.")
        self._set_stop(trainer, next_eps)

    def _set_stop(self, trainer: "pl.Trainer", next_eps: float) -> None:
        trainer.should_stop = True
        if self.stopped_step is None or self.stopped_step != self.steps:
            self.stopped_step = self.steps
            rank_zero_info(f"PrivacyCallback: stopping after {self.steps} steps at ε = {self.epsilon:.6g}; the next step "
                           f"would reach ε = {next_eps:.6g} > target_epsilon = {self.target_epsilon}.")

    def _summary_line(self) -> str:
        if self.mechanism is None:  # releases that are not optimizer steps
            return release_summary(self.epsilon, self.delta, sum(s.steps for s in self._ledger.segments), self.target_epsilon)
        stopped = self.stopped_step is not None and self.stopped_step == self.steps
        bound = self._ledger.epsilon_bounds(self.delta, **self._how)["bound"]
        return step_summary(self.epsilon, self.delta, self.steps, self.noise_multiplier, ACCOUNTING_LABELS[self.mechanism],
                            self.target_epsilon, stopped, bound)
