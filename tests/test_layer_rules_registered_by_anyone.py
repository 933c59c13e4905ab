"""One registry of per-layer ghost rules (grad_sample/layers.py) serves the tuple path and the
user-step path: a layer type a user registers is tapped by both, with the same norms and clipped
sums as the formed gradients; unregistered, its parameters take the formed (vmap) route."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.grad_sample import layers
from lightning_dprel.grad_sample.base import MaterializedGrads, trainable_parameters
from lightning_dprel.grad_sample.dispatch import GradSampler
from lightning_dprel.grad_sample.ghost import GhostGrads, ghost_grads, ghost_plan
from lightning_dprel.grad_sample.layers import Outer, register_layer_rule
from lightning_dprel.grad_sample.user_step import user_step_grads
from lightning_dprel.grad_sample.user_taps import tapped_layers, user_step_tapped_grads

pytestmark = pytest.mark.filterwarnings("ignore:.*(self.log|batching rule).*")
B, K, D = 5, 2, 4


class ScaledProjection(nn.Module):
    """A layer of the user's own: h = (x Wᵀ) ⊙ s."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in**0.5)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(d_out))

    def forward(self, x):
        return (x @ self.weight.t()) * self.scale


def scaled_projection_pieces(m: ScaledProjection, x, g):
    """Its pieces from input x and output gradient g: an outer product for W, s formed."""
    a, gb = x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
    return {
        "weight": Outer(a, gb * m.scale.detach()),
        "scale": (gb * (a @ m.weight.detach().t())).sum(1),
    }


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test."""
    monkeypatch.setattr(layers, "_RULES", dict(layers._RULES))


class Encoder(nn.Module):
    ghost_safe = True  # row-wise, each layer called once

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = ScaledProjection(D, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.proj(x)))


def _head(h):
    return h.pow(2).sum((-2, -1)) + h[..., 0, :].sum(-1)


def _tuples():
    torch.manual_seed(0)
    return Encoder().double(), {"x": torch.randn(B, 2 + K, D, dtype=torch.float64)}


def _assert_same(got, want):
    torch.testing.assert_close(got.norms().double(), want.norms().double(), rtol=1e-9, atol=1e-12)
    factors = torch.tensor([1.0, 0.0, 0.5, 0.3, 1.0], dtype=torch.float64)
    a, b = got.weighted_sum(factors), want.weighted_sum(factors)
    assert set(a) == set(b)
    for name in b:
        torch.testing.assert_close(a[name].double(), b[name].double(), rtol=1e-9, atol=1e-12)


def test_an_unregistered_layer_falls_back_to_the_formed_route(registry):
    enc, inputs = _tuples()
    plan = ghost_plan(enc)
    assert (
        set(plan.fallback) == {"proj.weight", "proj.scale"}
        and set(plan.modules) == {"out"}
        and not plan.exact
    )
    auto = GradSampler("auto", None).tuples(enc, inputs, _head)
    assert isinstance(auto.grads, MaterializedGrads)  # not every parameter covered: vmap, as before
    forced = ghost_grads(enc, inputs, _head)
    _assert_same(forced.grads, auto.grads)


def test_a_registered_layer_is_tapped_on_the_tuple_path(registry):
    register_layer_rule(ScaledProjection, scaled_projection_pieces)
    enc, inputs = _tuples()
    plan = ghost_plan(enc)
    assert not plan.fallback and set(plan.modules) == {"proj", "out"} and plan.exact
    got = GradSampler("auto", None).tuples(enc, inputs, _head)
    assert isinstance(got.grads, GhostGrads)
    _assert_same(got.grads, GradSampler("vmap", None).tuples(enc, inputs, _head).grads)
    _assert_same(
        GradSampler("auto", 2).tuples(enc, inputs, _head).grads, got.grads
    )  # chunked = whole


class Step(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = ScaledProjection(D, 6), nn.Linear(6, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(torch.tanh(self.proj(x))), y)


@pytest.mark.parametrize("registered", [False, True])
def test_the_user_step_path_taps_what_the_registry_covers(registry, registered):
    if registered:
        register_layer_rule(ScaledProjection, scaled_projection_pieces)
    torch.manual_seed(0)
    module, batch = Step(), [torch.randn(B, D), torch.randint(0, 3, (B,))]
    params = trainable_parameters(module)
    taps = tapped_layers(module, params)
    assert sorted(taps) == (["head", "proj"] if registered else ["head"])
    got = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, 0, params, taps)
    assert sorted(got.grads.rows) == sorted(taps)
    want = user_step_grads(module, module.training_step, TensorRows(), batch, 0, params)
    torch.testing.assert_close(got.grads.norms(), want.grads.norms(), atol=1e-5, rtol=1e-5)
    factors = torch.tensor([1.0, 0.0, 0.5, 0.3, 1.0])
    a, b = got.grads.weighted_sum(factors), want.grads.weighted_sum(factors)
    assert set(a) == set(b) == set(params)
    for name in b:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-5)
