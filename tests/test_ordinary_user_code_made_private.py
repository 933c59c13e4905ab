"""Ordinary user code around a made-private module, as an independent audit wrote it: what reads the whole private
batch or keeps a private value for later is refused or ends at ε = ∞ (with the cause named), and what is public or
per-example trains to a finite ε.

Found leaks (finite ε before): the batch rewritten in ``on_train_batch_start`` (mixup in a callback: the released sum
moved by 3.14 C), batch statistics kept in a deque or a helper object on the module (2.45 C, 6.29 C), a learning rate
cut from a private loss in a callback, a reloaded loader with another sampling rate (ε 2.37 reported, 4.46 spent), and
an export after a non-private fine-tune. False positives fixed: a torchmetrics metric updated in ``training_step``, a
validation metric never reset, random per-example augmentation, a BatchNorm frozen in ``on_train_start``, Lightning's
schedulers, SWA and fine-tuning callbacks.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchmetrics
from pytorch_lightning.callbacks import BackboneFinetuning, GradientAccumulationScheduler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback, export_model
from test_data_code_runs_on_each_example_alone import MLP  # the same small classifier

pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*(KeyedStream|DPDataLoader)\\(.*seed.*")]

X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()
INF = float("inf")


def _fit(model, cb=None, *, callbacks=(), loader=None, val=None, **kwargs):
    cb = cb or PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    opts = dict(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0 if val is None else 1.0)
    pl.Trainer(callbacks=[cb, *callbacks], **{**opts, **kwargs}).fit(
        model, loader or DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=0), val)
    return cb


# ---------------------------------------------------------------------- the batch rewritten before the step
class MixupCallback(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        x, _ = batch
        x.copy_(0.7 * x + 0.3 * x.flip(0))


class CentresInBatchStart(MLP):
    def on_train_batch_start(self, batch, batch_idx):
        batch[0].sub_(batch[0].mean(0, keepdim=True))


@pytest.mark.parametrize("model,callbacks", [(MLP(), (MixupCallback(),)), (CentresInBatchStart(), ())],
                         ids=["mixup-in-a-callback", "centring-in-the-module"])
def test_a_batch_rewritten_in_on_train_batch_start_is_refused_before_the_release(model, callbacks):
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"The private batch was changed after it was sampled and before its release "
                                         r"\(\['batch\[0\]'\]\).*Refused before the release"):
        _fit(model, cb, callbacks=callbacks)
    assert cb.steps == 0


# ---------------------------------------------------------------------- values kept in any container or helper
class RunningNorm:
    def __init__(self):
        self.mean, self.count = torch.zeros(8), 0

    def update(self, x):
        self.count += 1
        self.mean = self.mean + (x.mean(0) - self.mean) / self.count


@dataclasses.dataclass
class Stats:
    top: float = 0.0


class KeepsInADeque(MLP):
    def __init__(self):
        super().__init__()
        self.hist = collections.deque(maxlen=5)

    def on_train_batch_start(self, batch, batch_idx):
        self.hist.append(batch[0].abs().amax(0))


class KeepsInAHelper(MLP):
    def __init__(self):
        super().__init__()
        self.norm = RunningNorm()

    def on_train_batch_start(self, batch, batch_idx):
        self.norm.update(batch[0])


class KeepsAnInt(MLP):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.n_pos = int(batch[1].sum())


class KeepsInADataclass(MLP):
    def __init__(self):
        super().__init__()
        self.stats = Stats()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.stats.top = float(batch[0].max())


@pytest.mark.parametrize("model,name", [(KeepsInADeque(), "hist"), (KeepsInAHelper(), "norm"), (KeepsAnInt(), "n_pos"),
                                        (KeepsInADataclass(), "stats")],
                         ids=["deque", "helper-object", "int", "dataclass"])
def test_a_private_value_in_a_deque_a_helper_an_int_or_a_dataclass_reads_infinite_epsilon(model, name):
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(RuntimeError, match=rf"changed without a charged private release \(e.g. \[.*'{name}.*plain attr"):
        _fit(model, cb)
    assert cb.epsilon == INF


# ---------------------------------------------------------------------- optimizer hyper-parameters
class CutsLROnASpike(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            if F.cross_entropy(pl_module.net(batch[0]), batch[1]) > 0.0:
                for group in trainer.optimizers[0].param_groups:
                    group["lr"] *= 0.1


class WithStepLR(MLP):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                                   "interval": "step"}}


def test_a_learning_rate_set_from_a_private_loss_reads_infinite_epsilon_and_a_schedule_trains():
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['optimizer\[0\]"
                                           r"\.param_groups\[0\]\.lr'\]\)"):
        _fit(MLP(), cb, callbacks=[CutsLROnASpike()])
    assert cb.epsilon == INF
    model = WithStepLR()
    cb = _fit(model)
    assert cb.steps == 4 and 0 < cb.epsilon < INF
    assert model.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


class Backbone(MLP):
    def __init__(self):
        super().__init__()
        self.backbone, self.head = nn.Linear(8, 16), nn.Linear(16, 2)
        del self.net

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.head(torch.tanh(self.backbone(batch[0]))), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def test_backbone_finetuning_unfreezes_trains_the_backbone_privately_with_finite_epsilon():
    model = Backbone()
    start = model.backbone.weight.detach().clone()
    cb = _fit(model, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1)], max_steps=-1, max_epochs=2,
              loader=DPDataLoader(TensorDataset(X, Y), batch_size=100.0, seed=0))
    assert cb.steps == 4 and 0 < cb.epsilon < INF
    assert not torch.equal(model.backbone.weight, start)  # the unfrozen backbone is trained, through the DP optimizer


# ---------------------------------------------------------------------- loaders and export
class ReloadsAnotherRate(MLP):
    def train_dataloader(self):
        return DPDataLoader(TensorDataset(X, Y), batch_size=20.0 if self.current_epoch == 0 else 100.0, seed=0)


def test_reloading_the_training_loader_every_epoch_is_refused():
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs=1"):
        pl.Trainer(callbacks=[cb], max_epochs=2, reload_dataloaders_every_n_epochs=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False).fit(ReloadsAnotherRate())
    assert cb.steps == 0


def test_gradient_accumulation_scheduler_is_refused_before_any_step():
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"GradientAccumulationScheduler"):
        _fit(MLP(), cb, callbacks=[GradientAccumulationScheduler({1: 2})])
    assert cb.steps == 0


def test_export_refuses_weights_changed_after_the_private_fit(tmp_path):
    model = MLP()
    _fit(model)
    export_model(model, tmp_path / "ok")  # as released
    with torch.no_grad():
        model.net[0].weight.add_(1.0)  # a non-private fine-tune, or any edit after fit
    with pytest.raises(ValueError, match=r"weights of MLP changed after its last private fit"):
        export_model(model, tmp_path / "edited")


# ---------------------------------------------------------------------- what is not a release trains
class TrainAccuracy(MLP):
    def __init__(self):
        super().__init__()
        self.acc = torchmetrics.classification.BinaryAccuracy()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            self.acc(self.net(batch[0]).argmax(-1), batch[1])
            self.log("train_acc", self.acc)


class ValidationAccuracyNeverReset(MLP):
    def __init__(self):
        super().__init__()
        self.val_acc = torchmetrics.classification.BinaryAccuracy()

    def validation_step(self, batch, batch_idx):
        self.val_acc.update(self.net(batch[0]).argmax(-1), batch[1])

    def on_validation_epoch_end(self):
        self.last = float(self.val_acc.compute())


class FreezesBatchNormOnTrainStart(MLP):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 2))
        self.net[1].requires_grad_(False)

    def on_train_start(self):
        self.net[1].eval()

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def jitter(items):  # random per-example augmentation in a collate
    x = torch.stack([i[0] for i in items])
    return [x + 0.01 * torch.randn_like(x), torch.stack([i[1] for i in items])]


def test_metrics_schedules_frozen_batch_norm_and_random_augmentation_train_to_a_finite_epsilon():
    public = DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 2, (40,))), batch_size=40)
    model = TrainAccuracy()
    cb = _fit(model)
    assert cb.steps == 4 and 0 < cb.epsilon < INF and model.acc._update_count == 0  # reset: a training log, dropped
    model = ValidationAccuracyNeverReset()
    cb = _fit(model, val=public, val_check_interval=2)
    assert cb.steps == 4 and 0 < cb.epsilon < INF and 0.0 <= model.last <= 1.0
    cb = _fit(FreezesBatchNormOnTrainStart())
    assert cb.steps == 4 and 0 < cb.epsilon < INF
    with pytest.warns(UserWarning, match=r"collate_fn \(jitter\) draws randomness: it runs on each example alone"):
        cb = _fit(MLP(), loader=DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=0, collate_fn=jitter))
    assert cb.steps == 4 and 0 < cb.epsilon < INF


def test_texts_in_a_private_batch_are_refused_without_showing_them():
    def with_texts(items):
        return {"x": torch.stack([i[0] for i in items]), "y": torch.stack([i[1] for i in items]),
                "text": [f"secret-{float(i[0][0]):.3f}" for i in items]}

    class TextStep(MLP):
        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch["x"]), batch["y"])

    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"holds texts \(batch\['text'\]\)") as caught:
        _fit(TextStep(), cb, loader=DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=0, collate_fn=with_texts))
    assert "secret-" not in str(caught.value) and cb.steps == 0


def test_instance_norm_tracking_running_statistics_is_refused_before_any_step():
    class WithInstanceNorm(MLP):
        def __init__(self):
            super().__init__()
            self.norm = nn.InstanceNorm1d(8, track_running_stats=True)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(self.norm(batch[0][:, None, :])[:, 0]), batch[1])

    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"`norm` \(InstanceNorm1d\) .* running statistics"):
        _fit(WithInstanceNorm(), cb)
    assert cb.steps == 0
