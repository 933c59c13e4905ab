"""A plain LightningModule configured "naturally" against PrivacyCallback: the ways out of DP-SGD (Abadi et al. 2016,
Alg. 1) that are refused or detected today, each pinned by its message: an update after the DP step, a step or loss
the per-example path cannot bound, trainer settings outside the analysis.
"""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*(KeyedStream|DPDataLoader)\\(.*seed.*")
        yield


X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def _loader():
    return DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=0)


def _fit(model, cb, *, callbacks=(), **trainer_kwargs):
    opts = dict(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    pl.Trainer(callbacks=[cb, *callbacks], **{**opts, **trainer_kwargs}).fit(model, _loader())


def _callback(**kwargs):
    return PrivacyCallback(**{"delta": 1e-5, "clip_norm": 1.0, "noise_multiplier": 1.0, **kwargs})


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _write_batch_mean(module, x):  # a data-dependent, un-noised edit
    with torch.no_grad():
        module.net[0].weight[0].copy_(x.mean(0))


# ---------------------------------------------------------------------- edits after the DP step: detected (ε = ∞)
_SEEN: dict = {}  # the batch kept outside the module (kept on it, the attribute itself is caught first)


class EditAfterOptimizerStep(MLP):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step(closure=optimizer_closure)
        _write_batch_mean(self, _SEEN["x"])

    def on_train_batch_start(self, batch, batch_idx):
        _SEEN["x"] = batch[0]


class EditInTrainBatchEnd(MLP):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        _write_batch_mean(self, batch[0])


class PriorBiasOnTrainStart(MLP):  # the "output bias = log class prior" trick, on the private labels
    def on_train_start(self):
        with torch.no_grad():
            self.net[2].bias.copy_(torch.log(torch.bincount(Y, minlength=2).float() / len(Y)))


class FrozenStatAfterStep(MLP):  # a requires_grad=False feature centre, updated from the batch
    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(8), requires_grad=False)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.mu.data.mul_(0.9).add_(0.1 * batch[0].mean(0))

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


class EditingCallback(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        _write_batch_mean(pl_module, batch[0])


@pytest.mark.parametrize("model,callbacks,moved", [
    (EditAfterOptimizerStep(), (), "net.0.weight"),
    (EditInTrainBatchEnd(), (), "net.0.weight"),
    (PriorBiasOnTrainStart(), (), "net.2.bias"),
    (FrozenStatAfterStep(), (), "mu"),
    (MLP(), (EditingCallback(),), "net.0.weight"),
], ids=["optimizer_step-override", "on_train_batch_end", "on_train_start", "frozen-param", "second-callback"])
def test_an_edit_after_the_dp_step_stops_the_fit_and_reads_infinite_epsilon(model, callbacks, moved):
    cb = _callback()
    with pytest.raises(RuntimeError, match=rf"changed without a charged private release \(e.g. \['{moved}'\]\)"):
        _fit(model, cb, callbacks=callbacks)
    assert cb.epsilon == float("inf")


# ---------------------------------------------------------------------- steps and losses the per-example path refuses
class StepsItself(MLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.optimizers().step()
        return loss


class LabelMaskedMean(MLP):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")[y == 1].mean()


class LabelWeightedMean(MLP):
    def training_step(self, batch, batch_idx):
        x, y = batch
        mask = (y == 1).float()
        return (F.cross_entropy(self.net(x), y, reduction="none") * mask).sum() / mask.sum().clamp(min=1)


class OptimizesFrozen(MLP):
    def __init__(self):
        super().__init__()
        self.net[0].weight.requires_grad_(False)


@pytest.mark.parametrize("model,error,match", [
    (StepsItself(), RuntimeError, r"DPOptimizer.step\(\) without fresh per-tuple gradients"),
    (LabelMaskedMean(), ValueError, r"is neither the mean \(nan\) nor the sum \(nan\) of the examples' losses"),
    (LabelWeightedMean(), ValueError, r"is neither the mean \([0-9.]+\) nor the sum \([0-9.]+\) of the examples' losses"),
    (OptimizesFrozen(), ValueError, r"holds parameters with requires_grad=False \(\['net.0.weight'\]\)"),
], ids=["optimizer-step-in-training_step", "loss[mask].mean()", "masked-weighted-mean", "frozen-in-optimizer"])
def test_a_step_the_per_example_path_cannot_bound_is_refused_before_any_release(model, error, match):
    start = [p.detach().clone() for p in model.parameters()]
    cb = _callback()
    with pytest.raises(error, match=match):
        _fit(model, cb)
    assert cb.steps == 0 and all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


# ---------------------------------------------------------------------- trainer settings outside the analysis
@pytest.mark.parametrize("cb_kwargs,trainer_kwargs,match", [
    ({}, {"gradient_clip_val": 1.0}, r"Trainer\(gradient_clip_val=1.0\) would clip the already-noised gradient"),
    ({"target_epsilon": 3.0, "calibrate": True}, {"max_steps": -1, "max_epochs": -1},
     r"calibrate=True\) needs a finite number of steps, got max_steps=-1, max_epochs=-1"),
])
def test_trainer_settings_outside_the_analysis_are_refused(cb_kwargs, trainer_kwargs, match):
    with pytest.raises(ValueError, match=match):
        _fit(MLP(), _callback(**cb_kwargs), **trainer_kwargs)
