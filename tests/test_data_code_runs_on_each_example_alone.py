"""A user's code before the private step (a ``collate_fn``, an overridden batch hook) runs on each example alone, so
each row of the batch depends on its own example only; code that mixes examples is refused before the first release.

The audit that found the gap: a ``collate_fn`` normalising the batch by its mean and std moved the released clipped sum
by 3.12 C when one row was removed, while a finite ε was reported. The negative control below measures that move with
the mixing collate applied whole, so the test can fail.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from ddp_helpers import released_sum
from lightning_dprel import DPDataLoader, PrivacyCallback

pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*(KeyedStream|DPDataLoader)\\(.*seed.*"),
              pytest.mark.filterwarnings("ignore:std\\(\\). degrees of freedom")]

X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0)) * 3 + 1
Y = (X[:, 0] > 1).long()
ROWS = TensorDataset(X, Y)


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def normalise_batch(items):  # (x − mean) / std over the batch: each row reads every other row
    x, y = torch.stack([i[0] for i in items]), torch.stack([i[1] for i in items])
    return [(x - x.mean(0)) / (x.std(0) + 1e-6), y]


def mixup_batch(items):
    x, y = torch.stack([i[0] for i in items]), torch.stack([i[1] for i in items])
    return [0.7 * x + 0.3 * x.flip(0), y]


def scale_each(items):  # per example: each row from its own example
    return [torch.stack([i[0] for i in items]) / 3.0, torch.stack([i[1] for i in items])]


def _fit(model, loader, cb, **kwargs):
    opts = dict(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    pl.Trainer(callbacks=[cb], **{**opts, **kwargs}).fit(model, loader)


def _callback():
    return PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("collate", [normalise_batch, mixup_batch], ids=["normalise", "mixup"])
def test_a_collate_that_mixes_examples_is_refused_before_any_release(collate):
    model, cb = MLP(), _callback()
    start = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=rf"Your collate_fn \({collate.__name__}\) gives a different batch .* mixes "
                                         r"examples .* Move per-example transforms into the Dataset"):
        _fit(model, DPDataLoader(ROWS, batch_size=20.0, seed=0, collate_fn=collate), cb)
    assert cb.steps == 0 and all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


def test_a_per_example_collate_trains_to_a_finite_epsilon():
    cb = _callback()
    _fit(MLP(), DPDataLoader(ROWS, batch_size=20.0, seed=0, collate_fn=scale_each), cb)
    assert cb.steps == 3 and 0 < cb.epsilon < float("inf")


def test_removing_one_example_moves_the_released_sum_by_at_most_c_with_a_per_example_collate(monkeypatch):
    clip = 0.05
    torch.manual_seed(1)
    model, cb = MLP(), PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0)
    loader = DPDataLoader(ROWS, batch_size=20.0, seed=0, collate_fn=scale_each)
    _fit(model, loader, cb, max_steps=1)
    collate = loader.batches.collate_fn  # the loader's: the user's collate run on each example alone
    items = [(X[0] * 20, Y[0])] + [ROWS[i] for i in range(1, 40)]  # row 0 an outlier: what an adversary removes
    moves, mixed = [], []
    for j in range(0, 40, 7):
        rest = items[:j] + items[j + 1:]
        full, without = (released_sum(monkeypatch, model, cb, collate(b)) for b in (items, rest))
        moves.append(float((full - without).norm()))
        # the negative control: the mixing collate applied to the whole batch, as a plain DataLoader would
        full, without = (released_sum(monkeypatch, model, cb, normalise_batch(b)) for b in (items, rest))
        mixed.append(float((full - without).norm()))
    assert max(moves) <= clip * (1 + 1e-5) and min(moves) >= 0.999 * clip
    assert max(mixed) > 1.5 * clip  # above the bound C: what the per-example collate prevents


# ---------------------------------------------------------------------- batch hooks of the module or the datamodule
class NormalisesAfterTransfer(MLP):
    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        return [(x - x.mean(0)) / (x.std(0) + 1e-6), y]


class ScalesAfterTransfer(MLP):
    def on_after_batch_transfer(self, batch, dataloader_idx):
        return [batch[0] / 3.0, batch[1]]


class SeesBatches(pl.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch[0].clone())


class MixingData(pl.LightningDataModule):
    def train_dataloader(self):
        return DPDataLoader(ROWS, batch_size=20.0, seed=0)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        return [x - x.mean(0), y]


def test_a_batch_hook_that_mixes_examples_is_refused_on_the_module_or_the_datamodule():
    cb = _callback()
    with pytest.raises(ValueError, match=r"NormalisesAfterTransfer.on_after_batch_transfer gives a different batch"):
        _fit(NormalisesAfterTransfer(), DPDataLoader(ROWS, batch_size=20.0, seed=0), cb)
    assert cb.steps == 0
    cb = _callback()
    with pytest.raises(ValueError, match=r"MixingData.on_before_batch_transfer gives a different batch"):
        pl.Trainer(max_steps=2, callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False).fit(MLP(), datamodule=MixingData())
    assert cb.steps == 0


def test_a_per_example_batch_hook_runs_on_each_example_and_the_module_gets_it_back():
    model, cb, seer = ScalesAfterTransfer(), _callback(), SeesBatches()
    hook = model.on_after_batch_transfer
    pl.Trainer(max_steps=3, callbacks=[cb, seer], logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model, DPDataLoader(ROWS, batch_size=20.0, seed=0))
    assert cb.steps == 3 and 0 < cb.epsilon < float("inf")
    assert seer.seen and all(float(b.abs().max()) < float(X.abs().max()) / 2.9 for b in seer.seen)  # the hook ran
    assert "on_after_batch_transfer" not in model.__dict__ and model.on_after_batch_transfer == hook
