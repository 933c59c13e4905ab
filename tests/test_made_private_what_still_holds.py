"""A plain LightningModule trained on a DPDataLoader under PrivacyCallback (C = 1, δ = 1e-5, a few steps): what still
holds. Post-processing of released iterates (a weight average, an EMA kept aside), dropout, a stateful optimizer, a sum
loss and a layer outside the optimizer unfrozen mid-fit end with a finite ε; what the per-example path cannot bound is
refused before the first release; an un-noised write into the weights, or data kept on the module, reads ε = ∞ (also
when the fit fails afterwards). The averaging callbacks give the same ε in either order (the privacy callback runs
first).
"""

from __future__ import annotations

import copy
import random

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import BaseFinetuning, EMAWeightAveraging, StochasticWeightAveraging
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback
from test_made_private_adversarial import MLP  # the same small classifier

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings(r"ignore:.*(KeyedStream|DPDataLoader)\(.*seed"),
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings("ignore:.*module.*in eval mode"),
    pytest.mark.filterwarnings("ignore:.*SWA"),
    pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad=True"),  # checkpoint under no_grad
]

X = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()
INF = float("inf")


def _loader(b=20.0):
    return DPDataLoader(TensorDataset(X, Y), batch_size=b, seed=0)


def _callback(**kwargs):
    return PrivacyCallback(**{"delta": 1e-5, "clip_norm": 1.0, "noise_multiplier": 1.0, **kwargs})


def _fit(model, cb, *, before=(), after=(), b=20.0, **trainer_kwargs):
    """Fit ``model`` with ``before`` callbacks, then the privacy callback, then ``after``."""
    opts = dict(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    pl.Trainer(callbacks=[*before, cb, *after], **{**opts, **trainer_kwargs}).fit(model, _loader(b))


def _epochs(n):  # 2 steps an epoch (b = 100 of N = 200): for callbacks that act per epoch
    return dict(max_steps=-1, max_epochs=n, b=100.0)


def _state(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _unchanged(model, start):
    return all(torch.equal(t, start[n]) for n, t in model.state_dict().items())


def _finite(cb, steps):
    assert 0 < cb.epsilon < INF and cb.steps == steps


class Iterates(pl.Callback):
    """Records the weights at each epoch start and at train end (placed before an averaging callback)."""

    def __init__(self):
        self.epoch_starts, self.last = [], None

    def on_train_epoch_start(self, trainer, pl_module):
        self.epoch_starts.append([p.detach().clone() for p in pl_module.parameters()])

    def on_train_end(self, trainer, pl_module):
        self.last = [p.detach().clone() for p in pl_module.parameters()]


# ====================================================================== finite ε
def test_swa_after_the_privacy_callback_averages_released_iterates_with_finite_epsilon():
    """SWA's average of the iterates at the start of epochs 1 and 2 is post-processing: ε stays finite."""
    model, seen = MLP(), Iterates()
    cb = _callback()
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)  # 1-based: averages from epoch index 1
    _fit(model, cb, after=(seen, swa), **_epochs(3))
    _finite(cb, 6)
    average = [(a + b) / 2 for a, b in zip(seen.epoch_starts[1], seen.epoch_starts[2])]
    assert all(torch.allclose(p, a) for p, a in zip(model.parameters(), average))
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), seen.last))  # the average, not the last iterate


def test_an_ema_weight_average_after_the_privacy_callback_ends_with_finite_epsilon():
    """Lightning's EMAWeightAveraging (kept aside, copied in at train end) is post-processing: ε stays finite."""
    model, seen, ema = MLP(), Iterates(), EMAWeightAveraging(decay=0.5)
    cb = _callback()
    _fit(model, cb, after=(seen, ema))
    _finite(cb, 3)
    assert all(torch.equal(p, a) for p, a in zip(model.parameters(), ema._average_model.module.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), seen.last))


@pytest.mark.parametrize("averaging,kwargs", [
    (lambda: StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1), _epochs(2)),
    (lambda: EMAWeightAveraging(decay=0.5), {}),
], ids=["StochasticWeightAveraging", "EMAWeightAveraging"])
def test_a_weight_average_listed_before_the_privacy_callback_also_ends_with_finite_epsilon(averaging, kwargs):
    """The order of the callbacks does not change what a weight average of released iterates costs."""
    cb = _callback()
    _fit(MLP(), cb, before=(averaging(),), **kwargs)
    assert 0 < cb.epsilon < INF


class EMAOnCallback(pl.Callback):
    """An EMA of the released weights kept on a callback (a dict of tensors, or a deep-copied module), never written back."""

    def __init__(self, as_module):
        self.as_module, self.ema = as_module, None

    def _pairs(self, pl_module):
        if self.as_module:
            return zip(self.ema.parameters(), pl_module.net.parameters())
        return ((self.ema[n], p) for n, p in pl_module.named_parameters())

    def on_train_start(self, trainer, pl_module):
        self.ema = copy.deepcopy(pl_module.net) if self.as_module else {
            n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            for e, p in self._pairs(pl_module):
                e.mul_(0.5).add_(0.5 * p)


@pytest.mark.parametrize("as_module", [False, True], ids=["dict-on-callback", "deepcopy-on-callback"])
def test_an_ema_of_the_weights_kept_aside_ends_with_finite_epsilon(as_module):
    """An EMA of the released weights held outside the module, never written back, is post-processing."""
    model, ema = MLP(), EMAOnCallback(as_module)
    cb = _callback()
    _fit(model, cb, after=(ema,))
    _finite(cb, 3)
    assert not all(torch.equal(e, p) for e, p in ema._pairs(model))  # it really averaged


class EMAOnModule(MLP):
    """An EMA of the weights kept in a plain dict on the module itself (never written into the weights)."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            old = getattr(self, "ema", None)
            self.ema = {n: p.detach().clone() if old is None else 0.5 * old[n] + 0.5 * p.detach()
                        for n, p in self.named_parameters()}


def test_an_ema_of_the_weights_in_a_dict_on_the_module_is_declared_with_public_update_or_reads_infinite_epsilon():
    """An EMA of released weights kept on the module is post-processing, but the watch cannot tell it from a batch
    statistic kept there: undeclared it stops the fit (ε = ∞, named); inside ``public_update(self)`` it is kept."""
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"\(e.g. \['ema'\]\).*plain attributes .*declared with public_update"):
        _fit(EMAOnModule(), cb)
    assert cb.epsilon == INF and cb.steps == 1
    cb, model = _callback(), DeclaredEMAOnModule()
    _fit(model, cb)
    _finite(cb, 3)
    assert set(model.ema) == {n for n, _ in model.named_parameters()}


class DeclaredEMAOnModule(EMAOnModule):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        from lightning_dprel.callbacks import public_update

        with public_update(self):  # reads released weights only
            super().on_train_batch_end(outputs, batch, batch_idx)


class WithDropout(MLP):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))


class WithFrozenBatchNorm(MLP):
    """BatchNorm frozen in eval mode (running statistics fixed, affine parameters not trained)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
        self.net[1].requires_grad_(False).eval()

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


class SumTimesTen(MLP):
    def training_step(self, batch, batch_idx):
        return 10 * F.cross_entropy(self.net(batch[0]), batch[1], reduction="sum")


@pytest.mark.parametrize("model", [WithDropout(), WithFrozenBatchNorm(), SumTimesTen()],
                         ids=["dropout", "batchnorm-frozen-in-eval", "10x-sum-loss"])
def test_dropout_a_frozen_eval_batchnorm_and_a_scaled_sum_loss_end_with_finite_epsilon(model):
    """Each example's loss depends on it alone (the ×10 sum too: each gradient is clipped to C whatever its scale)."""
    cb = _callback()
    _fit(model, cb)
    _finite(cb, 3)
    if isinstance(model, WithFrozenBatchNorm):
        bn = model.net[1]
        assert not bn.training and bn.num_batches_tracked == 0 and torch.equal(bn.running_mean, torch.zeros(16))


@pytest.mark.parametrize("make,state_key", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "momentum_buffer"),
    (lambda ps: torch.optim.Adam(ps, lr=1e-2), "exp_avg"),
], ids=["sgd-momentum", "adam"])
def test_an_optimizer_with_state_steps_on_the_noised_gradient_with_finite_epsilon(make, state_key):
    """Momentum / Adam moments are built from the noised gradients only (post-processing)."""

    class Stateful(MLP):
        def configure_optimizers(self):
            self.opt = make(self.parameters())
            return self.opt

    model = Stateful()
    cb = _callback()
    _fit(model, cb)
    _finite(cb, 3)
    assert all(state_key in model.opt.state[p] for p in model.parameters())


class UnfreezesALayerOutsideTheOptimizer(MLP):
    """The first layer is frozen and left out of the optimizer; a hook sets requires_grad=True on it mid-fit."""

    def __init__(self):
        super().__init__()
        self.net[0].requires_grad_(False)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 1:
            self.net[0].requires_grad_(True)


def test_a_layer_outside_the_optimizer_unfrozen_mid_fit_stays_untrained_with_finite_epsilon():
    """Only the optimizer's parameters are released and stepped; the unfrozen layer (no optimizer) never moves."""
    model = UnfreezesALayerOutsideTheOptimizer()
    start = _state(model)
    cb = _callback()
    _fit(model, cb)
    _finite(cb, 3)
    assert model.net[0].weight.requires_grad
    assert torch.equal(model.net[0].weight, start["net.0.weight"]) and torch.equal(model.net[0].bias, start["net.0.bias"])
    assert not torch.equal(model.net[2].weight, start["net.2.weight"])


class Unfreeze(BaseFinetuning):
    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.net[0])

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.net[0], optimizer)


class TrainsWhatRequiresGrad(MLP):
    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def test_lightning_base_finetuning_unfreezing_a_layer_mid_fit_ends_with_finite_epsilon():
    """BaseFinetuning (freeze, then unfreeze_and_add_param_group at epoch 1): every step is a charged release."""
    cb = _callback()
    _fit(TrainsWhatRequiresGrad(), cb, after=(Unfreeze(),), **_epochs(2))
    _finite(cb, 4)


class LayerRunARandomNumberOfTimes(MLP):
    def __init__(self):
        super().__init__()
        self.inp, self.square, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        h = torch.relu(self.inp(batch[0]))
        if random.random() < 0.5:
            h = self.square(h)
        return F.cross_entropy(self.out(h), batch[1])


def test_a_linear_layer_run_a_random_number_of_times_ends_with_finite_epsilon():
    """A Linear applied or skipped at random in training_step: each example's gradient is still its own."""
    random.seed(0)
    cb = _callback()
    _fit(LayerRunARandomNumberOfTimes(), cb)
    _finite(cb, 3)


# ====================================================================== refused before the first release
class Mixup(MLP):
    def training_step(self, batch, batch_idx):
        x, y = batch
        perm, lam = torch.randperm(len(x)), 0.7
        out = self.net(lam * x + (1 - lam) * x[perm])
        return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])


class ManualBackwardInAutomatic(MLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        return loss


class LBFGS(MLP):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.1)


class NoneOnFirstBatch(MLP):
    def training_step(self, batch, batch_idx):
        return None if batch_idx == 0 else super().training_step(batch, batch_idx)


class AlwaysNone(MLP):
    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)


@pytest.mark.parametrize("model,error,match", [
    (Mixup(), ValueError, r"is neither the mean \([0-9.]+\) nor the sum \([0-9.]+\) of the examples' losses"),
    (ManualBackwardInAutomatic(), MisconfigurationException, r"to use manual_backward, please disable automatic"),
    (LBFGS(), TypeError, r"LBFGS.step\(\) missing 1 required positional argument: 'closure'"),
    (NoneOnFirstBatch(), ValueError, r"returning None to skip a batch is refused \(skipping reveals the sample\)"),
    (AlwaysNone(), ValueError, r"must return its loss: a scalar tensor or a dict with a scalar 'loss' \(got NoneType\)"),
], ids=["mixup", "manual_backward", "LBFGS", "None-on-one-batch", "always-None"])
def test_a_step_mixing_examples_or_outside_one_noised_step_is_refused_before_any_release(model, error, match):
    """Refused with the cause named, before any release: no step charged, no parameter moved."""
    start = _state(model)
    cb = _callback()
    with pytest.raises(error, match=match):
        _fit(model, cb)
    assert cb.steps == 0 and _unchanged(model, start)


class CachesTheBatch(MLP):
    def training_step(self, batch, batch_idx):
        self._last = batch
        return super().training_step(batch, batch_idx)


class KeepsATensorOfTheBatch(MLP):
    def training_step(self, batch, batch_idx):
        self.seen = batch[0].detach()
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("model,name", [(CachesTheBatch(), "_last"), (KeepsATensorOfTheBatch(), "seen")],
                         ids=["self._last = batch", "self.seen = batch[0]"])
def test_the_batch_kept_on_the_module_in_training_step_stops_the_fit_before_any_release(model, name):
    """A private batch cached on ``self`` is a release no noise covers: ε = ∞, the attribute named, nothing stepped."""
    start = _state(model)
    cb = _callback()
    with pytest.raises(RuntimeError, match=rf"changed without a charged private release \(e.g. \['{name}'.*plain attributes"):
        _fit(model, cb)
    assert cb.epsilon == INF and cb.steps == 0 and _unchanged(model, start)


class TrainsASecondModelInTheStep(MLP):
    """A second nn.Module trained by its own torch.optim step inside training_step."""

    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(8, 2)
        self.aux_opt = torch.optim.SGD(self.aux.parameters(), lr=0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.aux_opt.zero_grad()
        F.cross_entropy(self.aux(x), y).backward()
        self.aux_opt.step()
        return super().training_step(batch, batch_idx)


class Checkpointed(MLP):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def training_step(self, batch, batch_idx):
        h = checkpoint(self.net[0], batch[0], use_reentrant=self.reentrant)
        return F.cross_entropy(self.net[2](torch.relu(h)), batch[1])


@pytest.mark.parametrize("model", [TrainsASecondModelInTheStep(), Checkpointed(False), Checkpointed(True)],
                         ids=["second-model-optimized-in-step", "checkpoint", "checkpoint-reentrant"])
def test_a_second_model_or_gradient_checkpointing_in_the_step_is_stopped_before_any_release(model):
    """Nothing is released or moved, and the error names what cannot run on one example alone."""
    start = _state(model)
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"training_step failed when run (on one example alone|on the batch and on each "
                                           r"example).*\(a second model trained inside the step\), gradient checkpointing"):
        _fit(model, cb)
    assert cb.steps == 0 and _unchanged(model, start)


class TrainsASecondModelWithGradEnabled(TrainsASecondModelInTheStep):
    """The same, with the aux update under ``torch.enable_grad()``: the reduction check's full-batch run moves it."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.enable_grad():
            self.aux_opt.zero_grad()
            F.cross_entropy(self.aux(x), y).backward()
            self.aux_opt.step()
        return MLP.training_step(self, batch, batch_idx)


class FillsABufferInTheStep(MLP):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(8))

    def training_step(self, batch, batch_idx):
        self.seen.copy_(batch[0].mean(0))
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("model,moved", [(TrainsASecondModelWithGradEnabled(), "aux"), (FillsABufferInTheStep(), "seen")],
                         ids=["second-model-under-enable_grad", "buffer-copy_-in-step"])
def test_a_step_that_fails_after_moving_module_state_reads_infinite_epsilon(model, moved):
    """The step fails, but the module's state already holds private data: the ledger reads ε = ∞, not 0."""
    cb = _callback()
    with pytest.raises(RuntimeError):
        _fit(model, cb)
    assert cb.steps == 0 and cb.epsilon == INF
    assert cb.ledger.unprotected_steps == 1 and any(n.startswith(moved) for n in dict(model.named_buffers()) | dict(
        model.named_parameters()))


def test_swa_with_a_batchnorm_frozen_in_eval_is_refused_before_any_release():
    """SWA's last epoch recomputes BatchNorm statistics from the private batches, frozen or not."""
    model, cb = WithFrozenBatchNorm(), _callback()
    start = _state(model)
    with pytest.raises(ValueError, match=r"StochasticWeightAveraging recomputes the running statistics of `net.1`"):
        _fit(model, cb, after=(StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1),), **_epochs(2))
    assert cb.steps == 0 and _unchanged(model, start)


@pytest.mark.parametrize("seeds", [(0, 0), (0, 11)], ids=["same-samples", "different-samples"])
def test_two_training_loaders_are_refused_before_any_release(seeds):
    """Lightning joins two loaders' batches into one step: not one Poisson sample of one dataset."""
    model, cb = MLP(), _callback()
    start = _state(model)
    loaders = [DPDataLoader(TensorDataset(X, Y), batch_size=20.0, seed=s) for s in seeds]
    with pytest.raises(ValueError, match=r"PrivacyCallback got 2 training loaders"):
        pl.Trainer(callbacks=[cb], max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False).fit(model, loaders)
    assert cb.steps == 0 and _unchanged(model, start)


# ====================================================================== ε = ∞, the cause named
class EMAWrittenIntoTheWeights(pl.Callback):
    """An EMA shadow held on a callback and copied into the weights at every batch end."""

    def on_train_start(self, trainer, pl_module):
        self.shadow = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            for s, p in zip(self.shadow, pl_module.parameters()):
                s.mul_(0.5).add_(0.5 * p)
                p.copy_(s)


def test_an_ema_written_into_the_weights_at_batch_end_reads_infinite_epsilon():
    """Writing the EMA into the weights is an update no release charged: caught at the next batch start."""
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['net.0.weight'"):
        _fit(MLP(), cb, after=(EMAWrittenIntoTheWeights(),))
    assert cb.epsilon == INF and cb.steps == 1


class EditsAtEpochEnd(MLP):
    def on_train_epoch_end(self):
        with torch.no_grad():
            self.net[0].weight.mul_(0.5)


@pytest.mark.parametrize("epochs", [1, 2], ids=["last-epoch:caught-at-train-end", "mid-fit:caught-at-next-batch"])
def test_a_no_grad_edit_at_epoch_end_reads_infinite_epsilon(epochs):
    """An on_train_epoch_end edit under no_grad is caught at the next batch start or at train end."""
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['net.0.weight'\]\)"):
        _fit(EditsAtEpochEnd(), cb, **_epochs(epochs))
    assert cb.epsilon == INF and cb.steps == 2


class ReassignsABufferFromTheData(MLP):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen_mean", torch.zeros(8))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen_mean = batch[0].mean(0)  # a new tensor in the buffer's slot (not copy_)


def test_a_buffer_reassigned_from_the_data_reads_infinite_epsilon():
    """A registered buffer set to a statistic of the private batch is a release no noise covers."""
    cb = _callback()
    with pytest.raises(RuntimeError, match=r"changed without a charged private release \(e.g. \['seen_mean'\]\)"):
        _fit(ReassignsABufferFromTheData(), cb)
    assert cb.epsilon == INF
