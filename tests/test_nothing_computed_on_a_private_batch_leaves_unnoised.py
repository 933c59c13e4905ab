"""Nothing computed on a private batch leaves a made-private fit without noise: logs from any hook or callback while
training are dropped (kept only under ``log_private_metrics=True``, with its warning); a scheduler, ``EarlyStopping``
or ``ModelCheckpoint`` that monitors a metric only training could feed is refused at fit start, and a training-time
log of a monitored metric is refused when it is made; validation data that shares rows with the training data is
refused where the library can see it.

The audit that found the gap: a loss computed on the private batch in ``on_train_batch_end``, logged there and
monitored by ReduceLROnPlateau, EarlyStopping or ModelCheckpoint, trained to a reported ε = 4.18 while the learning
rate, the stop and the checkpoint were non-private functions of the data.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback

pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*(KeyedStream|DPDataLoader)\\(.*seed.*"),
              pytest.mark.filterwarnings("ignore:.*log_private_metrics=True.*"),
              pytest.mark.filterwarnings("ignore:.*ModelCheckpoint.*could not find the monitored key.*")]

X = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()
TRAIN = TensorDataset(X[:200], Y[:200])
PUBLIC = TensorDataset(X[200:], Y[200:])  # the same tensors' other rows: disjoint


class MLP(pl.LightningModule):
    def __init__(self, plateau: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.plateau = plateau

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def on_train_batch_end(self, outputs, batch, batch_idx):  # the audit's hook: a loss on the private batch
        with torch.no_grad():
            self.log("hook_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.plateau:
            return opt
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": self.plateau}}


class LogsFromACallback(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("callback_mean", batch[0].mean())
        pl_module.log_dict({"callback_max": batch[0].max()})


def _fit(model, cb, *, callbacks=(), val=None, train=TRAIN, **kwargs):
    opts = dict(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0 if val is None else 1.0)
    trainer = pl.Trainer(callbacks=[cb, *callbacks], **{**opts, **kwargs})
    trainer.fit(model, DPDataLoader(train, batch_size=20.0, seed=0), val)
    return trainer


def _callback(**kwargs):
    return PrivacyCallback(**{"delta": 1e-5, "clip_norm": 1.0, "noise_multiplier": 1.0, **kwargs})


def test_logs_from_any_training_hook_or_callback_are_dropped_and_validation_logs_kept():
    cb = _callback()
    trainer = _fit(MLP(), cb, callbacks=[LogsFromACallback()], val=DataLoader(PUBLIC, batch_size=100), val_check_interval=2)
    metrics = set(trainer.callback_metrics) | set(trainer.logged_metrics)
    assert not metrics & {"hook_loss", "callback_mean", "callback_max"}
    assert {"val_loss", "epsilon"} <= set(trainer.callback_metrics) and cb.steps == 4


def test_training_logs_are_kept_only_under_log_private_metrics():
    cb = _callback(log_private_metrics=True)
    with pytest.warns(UserWarning, match="outside the differential-privacy guarantee"):
        trainer = _fit(MLP(), cb, callbacks=[LogsFromACallback()])
    assert {"hook_loss", "callback_mean", "callback_max"} <= set(trainer.callback_metrics)


@pytest.mark.parametrize("make", [
    lambda: dict(model=MLP(plateau="hook_loss")),
    lambda: dict(model=MLP(), callbacks=[EarlyStopping(monitor="hook_loss", check_on_train_epoch_end=True)]),
    lambda: dict(model=MLP(), callbacks=[ModelCheckpoint(monitor="hook_loss")], enable_checkpointing=True),
], ids=["ReduceLROnPlateau", "EarlyStopping", "ModelCheckpoint"])
def test_a_monitor_no_validation_feeds_is_refused_at_fit_start(make, tmp_path):
    kwargs = make()
    model = kwargs.pop("model")
    cb = _callback()
    start = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"monitors 'hook_loss', but this private fit runs no validation.*monitor a "
                                         r"metric of a public validation set instead"):
        _fit(model, cb, default_root_dir=tmp_path, **kwargs)
    assert cb.steps == 0 and all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


@pytest.mark.parametrize("log_private", [False, True])
def test_a_training_log_of_a_monitored_metric_is_refused_even_with_validation(log_private):
    cb = _callback(log_private_metrics=log_private)
    with pytest.raises(ValueError, match=r"MLP logs 'hook_loss' during training, and EarlyStopping monitors it"):
        _fit(MLP(), cb, callbacks=[EarlyStopping(monitor="hook_loss")], val=DataLoader(PUBLIC, batch_size=100))
    assert cb.steps == 1  # refused at the first batch end: the logged value never reached the monitor


def test_monitoring_a_public_validation_metric_or_epsilon_trains():
    cb = _callback()
    stop = EarlyStopping(monitor="val_loss", patience=100)
    trainer = _fit(MLP(plateau="val_loss"), cb, callbacks=[stop, EarlyStopping(monitor="epsilon", mode="max", patience=100)],
                   val=DataLoader(PUBLIC, batch_size=100), max_steps=-1, max_epochs=2)
    assert cb.steps == 20 and 0 < cb.epsilon < float("inf") and "val_loss" in trainer.callback_metrics


@pytest.mark.parametrize("val", [
    lambda: TRAIN,
    lambda: Subset(TRAIN, range(150, 200)),
    lambda: TensorDataset(X[150:250], Y[150:250]),
], ids=["the-training-dataset", "a-subset-of-it", "overlapping-rows-of-the-same-tensors"])
def test_validation_on_rows_of_the_training_data_is_refused(val):
    cb = _callback()
    with pytest.raises(ValueError, match=r"The validation loader reads rows of the private training dataset"):
        _fit(MLP(), cb, val=DataLoader(val(), batch_size=100))
    assert cb.steps == 0


@pytest.mark.parametrize("train,val", [
    (lambda: Subset(TRAIN, range(0, 100)), lambda: Subset(TRAIN, range(100, 200))),
    (lambda: TensorDataset(X[::2], Y[::2]), lambda: TensorDataset(X[1::2], Y[1::2])),
], ids=["disjoint-subsets", "interleaved-rows-of-one-tensor"])
def test_disjoint_validation_rows_of_the_same_data_are_accepted(train, val):
    cb = _callback()
    _fit(MLP(), cb, train=train(), val=DataLoader(val(), batch_size=100))
    assert cb.steps == 4
