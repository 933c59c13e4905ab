"""What every private LightningModule of the library shares: one DP optimizer hook, one privacy ledger.

:class:`PrivateModule` owns the noise spec (σ, C, clipping, accounting → the accountant's mechanism), the keyed noise
stream, the :class:`~lightning_dprel.core.ledger.PrivacyLedger` (charged by the optimizer's step records, saved in every
checkpoint), the :class:`~lightning_dprel.core.optim.DPOptimizer` around Adam / AdamW / SGD, and the fit-time checks
(no Trainer-side clipping or accumulation, no foreign optimizer, no untracked private fit). A subclass computes
per-example gradients (per tuple, per subgraph, …) and calls :meth:`private_step`; the
:class:`~lightning_dprel.callbacks.PrivacyCallback` reads the ledger, whatever the subclass.

References:
    Abadi et al. 2016 (DP-SGD); Opacus ``PrivacyEngine`` (one optimizer wrapper, one accountant per model).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from pytorch_lightning import LightningModule
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_dprel.core.events import GaussianRelease, StepRecord
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.grad_sample.base import TupleGradients
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.specs import NoiseSpec

__all__ = ["PrivateModule", "refuse_unsafe_trainer_settings", "privacy_delta", "OPTIMIZERS"]

# Lightning warns (16 lines) that a ModelCheckpoint under manual optimization saves the state *after* the step. For a
# private module that is the state to resume from: the step's release is in the ledger and the parameters match it.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")

OPTIMIZERS = ("adam", "adamw", "sgd")


def refuse_unsafe_trainer_settings(trainer: Any) -> None:
    """Raise ``ValueError`` when the Trainer would clip or accumulate gradients behind the DP step."""
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
            "the clipping frequencies and the noise are per logical batch; set it to 1 and raise the datamodule's "
            "expected batch size instead."
        )


def privacy_delta(module: Any) -> float | None:
    """δ of the module's privacy reports: its trainer's privacy callback's, else the one saved with it, else None."""
    trainer = getattr(module, "_trainer", None)
    for cb in trainer.callbacks if trainer is not None else ():
        if getattr(cb, "charges_privacy_ledger", False) and getattr(cb, "delta", None) is not None:
            return float(cb.delta)
    return getattr(module, "_saved_delta", None)


class PrivateModule(LightningModule):
    """Base of the private modules: noise spec, keyed noise, ledger, DP optimizers, fit-time checks.

    Every noised release of a training batch (each DP optimizer's step, each :meth:`private_step`) is charged to the
    ledger with the batch as its sample, so r releases are one sampled Gaussian release at σ/√r. A module that makes
    r > 1 releases per batch sets :attr:`releases_per_sample` so that the privacy callback budgets and calibrates for it.
    """

    #: Noised releases one training batch makes on its sample (e.g. 2 for two noised tables stepped separately).
    releases_per_sample: int = 1

    def _setup_privacy(
        self, *, clipping: str, accounting: str, clip_norm: float, noise_multiplier: float, noise_seed: int | None,
        optimizer: str, lr: float, momentum: float, diagnostics: bool,
    ) -> None:
        """Validate and set the privacy settings (call from ``__init__`` before ``save_hyperparameters``)."""
        name = type(self).__name__
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` must be one of {OPTIMIZERS}, got {optimizer!r}.")
        if not float(lr) > 0:
            raise ValueError(f"`lr` must be > 0, got {lr}.")
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"`momentum` must be in [0, 1), got {momentum}.")
        if noise_seed is not None and (isinstance(noise_seed, bool) or not isinstance(noise_seed, int) or noise_seed < 0):
            raise ValueError(f"`noise_seed` must be a non-negative int or None, got {noise_seed!r}.")
        self._noise_spec = NoiseSpec(
            noise_multiplier=float(noise_multiplier), clip_norm=float(clip_norm), clipping=clipping, accounting=accounting
        )
        self.noise_source = KeyedStream("noise", seed=noise_seed, _warn=False)
        self.privacy_ledger = PrivacyLedger()
        self._dp_optimizer: DPOptimizer | None = None
        self.automatic_optimization = False
        #: How node inputs were made from texts (text encoders; kept in checkpoints), and the δ saved with a checkpoint.
        self.input_spec: dict[str, Any] | None = None
        self._saved_delta: float | None = None
        #: What PUBLIC data shaped the model (never charged): the public graph, warm start, gradient subspace; privacy.json names it.
        self.public_data: dict[str, Any] = {}
        if noise_seed is not None:
            rank_zero_warn(
                f"{name}(noise_seed=<int>) makes the noise reproducible: anyone who knows the seed "
                "(or a checkpoint's noise state) can regenerate and remove the noise, which voids the privacy "
                "guarantee unless the seed is kept secret. Use noise_seed=None for private runs.",
                category=UserWarning,
            )
        if diagnostics:
            rank_zero_warn(
                f"{name}(diagnostics=True) keeps per-step statistics of the private batch computed without "
                "noise (gradient norms, cosines): they are outside the differential-privacy guarantee; do not release them.",
                category=UserWarning,
            )

    # --- the facts for the accountant ----------------------------------------------------------------
    @property
    def noise_spec(self) -> NoiseSpec:
        """σ, C, clipping mode and accounting (:class:`~lightning_dprel.core.specs.NoiseSpec`): the optimizer's once built."""
        return self._dp_optimizer.noise_spec if self._dp_optimizer is not None else self._noise_spec

    def set_noise_multiplier(self, sigma: float) -> None:
        """Set σ for the next steps (the privacy callback calibrates it); steps already taken keep theirs in the ledger."""
        spec = self.noise_spec
        self._noise_spec = NoiseSpec(
            noise_multiplier=float(sigma), clip_norm=spec.clip_norm, clipping=spec.clipping, accounting=spec.accounting
        )
        if self._dp_optimizer is not None:
            self._dp_optimizer.set_noise_multiplier(float(sigma))

    def _charge(self, record: StepRecord) -> None:
        """Charge one optimizer release; releases made during one training batch are one step on one sample."""
        self.privacy_ledger.charge(record, sample=self._current_sample())

    def _current_sample(self) -> object:
        """The training batch being processed, from Lightning's batch counter (not a hook a subclass could override)."""
        trainer = self._trainer
        if trainer is None or not trainer.training:
            return None
        return (id(trainer), trainer.fit_loop.epoch_loop.batch_progress.total.ready)

    def charge(self, event: GaussianRelease) -> None:
        """Charge a release that is not an optimizer step (e.g. a noised statistic) to the ledger."""
        if not isinstance(event, GaussianRelease):
            raise TypeError(
                f"PrivateModule.charge takes a release that is not an optimizer step (GaussianRelease), got "
                f"{type(event).__name__}; optimizer steps are charged by the DP optimizer itself."
            )
        self.privacy_ledger.charge(event)


    # --- the one DP optimizer ------------------------------------------------------------------------------
    def build_dp_optimizer(self, named: Mapping[str, nn.Parameter]) -> DPOptimizer:
        """The DP optimizer over ``named`` around the configured Adam / AdamW / SGD, charging the ledger."""
        if not named:
            raise ValueError("The model has no trainable parameters; nothing to train.")
        hp = self.hparams
        kind, lr, decay = hp.get("optimizer", "adam"), hp.lr, hp.get("weight_decay", 0.0)
        if kind == "adam":
            inner = torch.optim.Adam(named.values(), lr=lr, weight_decay=decay)
        elif kind == "adamw":
            inner = torch.optim.AdamW(named.values(), lr=lr, weight_decay=decay)
        else:
            inner = torch.optim.SGD(named.values(), lr=lr, weight_decay=decay, momentum=hp.get("momentum", 0.0))
        spec = self.noise_spec
        self._dp_optimizer = DPOptimizer(
            inner, named_params=named, noise_multiplier=spec.noise_multiplier, clip_norm=spec.clip_norm,
            clipping=spec.clipping, accounting=spec.accounting, noise=self.noise_source,
            diagnostics=bool(hp.get("diagnostics", False)),
        )
        self._dp_optimizer.attach_step_hook(self._charge)
        return self._dp_optimizer

    def private_step(self, grads: Mapping[str, Tensor] | TupleGradients, *, max_freq: Tensor | None, expected_batch_size: float) -> DPOptimizer:
        """Hand this step's per-example gradients to the DP optimizer and step it (clip → sum → noise → ÷ b → step)."""
        opt = self.optimizers()
        dp: DPOptimizer = opt.optimizer if hasattr(opt, "optimizer") else opt
        dp.record(grads, max_freq=max_freq, expected_batch_size=expected_batch_size)
        opt.step()
        return dp

    # --- fit-time checks -----------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        refuse_unsafe_trainer_settings(self.trainer)
        for opt in self.trainer.optimizers:
            dp = getattr(opt, "optimizer", opt)
            if isinstance(dp, DPOptimizer):
                dp.attach_step_hook(self._charge)  # every DP optimizer of the module charges its ledger (once)
            if not isinstance(dp, DPOptimizer):
                raise TypeError(
                    f"{type(self).__name__} trains with its own DPOptimizer, got {type(opt).__name__}: do not override "
                    "configure_optimizers (or pass LightningCLI's --optimizer); choose it with `optimizer=` instead."
                )
        self.privacy_ledger.open(None)  # each fit states its sampling before its first step

    def on_train_start(self) -> None:
        """Refuse an untracked private fit (unless allowed) and state the fit's sampling in the ledger."""
        spec = self.noise_spec
        dm = self.trainer.datamodule
        found = getattr(dm, "sampling_spec", None) if dm is not None else None
        if found is not None and self.privacy_ledger.sampling is None:
            self.privacy_ledger.open(found)  # the unit the data is sampled for, checked against the mechanism's
        self.privacy_ledger.check_mechanism(spec.mechanism, spec.clipping)
        if not spec.is_private:
            return
        name = type(self).__name__
        tracked = any(getattr(cb, "charges_privacy_ledger", False) for cb in self.trainer.callbacks)
        if not tracked:
            if not self.hparams.get("allow_untracked", False):
                raise RuntimeError(
                    f"{name} is private (σ > 0) but the trainer has no PrivacyCallback: nothing would "
                    "check the budget. Add callbacks.PrivacyCallback(target_epsilon=...) to the trainer, or pass "
                    "allow_untracked=True to train anyway (every step is still recorded in module.privacy_ledger)."
                )
            rank_zero_warn(
                f"{name}: private fit without a PrivacyCallback (allow_untracked=True): nothing stops it at a "
                f"budget; its steps are recorded in privacy_ledger ({self.privacy_ledger.private_steps} spent so far).",
                category=UserWarning,
            )
        if self.privacy_ledger.sampling is None:
            if found is None:
                rank_zero_warn(
                    f"{name}: no SamplingSpec for this untracked private fit (no datamodule exposes one), "
                    "so the ledger cannot bound its ε: it records these steps as unaccounted (ε = inf).",
                    category=UserWarning,
                )
            self.privacy_ledger.open(found)

    # --- checkpoints ---------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store the privacy ledger (never the noise stream's key), and, for using the model, :attr:`input_spec` and the δ
        of its privacy reports. σ and C are saved once: in the DP optimizer's state, or here when no optimizer state is."""
        checkpoint["lightning_dprel"] = {"ledger": self.privacy_ledger.state_dict()}
        if _saved_noise_spec(checkpoint) is None:
            checkpoint["lightning_dprel"]["noise_spec"] = self.noise_spec.to_dict()
        checkpoint["lightning_dprel_usage"] = {"input_spec": self.input_spec, "delta": privacy_delta(self), "public_data": self.public_data}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        usage = checkpoint.get("lightning_dprel_usage") or {}
        self.input_spec = self.input_spec or usage.get("input_spec")  # a live datamodule's (a resumed fit) comes first
        self._saved_delta = usage.get("delta")
        self.public_data = dict(usage.get("public_data") or {}) or self.public_data
        state = checkpoint.get("lightning_dprel")
        if state is None:
            return
        if "ledger" not in state:
            raise ValueError(
                "This checkpoint predates the privacy ledger (no checkpoint['lightning_dprel']['ledger']), so what it "
                "spent is unknown; retrain, or account it yourself and continue from a fresh module."
            )
        self.privacy_ledger.load_state_dict(state["ledger"])
        saved = state.get("noise_spec") or _saved_noise_spec(checkpoint)
        if saved is not None:
            self._noise_spec = NoiseSpec(**saved)
        if self._dp_optimizer is not None:
            self._dp_optimizer.noise_spec = self._noise_spec


def _saved_noise_spec(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The noise spec in the checkpoint's first DP optimizer state (its one home), if any."""
    for state in checkpoint.get("optimizer_states") or ():
        if isinstance(state, Mapping) and "noise_spec" in state:
            return state["noise_spec"]
    return None
