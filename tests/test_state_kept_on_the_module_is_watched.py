"""Values kept on the module outside its parameters and buffers (a plain tensor attribute, a float, a list) that change
between private steps are caught like a parameter change: the fit stops, ε = ∞, and the error names the attribute,
wherever the change came from (the module's hook, another callback). Values set before training and never changed, and
what validation on public data keeps, are not releases.

The audit that found the gap: a tensor set from the batch in ``on_train_batch_end`` and read by the next step's loss
moved the released sum by 3.07 C (the removed row was not in that next batch) while a finite ε was reported. The first
test measures that move itself, so it can fail.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_helpers import released_sum
from lightning_dprel import DPDataLoader, PrivacyCallback

pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*(KeyedStream|DPDataLoader)\\(.*seed.*")]

X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.temperature = torch.tensor(2.0)  # set once, public: never a release

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]) / self.temperature, batch[1])

    def validation_step(self, batch, batch_idx):
        self.last_val = float(F.cross_entropy(self.net(batch[0]), batch[1]))  # public data: kept, not a release

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KeepsBatchMean(MLP):
    """The audit's module: the next step's loss reads a statistic of the previous private batch."""

    def __init__(self):
        super().__init__()
        self.centre = torch.zeros(8)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.centre = batch[0].mean(0)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0] - self.centre), batch[1])


class KeepsAFloat(MLP):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.scale = float(batch[0].std())


class KeepsAHistory(MLP):
    def __init__(self):
        super().__init__()
        self.history = []

    def on_train_batch_start(self, batch, batch_idx):
        self.history.append(batch[0].sum(0))


class SetsFromACallback(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.net[0].peek = batch[0][:1].clone()  # on a submodule, from another callback


def _fit(model, cb, *, callbacks=(), val=None, **kwargs):
    opts = dict(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0 if val is None else 1.0)
    pl.Trainer(callbacks=[cb, *callbacks], **{**opts, **kwargs}).fit(
        model, DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=0), val)


def _callback():
    return PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)


class ReadsACentre(KeepsBatchMean):
    on_train_batch_end = MLP.on_train_batch_end  # the step reads ``centre``; the test sets it


def test_a_statistic_kept_from_the_last_batch_moves_the_next_release_by_more_than_c(monkeypatch):
    """What the watch catches, measured through the real step: the next batch's clipped sum moves by more than C with
    a row that batch does not hold."""
    torch.manual_seed(0)
    model, cb = ReadsACentre(), _callback()
    _fit(model, cb, max_steps=1)
    last = torch.cat([X[:20], 30 * X[20:21]])  # the previous batch, with an outlier row
    following = [X[40:60], Y[40:60]]
    moves = []
    for centre in (last.mean(0), last[:20].mean(0)):
        model.centre = centre
        moves.append(released_sum(monkeypatch, model, cb, following))
    assert float((moves[0] - moves[1]).norm()) > 1.0


@pytest.mark.parametrize("model,callbacks,name", [
    (KeepsBatchMean(), (), "centre"),
    (KeepsAFloat(), (), "scale"),
    (KeepsAHistory(), (), "history"),
    (MLP(), (SetsFromACallback(),), "net.0.peek"),
], ids=["tensor-from-on_train_batch_end", "float", "list-from-on_train_batch_start", "submodule-from-a-callback"])
def test_a_value_kept_on_the_module_from_a_private_batch_stops_the_fit_at_infinite_epsilon(model, callbacks, name):
    cb = _callback()
    with pytest.raises(RuntimeError, match=rf"changed without a charged private release \(e.g. \['{name}.*'\]\).*"
                                           r"plain attributes \(not parameters or buffers\)"):
        _fit(model, cb, callbacks=callbacks)
    assert cb.epsilon == float("inf")


def test_constants_on_the_module_and_values_validation_keeps_are_not_releases():
    model, cb = MLP(), _callback()
    public = TensorDataset(torch.randn(30, 8, generator=torch.Generator().manual_seed(1)), Y[:30].clone())
    _fit(model, cb, val=DataLoader(public, batch_size=30), val_check_interval=2)
    assert cb.steps == 4 and 0 < cb.epsilon < float("inf") and isinstance(model.last_val, float)


class EditsThenDeclaresPublic(pl.Callback):
    """An edit from the batch, then a public_update block (as a public-data callback would run after it)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from lightning_dprel.callbacks import public_update

        with torch.no_grad():
            pl_module.net[0].bias.copy_(batch[0].mean(0).repeat(2))
        with public_update(pl_module):
            pass


def test_public_update_declares_only_its_own_body_and_checks_what_moved_before_it():
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['net.0.bias'\]\)"):
        _fit(MLP(), cb, callbacks=[EditsThenDeclaresPublic()])
    assert cb.epsilon == float("inf") and cb.steps == 1
