"""Recipe 1: an existing LightningModule (an MLP on a TensorDataset) made private at the example level by the callback.

The project (tests/projects/tabular_classifier.py) was written without lightning_dprel; its private copy differs by
the loader (``DPDataLoader``: Poisson rows at rate b/N from the keyed stream) and the callback, and keeps its
``training_step``. ε is checked against dp-accounting's Poisson-subsampled Gaussian, the released sum's sensitivity
through the real step, resume (ε continues, noise never replayed), and every refusal of what cannot be proven.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_helpers import record_noise_draws, released_sum
from lightning_dprel import DPDataLoader, PrivacyCallback
from projects import tabular_classifier as plain
from projects import tabular_classifier_private as private

PROJECTS = Path(__file__).parent / "projects"
#: Rényi orders on which dp-accounting's fractional-order series converges at q = 0.1, σ = 1.3 (it drops 1.1 and 1.2).
ORDERS = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*(KeyedStream|DPDataLoader)\\(.*seed.*")
        warnings.filterwarnings("ignore", message="You defined a `validation_step` but have no `val_dataloader`")
        yield


def _data(n=600, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, 0] - 0.7 * x[:, 1] > 0).long()


def _trainer(callback, **kwargs):
    opts = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    return pl.Trainer(callbacks=[callback], **{**opts, **kwargs})


def _loader(n=600, b=60.0, seed=None):
    return DPDataLoader(TensorDataset(*_data(n)), batch_size=b, seed=seed)


# ---------------------------------------------------------------------- the diff
def test_the_project_is_made_private_by_a_small_diff_that_keeps_its_training_step():
    before = (PROJECTS / "tabular_classifier.py").read_text().splitlines()
    after = (PROJECTS / "tabular_classifier_private.py").read_text().splitlines()
    changed = [l for l in difflib.unified_diff(before, after, lineterm="", n=0)
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 10, changed
    assert inspect.getsource(plain.MLPClassifier.training_step) == inspect.getsource(private.MLPClassifier.training_step)


@pytest.mark.slow
def test_the_private_project_trains_to_its_budget_and_beats_the_untrained_model():
    x, y = _data(1200)
    torch.manual_seed(0)
    model, untrained = private.MLPClassifier(8, 2), None
    untrained = (model(x[:240]).argmax(-1) == y[:240]).float().mean()
    trainer = private.make_trainer(max_epochs=4, target_epsilon=8.0)
    trainer.fit(model, datamodule=private.TabularData(x, y, batch_size=96))
    cb = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
    assert 0 < cb.epsilon <= 8.0 and cb.steps == trainer.global_step
    assert "val_acc" in trainer.callback_metrics  # the user's validation logs; training logs are private (not kept)
    assert "train_loss" not in trainer.callback_metrics
    trained = (model(x[:240]).argmax(-1) == y[:240]).float().mean()
    assert trained > untrained + 0.1
    assert "training_step" not in model.__dict__  # the module has its own step back after the fit


@pytest.mark.slow
def test_utility_on_a_tabular_set_over_three_seeds(capsys):
    """sklearn's digits (pixels 0..16, scaled by the known range, not by the data): untrained / private at ε = 8 /
    non-private on a held-out fifth, same seeds and settings (none tuned on it)."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y, test = x[perm], y[perm], slice(0, len(x) // 5)
    rows = []
    for seed in (0, 1, 2):
        accs = []
        for project in (None, plain, private):
            torch.manual_seed(seed)
            model = (project or plain).MLPClassifier(64, 10, hidden=64)
            if project is not None:
                trainer = project.make_trainer(max_epochs=8, limit_val_batches=0, num_sanity_val_steps=0)
                trainer.fit(model, datamodule=project.TabularData(x, y, batch_size=128, val_fraction=0.2))
            accs.append(float((model(x[test]).argmax(-1) == y[test]).float().mean()))
        rows.append(accs)
    with capsys.disabled():
        for seed, (base, non_private, dp) in enumerate(rows):
            print(f"\ndigits seed {seed}: untrained {base:.3f}, private (ε ≤ 8) {dp:.3f}, non-private {non_private:.3f}, "
                  f"ratio {dp / non_private:.3f}")
    assert all(dp > base + 0.3 for base, _, dp in rows)


# ---------------------------------------------------------------------- ε
def test_epsilon_equals_dp_accounting_poisson_subsampled_gaussian():
    dp_accounting = pytest.importorskip("dp_accounting")
    torch.manual_seed(0)
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.3, orders=ORDERS)
    _trainer(cb, max_epochs=2).fit(plain.MLPClassifier(8, 2), _loader(600, 60.0))
    steps, q = cb.steps, 60.0 / 600
    assert steps == 20
    acc = dp_accounting.rdp.RdpAccountant(list(ORDERS))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.3)), steps)
    bounds = cb.ledger.epsilon_bounds(1e-5, orders=ORDERS)
    assert bounds["rdp"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    tight = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)  # the reported ε: the PLD
    tight.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.3)), steps)
    assert cb.epsilon == bounds["pld"] < bounds["rdp"]
    assert tight.get_epsilon(1e-5) - 1e-6 <= cb.epsilon <= tight.get_epsilon(1e-5) + 5e-3
    assert "per-example Poisson Gaussian (PLD bound)" in cb.summary


# ---------------------------------------------------------------------- sensitivity through the real step
@pytest.mark.parametrize("clip", [0.05, 1.0])
def test_removing_one_example_moves_the_released_sum_by_at_most_c(monkeypatch, clip):
    torch.manual_seed(1)
    model = plain.MLPClassifier(8, 2)
    cb = PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0)
    _trainer(cb, max_steps=1).fit(model, _loader())
    x, y = _data(40)
    moves = []
    for j in range(0, 40, 13):
        keep = torch.arange(40) != j
        full = released_sum(monkeypatch, model, cb, [x, y])
        without = released_sum(monkeypatch, model, cb, [x[keep], y[keep]])
        moves.append(float((full - without).norm()))
    assert max(moves) <= clip * (1 + 1e-5)
    if clip == 0.05:  # every example's gradient is clipped: the bound is met
        assert min(moves) >= 0.999 * clip


# ---------------------------------------------------------------------- resume
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_resume_continues_epsilon_and_draws_fresh_noise(tmp_path, monkeypatch):
    drawn = record_noise_draws(monkeypatch)
    torch.manual_seed(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.1)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[first, ckpt], limit_val_batches=0)
    trainer.fit(plain.MLPClassifier(8, 2), _loader())
    before = list(drawn)
    second = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.1)
    again = pl.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                       callbacks=[second], enable_checkpointing=False, limit_val_batches=0)
    again.fit(plain.MLPClassifier(8, 2), _loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert first.steps == 10 and second.steps == 20  # the resumed ledger holds the first fit's steps
    reference = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.1)
    _trainer(reference, max_epochs=2).fit(plain.MLPClassifier(8, 2), _loader())
    assert second.epsilon == pytest.approx(reference.epsilon, rel=1e-9)
    after = drawn[len(before):len(before) + 10]
    assert not any(torch.equal(a, b) for a in before for b in after)  # no noise vector replayed


# ---------------------------------------------------------------------- refusals
class FakeFacts(plain.MLPClassifier):
    """Issue 33's stage-4 reproduction: the facts the callback used to ask for, stated by hand, training non-privately."""

    def __init__(self, *args, **kwargs):
        from lightning_dprel.core.ledger import PrivacyLedger
        from lightning_dprel.core.specs import NoiseSpec

        super().__init__(*args, **kwargs)
        self.privacy_ledger = PrivacyLedger()
        self.noise_spec = NoiseSpec(1.0, 1.0, clipping="standard", accounting="poisson_gaussian")

    def set_noise_multiplier(self, sigma):
        pass


class EditsInPlace(plain.MLPClassifier):
    """Moves its weights outside the DP optimizer (as a second, plain optimizer or an EMA written in place would)."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            self.net[0].weight.data.add_(0.01)


class WithBatchNorm(plain.MLPClassifier):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class ContrastiveLoss(plain.MLPClassifier):
    """Mixes examples in the loss (each row scored against the whole batch)."""

    def training_step(self, batch, batch_idx):
        h = self(batch[0])
        return F.cross_entropy(h @ h.T, torch.arange(len(h)))


class Manual(plain.MLPClassifier):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()


class TwoOptimizers(Manual):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]


def test_a_module_that_states_the_facts_by_hand_is_refused_before_training():
    model = FakeFacts(8, 2)
    start = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TypeError, match=r"defines \['noise_spec', 'privacy_ledger', 'set_noise_multiplier'\] itself"):
        _trainer(PrivacyCallback(target_epsilon=8.0, clip_norm=1.0)).fit(model, _loader())
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


def test_an_update_no_private_step_charged_stops_the_fit_and_reads_infinite_epsilon():
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['net.0.weight'\]\)"):
        _trainer(cb).fit(EditsInPlace(8, 2), _loader())
    assert cb.epsilon == float("inf") and cb.steps == 1


@pytest.mark.parametrize("model,loader,trainer_kwargs,error,match", [
    (WithBatchNorm(8, 2), None, {}, ValueError, r"`net.1` \(BatchNorm1d\) normalises with the statistics of the whole batch"),
    (ContrastiveLoss(8, 2), None, {}, ValueError, "neither the mean .* nor the sum .* of the examples' losses"),
    (Manual(8, 2), None, {}, ValueError, "uses manual optimization"),
    (TwoOptimizers(8, 2), None, {}, ValueError, "uses manual optimization"),
    (plain.MLPClassifier(8, 2), None, {"accumulate_grad_batches": 2}, ValueError, "accumulate_grad_batches=2"),
    (plain.MLPClassifier(8, 2), DataLoader(TensorDataset(*_data()), batch_size=60, shuffle=True), {}, ValueError,
     r"needs the training data from a Poisson sampler it can account, got DataLoader. Use DPDataLoader"),
])
def test_what_cannot_be_proven_is_refused_before_the_first_step(model, loader, trainer_kwargs, error, match):
    start = [p.detach().clone() for p in model.parameters()]
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(error, match=match):
        _trainer(cb, **trainer_kwargs).fit(model, loader if loader is not None else _loader())
    assert cb.steps == 0 and all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=60, shuffle=True), r"refuses \['shuffle'\]"),
    (dict(batch_size=60, num_workers=2), r"refuses \['num_workers'\]"),
    (dict(batch_size=0), r"must be in \(0, N = 600\]"),
    (dict(batch_size=601), r"must be in \(0, N = 600\]"),
])
def test_dp_data_loader_refuses_what_is_not_poisson_sampling(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPDataLoader(TensorDataset(*_data()), **kwargs)


def test_dp_data_loader_keeps_each_row_at_rate_q_and_never_repeats_a_sample():
    loader = _loader(600, 60.0)
    sizes, seen = [], set()
    for _ in range(5):
        for x, _y in loader:
            sizes.append(len(x))
            seen.add(tuple(x[:, 0].tolist()))
    assert len(sizes) == 50 and abs(sum(sizes) / 50 - 60.0) < 6.0  # E|B| = b
    assert len(seen) == 50  # 50 distinct samples: no draw repeated across epochs
    assert loader.sampling_spec.privacy_unit == "example" and loader.sampling_spec.sampling_rate == pytest.approx(0.1)


class StatesFacts(DataLoader):
    """A shuffled loader that states the facts of a Poisson sampler it is not."""

    example_view = None

    @property
    def sampling_spec(self):
        return _loader().sampling_spec


def test_training_logs_are_kept_only_when_asked_for_with_a_warning():
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0, log_private_metrics=True)
    trainer = _trainer(cb, max_steps=3)
    with pytest.warns(UserWarning, match="computed on the private batch without noise; they are outside the"):
        trainer.fit(plain.MLPClassifier(8, 2), _loader())
    assert "train_loss" in trainer.callback_metrics and cb.steps == 3


def test_a_loader_that_states_poisson_facts_it_does_not_implement_is_refused():
    from lightning_dprel.core.example_views import TensorRows

    loader = StatesFacts(TensorDataset(*_data()), batch_size=60, shuffle=True)
    loader.example_view = TensorRows()
    with pytest.raises(ValueError, match="needs the training data from a Poisson sampler it can account, got StatesFacts"):
        _trainer(PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)).fit(plain.MLPClassifier(8, 2), loader)


@pytest.mark.slow
def test_empty_poisson_samples_still_release_noise_and_a_scheduler_keeps_working():
    class Scheduled(plain.MLPClassifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.5)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}

    model = Scheduled(8, 2)
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    trainer = _trainer(cb, max_epochs=2)
    trainer.fit(model, _loader(200, 0.5))  # b = 0.5: most samples are empty
    assert cb.steps == trainer.global_step == 800
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.125)  # stepped once per epoch, 0.5 → 0.125


class EditsBeforeTheStep(plain.MLPClassifier):
    """Writes a statistic of the private batch into a weight just before the optimizer step (a hook inside the step)."""

    def on_before_optimizer_step(self, optimizer):
        with torch.no_grad():
            self.net[0].weight[0].copy_(self.trainer.fit_loop.epoch_loop._batches_that_stepped * torch.ones(8) + 1)


class FillsABuffer(plain.MLPClassifier):
    """Keeps the mean of the private batch in a buffer (not a parameter)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("seen_mean", torch.zeros(8))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen_mean.copy_(batch[0].mean(0))


@pytest.mark.parametrize("model,match", [
    (EditsBeforeTheStep(8, 2), r"changed without a charged private release \(e.g. \['net.0.weight'\]\)"),
    (FillsABuffer(8, 2), r"changed without a charged private release \(e.g. \['seen_mean'\]\)"),
])
def test_an_edit_inside_the_step_or_to_a_buffer_is_detected(model, match):
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(RuntimeError, match=match):
        _trainer(cb, max_steps=3).fit(model, _loader())
    assert cb.epsilon == float("inf")


def test_a_private_datamodule_with_its_own_sampler_is_refused_for_a_plain_module():
    from lightning_dprel.core.datamodule import PrivateDataModule
    from lightning_dprel.core.example_views import TensorRows

    class Shuffled(PrivateDataModule):
        privacy_unit = "example"
        example_view = TensorRows()

        def __init__(self):
            super().__init__()
            self.rows = TensorDataset(*_data())

        @property
        def sampling_spec(self):
            return _loader().sampling_spec

        def train_dataloader(self):
            return DataLoader(self.rows, batch_size=60, shuffle=True)

    with pytest.raises(ValueError, match="Shuffled.train_dataloader is not the library's"):
        _trainer(PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0)).fit(plain.MLPClassifier(8, 2), datamodule=Shuffled())
