"""The DP-SGD layer: noise spec, DP optimizers and ``private_step``, on top of the ledger layer every private model has.

:class:`PrivateModule` builds the :class:`~lightning_dprel.core.optim.DPOptimizer` around Adam / AdamW / SGD (the noise
spec — σ, C, clipping, accounting — lives in it once built), charges every optimizer release to the
:class:`~lightning_dprel.core.ledger_module.LedgerModule`'s ledger with the batch as its sample, and runs the fit-time
checks (no Trainer-side clipping or accumulation, no foreign optimizer, no untracked private fit). A subclass computes
per-example gradients with :mod:`lightning_dprel.grad_sample` and calls :meth:`private_step`; the
:class:`~lightning_dprel.callbacks.PrivacyCallback` reads the ledger, whatever the subclass.

References:
    Abadi et al. 2016 (DP-SGD); Opacus ``PrivacyEngine`` (one optimizer wrapper, one accountant per model).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_dprel.core.checks import check_choice, check_probability, positive_finite, refuse_unsafe_trainer_settings
from lightning_dprel.core.ledger_module import LedgerModule, privacy_delta
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec
from lightning_dprel.grad_sample.base import TupleGradients

__all__ = ["PrivateModule", "refuse_unsafe_trainer_settings", "privacy_delta", "OPTIMIZERS"]

# Lightning warns (16 lines) that a ModelCheckpoint under manual optimization saves the state *after* the step. For a
# private module that is the state to resume from: the step's release is in the ledger and the parameters match it.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")

OPTIMIZERS = ("adam", "adamw", "sgd")


class PrivateModule(LedgerModule):
    """Base of the DP-SGD modules: noise spec (held by the DP optimizer), DP optimizers, ``private_step``, fit checks.

    Every noised release of a training batch (each DP optimizer's step, each :meth:`private_step`) is charged to the
    ledger with the batch as its sample, so r releases are one sampled Gaussian release at σ/√r. A module that makes
    r > 1 releases per batch sets :attr:`releases_per_sample` so that the privacy callback budgets and calibrates for it.
    """

    def _setup_privacy(
        self, *, clipping: str, accounting: str | None, clip_norm: float, noise_multiplier: float, noise_seed: int | None,
        optimizer: str, lr: float, momentum: float, diagnostics: bool,
    ) -> None:
        """Validate and set the privacy settings (call from ``__init__`` before ``save_hyperparameters``)."""
        check_choice("optimizer", optimizer, OPTIMIZERS)
        positive_finite("lr", lr)
        check_probability("momentum", momentum, zero=True)
        spec = {"noise_multiplier": float(noise_multiplier), "clip_norm": float(clip_norm), "clipping": clipping}
        #: The configured noise spec until the DP optimizer is built; from then on the optimizer holds it (one home).
        self._noise_spec: NoiseSpec | None = NoiseSpec(**spec, **({} if accounting is None else {"accounting": accounting}))
        self._dp_optimizer: DPOptimizer | None = None
        self.automatic_optimization = False
        self._setup_ledger(noise_seed=noise_seed)
        if diagnostics:
            rank_zero_warn(
                f"{type(self).__name__}(diagnostics=True) keeps per-step statistics of the private batch computed without "
                "noise (gradient norms, cosines): they are outside the differential-privacy guarantee; do not release them.",
                category=UserWarning,
            )

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
        dp = DPOptimizer(inner, named_params=named, noise=self.noise_source, diagnostics=bool(hp.get("diagnostics", False)),
                         **_optimizer_args(self.noise_spec))
        dp.attach_step_hook(self._charge)
        self._dp_optimizer, self._noise_spec = dp, None  # the optimizer holds σ and C from now on
        return dp

    def private_step(self, grads: Mapping[str, Tensor] | TupleGradients, *, max_freq: Tensor | None, batch: Any = None,
                     expected_batch_size: float | None = None) -> DPOptimizer:
        """Hand this step's per-example gradients to the DP optimizer and step it (clip → sum → noise → ÷ b → step).

        b is the SamplingSpec's the ledger opened for this fit (its one home); the batch's b must equal it (a batch drawn
        at another rate is refused); only an untracked fit without a spec (ε = ∞ in the ledger) divides by the batch's."""
        opt = self.optimizers()
        dp: DPOptimizer = opt.optimizer if hasattr(opt, "optimizer") else opt
        sampling = self.privacy_ledger.sampling
        drawn = expected_batch_size if expected_batch_size is not None else getattr(batch, "expected_batch_size", None)
        if sampling is not None and drawn is not None and not math.isclose(float(drawn), sampling.expected_batch_size, rel_tol=1e-9):
            raise RuntimeError(
                f"The batch was drawn at b = {drawn}, the SamplingSpec the fit is accounted with says "
                f"b = {sampling.expected_batch_size}; batches and accounting must come from the same sampling."
            )
        b = sampling.expected_batch_size if sampling is not None else drawn
        if b is None:
            raise ValueError("private_step needs b: no SamplingSpec is open for this fit; pass the batch.")
        dp.record(grads, max_freq=max_freq, expected_batch_size=b)
        opt.step()
        return dp

    # --- fit-time checks -----------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        refuse_unsafe_trainer_settings(self.trainer)
        for opt in self.trainer.optimizers:
            dp = getattr(opt, "optimizer", opt)
            if not isinstance(dp, DPOptimizer):
                raise TypeError(
                    f"{type(self).__name__} trains with its own DPOptimizer, got {type(opt).__name__}: do not override "
                    "configure_optimizers (or pass LightningCLI's --optimizer); choose it with `optimizer=` instead."
                )
            dp.attach_step_hook(self._charge)  # every DP optimizer of the module charges its ledger (once)
        super().on_fit_start()

    def on_train_start(self) -> None:
        """Refuse an untracked private fit (unless allowed); open the ledger for the data's sampling (once per fit)."""
        dm = self.trainer.datamodule
        found = getattr(dm, "sampling_spec", None) if dm is not None else None
        if not isinstance(found, SamplingSpec):
            found = None
        if self.noise_spec.is_private and found is None and not self.fit_opened:
            rank_zero_warn(
                f"{type(self).__name__}: no SamplingSpec for this untracked private fit (no datamodule exposes one), "
                "so the ledger cannot bound its ε: it records these steps as unaccounted (ε = inf).",
                category=UserWarning,
            )
        self.open_fit(found, self.noise_spec)

    # --- checkpoints ---------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The ledger layer's keys; σ and C are saved once: in the DP optimizer's state, or here when no optimizer state is."""
        super().on_save_checkpoint(checkpoint)
        if _saved_noise_spec(checkpoint) is None:
            checkpoint["lightning_dprel"]["noise_spec"] = self.noise_spec.to_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("lightning_dprel") or {}
        saved = state.get("noise_spec") or _saved_noise_spec(checkpoint)
        if saved is not None:
            if self._dp_optimizer is not None:
                self._dp_optimizer.noise_spec = NoiseSpec(**saved)
            else:
                self._noise_spec = NoiseSpec(**saved)

    # --- export: the trained encoder weights, its spec, the input spec ---------------------------------
    def released_weights(self) -> dict[str, Tensor]:
        """The encoder's trainable parameters (adapter, LoRA matrices, or every weight under full fine-tuning); frozen
        parts are public and rebuilt from ``model.json``."""
        from lightning_dprel.grad_sample.base import trainable_parameters

        return dict(trainable_parameters(self.encoder))

    def export_files(self, folder: Any) -> None:
        """LoRA text encoders: the same LoRA weights as a PEFT adapter (``PeftModel.from_pretrained``)."""
        inner = getattr(self.encoder, "model", None)
        if inner is not None and type(inner).__module__.startswith("peft"):
            inner.save_pretrained(str(folder / "peft_adapter"))

    def export_meta(self) -> dict[str, Any]:
        """The encoder's spec (``class_path`` + ``init_args``), the scoring hyper-parameters with the noise spec, and how
        node inputs were made from texts."""
        from lightning_dprel.encoders import encoder_spec

        hp = self.hparams
        return {"encoder": encoder_spec(self.encoder),
                "module": {**{k: hp[k] for k in _SCORING if k in hp}, **self.noise_spec.to_dict()},
                "input_spec": self.input_spec}

    # --- the report -----------------------------------------------------------------------------------
    def privacy_details(self) -> dict[str, Any]:
        spec = self.noise_spec
        ledger = self.privacy_ledger
        return {"mechanism": ledger.private_mechanism or spec.mechanism,
                "noise_multiplier": ledger.last_noise_multiplier if ledger.steps else spec.noise_multiplier,
                "clip_norm": spec.clip_norm, "clipping": spec.clipping}


#: The hyper-parameters model.json keeps for scoring and rebuilding (never the noise seed).
_SCORING = ("score", "temperature", "loss", "margin", "lr", "weight_decay", "optimizer", "momentum")


def _optimizer_args(spec: NoiseSpec) -> dict[str, Any]:
    """The DPOptimizer's noise arguments from a NoiseSpec (its fields, whatever they are)."""
    return {"noise_spec": spec}


def _saved_noise_spec(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The noise spec in the checkpoint's first DP optimizer state (its one home), if any."""
    for state in checkpoint.get("optimizer_states") or ():
        if isinstance(state, Mapping) and "noise_spec" in state:
            return state["noise_spec"]
    return None
