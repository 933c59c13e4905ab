"""The attach seam: where the privacy callback gives a model its privacy layer, and the one place
it reaches past Lightning's public API.

:func:`privacy_layer` gives the callback the
:class:`~lightning_dprel.core.privacy_layer.PrivacyLayer` of a model: a lightning_dprel model
(a :class:`~lightning_dprel.core.ledger_module.LedgerModule`) is its own layer; any other
LightningModule gets the DP-SGD layer attached
(:class:`~lightning_dprel.core.attached.AttachedDPSGD`), for the unit its training loader or
datamodule declares; one that states privacy facts by hand is refused (they were faked before).

The callback reaches into Lightning here only: the trainer's strategy steps the DP optimizer in
place of the user's (``trainer.strategy.optimizers``); the module's ``training_step`` and
``backward`` (and, through :class:`~lightning_dprel.callbacks.outputs.TrainingLogGuard`, its
``log``) are shadowed on its instance for the fit and given back by :func:`close_layer`; the
validation loader is set up early (``fit_loop.epoch_loop.val_loop``) to check it is disjoint from
the private rows. The callback itself talks to the layer's protocol only. (The core's one other
reach, Lightning's batch counter, is the sample token,
:func:`~lightning_dprel.core.privacy_layer.sample_token`.)
"""

from __future__ import annotations

from typing import Any, Optional

from lightning_dprel.callbacks.outputs import (
    TrainingLogGuard, check_validation_disjoint, refuse_training_monitors,
)
from lightning_dprel.core.update_watch import UpdateWatch, declare_public
from lightning_dprel.core.attached import LEDGER_KEY, AttachedDPSGD, refuse_hand_made_facts
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.example_views import ExampleView
from lightning_dprel.core.ledger_module import LedgerModule
from lightning_dprel.core.privacy_layer import PrivacyLayer
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["attach_arguments", "privacy_layer", "validation_runs", "sampler_facts", "open_layer",
           "watch_updates", "close_layer", "saved_ledger_of"]


def attach_arguments(clip_norm: Optional[float], noise_multiplier: Optional[float],
                     log_private_metrics: bool) -> tuple[Optional[float], Optional[float], bool]:
    """The callback's arguments for a plain LightningModule, checked: C, σ, and whether its training logs are kept."""
    from lightning_dprel.core.checks import positive_finite

    if not isinstance(log_private_metrics, bool):
        raise TypeError(f"`log_private_metrics` must be a bool, got {type(log_private_metrics).__name__}.")
    clip_norm = None if clip_norm is None else positive_finite("clip_norm", clip_norm, "e.g. clip_norm=1.0")
    sigma = None if noise_multiplier is None else positive_finite("noise_multiplier", noise_multiplier, "e.g. 1.0")
    return clip_norm, sigma, log_private_metrics


def privacy_layer(trainer: Any, pl_module: Any, *, clip_norm: Optional[float],
                  noise_multiplier: Optional[float], log_private_metrics: bool = False,
                  saved_ledger: Optional[dict] = None) -> PrivacyLayer:
    """The privacy layer of ``pl_module``: itself if it is a lightning_dprel model, else the DP-SGD
    layer attached to it (the trainer steps its DP optimizer; the module's step runs through it)."""
    if isinstance(pl_module, LedgerModule):
        return pl_module
    if isinstance(pl_module, PrivacyLayer):
        raise TypeError(
            f"{type(pl_module).__name__} implements PrivacyLayer without LedgerModule: subclass "
            "LedgerModule or PrivateModule, or drop PrivacyLayer and let the callback attach the layer."
        )
    refuse_hand_made_facts(pl_module)
    if clip_norm is None:
        raise ValueError(
            f"PrivacyCallback makes {type(pl_module).__name__} private itself and needs "
            "`clip_norm=` (C, the bound on each example's gradient norm), e.g. "
            "PrivacyCallback(target_epsilon=8.0, clip_norm=1.0, calibrate=True)."
        )
    sigma = noise_multiplier if noise_multiplier is not None else 1.0  # calibrate=True replaces it
    if log_private_metrics:
        from pytorch_lightning.utilities.rank_zero import rank_zero_warn

        from lightning_dprel.core.attached import PRIVATE_METRICS_WARNING

        rank_zero_warn(PRIVATE_METRICS_WARNING, category=UserWarning)
    layer = AttachedDPSGD(trainer, pl_module, clip_norm=clip_norm, noise_multiplier=sigma,
                          log_private_metrics=log_private_metrics, saved_ledger=saved_ledger)
    trainer.strategy.optimizers = [layer.dp]
    pl_module.__dict__["training_step"] = layer.training_step
    pl_module.__dict__["backward"] = _no_backward
    return layer


def _no_backward(*args: Any, **kwargs: Any) -> None:
    """The DP optimizer wrote the gradient from per-example ones; the batch loss is not used."""


def sampler_facts(trainer: Any) -> tuple[SamplingSpec, ExampleView]:
    """The SamplingSpec and example view of the training data, from a sampler of the library's only (a plain loader
    that states them would be trusted for a sampling it does not do)."""
    from lightning_dprel.core.datamodule import PrivateDataModule
    from lightning_dprel.datamodules.poisson import DPDataLoader

    dm = trainer.datamodule
    if isinstance(dm, PrivateDataModule) and isinstance(getattr(dm, "example_view", None), ExampleView):
        sampler = type(dm).train_dataloader
        if not getattr(sampler, "__module__", "").startswith("lightning_dprel."):
            raise ValueError(
                f"{type(dm).__name__}.train_dataloader is not the library's: a plain LightningModule is trained only on "
                "a sampler the library implements, so that the SamplingSpec it is charged for is the sampling that ran. "
                "Use DPDataLoader, LinkPredictionDataModule or NodeSplitDataModule(as_pyg_batches=True) as they are."
            )
        _refuse_foreign_shared_keys(getattr(type(dm), "next_batch", None), dm.example_view, type(dm).__name__)
        return dm.sampling_spec, dm.example_view
    loaders = trainer.train_dataloader
    loaders = list(loaders.values()) if isinstance(loaders, dict) else loaders
    if isinstance(loaders, (list, tuple)) and len(loaders) > 1:
        raise ValueError(
            f"PrivacyCallback got {len(loaders)} training loaders: Lightning joins their batches into one step, which "
            "is not one Poisson sample of one dataset (rows would be paired by position, or the same sample charged "
            "once for two). Train on one DPDataLoader over one dataset (concatenate the datasets first)."
        )
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        if isinstance(loader, DPDataLoader):
            _refuse_foreign_shared_keys(None, loader.example_view, type(loader).__name__)
            return loader.sampling_spec, loader.example_view
    found = type(loaders).__name__ if dm is None else f"datamodule {type(dm).__name__}"
    raise ValueError(
        f"PrivacyCallback needs the training data from a Poisson sampler it can account, got {found}. Use "
        "DPDataLoader(dataset, batch_size=b) (rows; was DataLoader(..., shuffle=True)), LinkPredictionDataModule "
        "(a PyG link predictor) or NodeSplitDataModule(as_pyg_batches=True) (a PyG GNN)."
    )


def _refuse_foreign_shared_keys(draw: Any, view: ExampleView, owner: str) -> None:
    """Keys every example shares whole are drawn by the library's own samplers only (it cannot see what else reads)."""
    if getattr(view, "shared", ()) and not getattr(draw, "__module__", "").startswith("lightning_dprel."):
        raise ValueError(
            f"{owner} declares shared batch keys {list(view.shared)}, which every example's loss reads whole. Only the "
            "library's samplers draw them (from the keyed stream, reading no data); the library cannot see whether "
            "yours read other examples (in-batch negatives would). Put per-example values in the rows instead."
        )


def open_layer(trainer: Any, pl_module: Any, layer: Any, *, keep_logs: bool) -> Any:
    """Fit start of a DP-SGD fit, before step 1: an attached layer takes its sampler's facts (and refuses validation
    rows of the training data); a monitor no validation feeds is refused; training logs are guarded
    (:mod:`~lightning_dprel.callbacks.outputs`: a plain module's dropped unless ``keep_logs``). Returns ``layer``."""
    if isinstance(layer, AttachedDPSGD):
        layer.prepare(*sampler_facts(trainer))
    refuse_training_monitors(trainer, lambda: validation_runs(trainer))
    _refuse_batch_norm_recomputed(trainer, pl_module)
    if isinstance(layer, AttachedDPSGD) and validation_runs(trainer):
        loaders = trainer.train_dataloader
        for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
            if hasattr(loader, "batches"):  # a DPDataLoader: its rows are the private units
                check_validation_disjoint(trainer, loader.batches.dataset)
    _remove_guard(pl_module)
    TrainingLogGuard(pl_module, trainer, keep=keep_logs or not isinstance(layer, AttachedDPSGD))
    return layer


def validation_runs(trainer: Any) -> bool:
    """Whether this fit runs a validation loop (Lightning's ``enable_validation``: a
    validation_step, a loader, limit_val_batches > 0, and the loader gives batches)."""
    if not trainer.enable_validation:
        return False
    trainer.fit_loop.epoch_loop.val_loop.setup_data()  # idempotent: Lightning runs it anyway
    return bool(trainer.val_dataloaders)


def _refuse_batch_norm_recomputed(trainer: Any, pl_module: Any) -> None:
    """SWA's last epoch recomputes every BatchNorm's running statistics from the training batches, even of a BatchNorm
    frozen in eval mode: refused before step 1."""
    from pytorch_lightning.callbacks import StochasticWeightAveraging
    from torch.nn.modules.batchnorm import _BatchNorm

    if any(isinstance(cb, StochasticWeightAveraging) for cb in trainer.callbacks):
        bn = next((n for n, m in pl_module.named_modules() if isinstance(m, _BatchNorm)), None)
        if bn is not None:
            raise ValueError(
                f"StochasticWeightAveraging recomputes the running statistics of `{bn}` (BatchNorm) from the private "
                "training batches in its last epoch, without noise, even when it is frozen in eval mode. Use "
                "nn.GroupNorm / nn.LayerNorm with SWA, or average the weights without SWA's BatchNorm pass."
            )


def _remove_guard(pl_module: Any) -> None:
    guard = getattr(pl_module.__dict__.get("log"), "__self__", None)
    if isinstance(guard, TrainingLogGuard):
        guard.remove()


def watch_updates(trainer: Any, pl_module: Any, ledger: Any, *, keep_logs: bool = False) -> UpdateWatch:
    """An :class:`UpdateWatch` of ``pl_module``, rebased by every DP optimizer's step (after its release is charged);
    the updates Lightning's schedulers, SWA and fine-tuning callbacks make from public facts are declared public."""
    from pytorch_lightning.callbacks import BaseFinetuning, StochasticWeightAveraging

    watch = UpdateWatch(pl_module, ledger, reset_metrics=not keep_logs)
    for opt in trainer.optimizers:
        dp = getattr(opt, "optimizer", opt)
        if isinstance(dp, DPOptimizer):
            watch.watch_releases_of(dp)
    watch.on_close.append(declare_public(pl_module, pl_module, "lr_scheduler_step"))
    for cb in trainer.callbacks:
        if isinstance(cb, (StochasticWeightAveraging, BaseFinetuning)):
            watch.on_close.append(declare_public(pl_module, cb, "on_train_epoch_start"))
    return watch


def close_layer(pl_module: Any, layer: Optional[PrivacyLayer], watch: Optional[UpdateWatch], *,
                failed: bool = False) -> tuple[Any, None]:
    """End of fit: the layer closes (an attached one gives the module its own methods back; its
    ledger stays readable), the watch stops; after an error (``failed``), whatever moved since the
    last charged release reads ε = ∞."""
    if layer is not None:
        layer.close_fit(failed=failed)
    if isinstance(layer, AttachedDPSGD):
        pl_module.__dict__.pop("training_step", None)
        pl_module.__dict__.pop("backward", None)
    _remove_guard(pl_module)
    if watch is not None:
        if failed:
            watch.settle()
        watch.close()
    return layer, None


def saved_ledger_of(pl_module: Any, checkpoint: dict) -> Optional[dict]:
    """The ledger a checkpoint saved for an attached layer (a lightning_dprel model restores its own)."""
    state = None if isinstance(pl_module, PrivacyLayer) else checkpoint.get(LEDGER_KEY)
    return None if state is None else state["ledger"]
