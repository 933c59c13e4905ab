"""Ghost norms for a user's step with each example alone (grad_sample/user_taps.py) equal the formed per-example
gradients of the vmap path: the norms and every re-weighted sum, for rows, sequences, a layer run twice (its gradient
is formed instead), attention whose projection is not called as a module, and frozen parameters."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.grad_sample.user_step import user_step_grads
from lightning_dprel.grad_sample.user_taps import tapped_layers, user_step_tapped_grads

pytestmark = pytest.mark.filterwarnings("ignore:.*(self.log|batching rule|enable_nested_tensor).*")


class Step(pl.LightningModule):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "rows":
            self.net = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))
        elif kind == "sequence":
            self.net = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
        elif kind == "shared":
            self.a, self.head = nn.Linear(4, 4), nn.Linear(4, 3)
        else:
            self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.head = nn.Linear(16, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.kind == "rows":
            h = self.net(x)
        elif self.kind == "sequence":
            h = self.net(x).mean(1)
        elif self.kind == "shared":
            h = self.head(self.a(torch.relu(self.a(x))))
        else:
            h = self.head(self.enc(x).mean(1))
        loss = F.cross_entropy(h, y)
        self.log("loss", loss)
        return loss


INPUTS = {"rows": (4,), "sequence": (5, 6), "shared": (4,), "attention": (5, 16)}
TAPPED = {"rows": ["net.0", "net.3"], "sequence": ["net.0", "net.2"], "shared": ["head"],
          "attention": ["enc.linear1", "enc.linear2", "head"]}


@pytest.mark.parametrize("kind", list(INPUTS))
def test_tapped_norms_and_sums_equal_the_formed_gradients(kind):
    torch.manual_seed(0)
    module = Step(kind)
    batch = [torch.randn(7, *INPUTS[kind]), torch.randint(0, 3, (7,))]
    params = dict(module.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        formed = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
        tapped = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params,
                                        tapped_layers(module, params))
    assert sorted(tapped.grads.rows) == TAPPED[kind]  # the others' gradients were formed
    torch.testing.assert_close(tapped.grads.norms(), formed.grads.norms(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tapped.losses, formed.losses)
    for factors in (torch.rand(7), torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.0])):
        want, got = formed.grads.weighted_sum(factors), tapped.grads.weighted_sum(factors)
        assert set(got) == set(want) == set(params)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-5)


def test_frozen_parameters_are_left_out_and_a_layer_with_nothing_to_train_is_not_tapped():
    module = Step("rows")
    module.net[0].requires_grad_(False)
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    layers = tapped_layers(module, params)
    assert list(layers) == ["net.3"]
    batch = [torch.randn(5, 4), torch.randint(0, 3, (5,))]
    tapped = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params, layers)
    formed = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
    assert set(tapped.grads.shapes()) == set(params)
    torch.testing.assert_close(tapped.grads.norms(), formed.grads.norms(), atol=1e-5, rtol=1e-5)


def _assert_same(tapped, formed, size):
    torch.testing.assert_close(tapped.grads.norms(), formed.grads.norms(), atol=1e-5, rtol=1e-5)
    factors = torch.rand(size)
    want, got = formed.grads.weighted_sum(factors), tapped.grads.weighted_sum(factors)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-5)


def test_the_taps_kept_across_steps_are_taken_again_when_an_output_changes_shape():
    """The tapped layers' outputs of one example are kept from step to step (no dry run each step); a batch whose
    outputs have another shape (one token, then five: a kept tap would broadcast) is tapped anew, still exact."""
    torch.manual_seed(0)
    module = Step("sequence")
    params = dict(module.named_parameters())
    layers, kept = tapped_layers(module, params), {}
    for length in (1, 1, 5, 3, 3):
        batch = [torch.randn(6, length, 6), torch.randint(0, 3, (6,))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tapped = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params, layers, kept)
            formed = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
        assert sorted(tapped.grads.rows) == TAPPED["sequence"]
        assert {n: tuple(t.shape) for n, t in kept.items()} == {"net.0": (1, length, 8), "net.2": (1, length, 3)}
        _assert_same(tapped, formed, 6)
        assert all(p is params[n] for n, p in module.named_parameters())  # the rerun left the module its parameters
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def test_a_kept_tap_never_changes_the_dtype_of_a_layer_output():
    """A float32 tap kept from a float32 step is not added to a float64 output (that would cast it): tapped anew."""
    torch.manual_seed(0)
    module = Step("rows")
    params = dict(module.named_parameters())
    layers, kept = tapped_layers(module, params), {}
    batch = [torch.randn(5, 4), torch.randint(0, 3, (5,))]
    user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params, layers, kept)
    module.double()
    params = dict(module.named_parameters())
    batch = [batch[0].double(), batch[1]]
    tapped = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params, layers, kept)
    formed = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
    assert all(t.dtype == torch.float64 for t in kept.values())
    assert all(p is params[n] for n, p in module.named_parameters()) and not any(m._forward_hooks for m in module.modules())
    assert tapped.losses.dtype == torch.float64
    _assert_same(tapped, formed, 5)


class Tokens(pl.LightningModule):
    """Token ids → embedding (a padding row, repeated tokens) → mean → linear: the embedding is tapped too."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 6, padding_idx=0), nn.Linear(6, 3)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.cross_entropy(self.head(self.embed(ids).mean(1)), y)


def test_an_embedding_in_a_users_step_is_tapped_and_exact():
    torch.manual_seed(0)
    module = Tokens()
    ids = torch.randint(0, 11, (7, 9))
    ids[:, :3] = torch.tensor([0, 4, 4])  # padding and a repeated token in every example
    batch = [ids, torch.randint(0, 3, (7,))]
    params = dict(module.named_parameters())
    tapped = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params,
                                    tapped_layers(module, params))
    formed = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
    assert sorted(tapped.grads.rows) == ["embed", "head"] and not tapped.grads.formed
    _assert_same(tapped, formed, 7)


@pytest.mark.parametrize("rows, d_in, d_out, formed", [
    (1, 64, 256, False),     # one row per example: ‖a‖²‖g‖², nothing formed
    (32, 64, 256, True),     # the ghost norm's L²(d_in + d_out) costs more than forming, G_i ≈ 1.6× (a, g)
    (4, 768, 3072, False),   # the ghost norm is cheaper
    (45, 1024, 1024, False),  # forming would cost less time but 11× the memory of (a, g)
    (128, 16, 16, True),     # 2L² ≥ d_in·d_out (the memory rule of mixed ghost clipping)
])
def test_mixed_ghost_clipping_forms_a_layers_gradients_where_that_is_cheaper(rows, d_in, d_out, formed):
    from lightning_dprel.grad_sample.layers import Outer

    assert Outer(torch.zeros(2, rows, d_in), torch.zeros(2, rows, d_out)).cheaper_formed() is formed
    assert not Outer(torch.zeros(2, rows, dtype=torch.long), torch.zeros(2, rows, d_out)).cheaper_formed()  # ids: kept


class RowsDoubledUnderGrad(pl.LightningModule):
    """A step whose first layer's output differs between the dry run (no grad) and the traced run: its tap never fits."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(4, 5), nn.Linear(5, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if torch.is_grad_enabled():
            x = torch.cat([x, x], 0)  # two rows under grad, one in the dry run
        return F.cross_entropy(self.head(torch.tanh(self.a(x))).mean(0, keepdim=True), y)


def test_a_tap_that_misfits_right_after_its_dry_run_gives_way_to_the_formed_route():
    """No rerun loop: the caller forms the gradients (None), and the module keeps its own parameters."""
    torch.manual_seed(0)
    module = RowsDoubledUnderGrad()
    params = dict(module.named_parameters())
    batch = [torch.randn(5, 4), torch.randint(0, 3, (5,))]
    kept = {}
    assert user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params,
                                  tapped_layers(module, params), kept) is None
    assert kept == {} and all(p is params[n] for n, p in module.named_parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())
