"""Per-example gradients of a user's ``training_step`` (:func:`~lightning_dprel.grad_sample.user_step.user_step_grads`).

DP-SGD (Abadi et al. 2016, Alg. 1) clips the gradient of each example's own loss. Example i's gradient must equal
(A) plain autograd on the batch of example i alone and (B) Opacus's ``grad_sample`` on the full batch, for common
layers inside a LightningModule whose step logs; frozen parameters get none; dropout draws a mask per example.
"""

from __future__ import annotations

import copy

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.grad_sample.base import MaterializedGrads, trainable_parameters
from lightning_dprel.grad_sample.user_step import user_step_grads

B, C = 6, 3  # examples, classes
pytestmark = [  # harmless: Opacus hooks on input-free layers, self.log without a Trainer, vmap of CPU attention
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered"),
    pytest.mark.filterwarnings("ignore:There is a performance drop"),
]


class _Pool(nn.Module):
    """``head(body(x).mean(dim))``: sequence models pooled to class logits."""

    def __init__(self, body: nn.Module, head: nn.Module, dim: int) -> None:
        super().__init__()
        self.body, self.head, self.dim = body, head, dim

    def forward(self, x):
        return self.head(self.body(x).mean(self.dim))


class _Module(pl.LightningModule):
    """A user's module: mean cross-entropy, ``self.log`` in the step (counted)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.log_calls = net, 0

    def log(self, *args, **kwargs):
        self.log_calls += 1
        return super().log(*args, **kwargs)

    def training_step(self, batch, batch_idx):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss


def _kind(name: str):
    """(net, x) of one model kind; inputs have B rows."""
    g = torch.Generator().manual_seed(1)
    if name == "linear":
        return nn.Linear(5, C), torch.randn(B, 5, generator=g)
    if name == "embedding":  # token ids [B, L]
        return _Pool(nn.Embedding(10, 4), nn.Linear(4, C), 1), torch.randint(0, 10, (B, 7), generator=g)
    if name == "layernorm":
        net = nn.Sequential(nn.Linear(5, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, C))
        return net, torch.randn(B, 5, generator=g)
    if name == "conv1d":  # [B, C_in, L]
        net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 7, C))
        return net, torch.randn(B, 2, 9, generator=g)
    if name == "transformer":  # [B, L, 16]
        block = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        return _Pool(block, nn.Linear(16, C), 1), torch.randn(B, 4, 16, generator=g)
    gnn = pytest.importorskip("torch_geometric.nn")
    if name == "pyg_linear":
        return gnn.Linear(5, C), torch.randn(B, 5, generator=g)
    if name == "pyg_mlp":  # PyG's MLP defaults to batch_norm, which mixes examples: no norm here
        return gnn.MLP([5, 8, C], norm=None), torch.randn(B, 5, generator=g)
    raise AssertionError(name)


KINDS = ["linear", "embedding", "layernorm", "conv1d", "transformer", "pyg_linear", "pyg_mlp"]


def _setup(name: str):
    torch.manual_seed(0)
    net, x = _kind(name)
    y = torch.randint(0, C, (B,), generator=torch.Generator().manual_seed(2))
    return _Module(net).train(), x, y


def _run(module, batch):
    return user_step_grads(module, module.training_step, TensorRows(), batch, 0, trainable_parameters(module))


def _oracle_a(module, x, y):
    """Oracle A: one plain backward per example on its batch of one (on a copy: the module stays untouched)."""
    ref = copy.deepcopy(module)
    grads, losses = {n: [] for n, p in ref.named_parameters() if p.requires_grad}, []
    for i in range(B):
        ref.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ref.net(x[i:i + 1]), y[i:i + 1])
        loss.backward()
        losses.append(loss.detach())
        for n, p in ref.named_parameters():
            if p.requires_grad:
                grads[n].append(p.grad.clone())
    return {n: torch.stack(g) for n, g in grads.items()}, torch.stack(losses)


def _assert_matches(got, want_grads, want_losses):
    assert isinstance(got.grads, MaterializedGrads)
    assert set(got.grads) == set(want_grads)
    for n, want in want_grads.items():
        torch.testing.assert_close(got.grads[n], want, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
    torch.testing.assert_close(got.losses, want_losses, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", KINDS)
def test_per_example_gradients_equal_a_batch_of_one_loop(name):
    module, x, y = _setup(name)
    got = _run(module, [x, y])
    _assert_matches(got, *_oracle_a(module, x, y))
    assert all(p.grad is None for p in module.parameters()), "user_step_grads must not write .grad"
    assert module.log_calls == 0 and "log" not in module.__dict__  # silenced while examples ran alone, then restored


@pytest.mark.parametrize("name", KINDS)
def test_per_example_gradients_equal_opacus_grad_sample(name):
    opacus = pytest.importorskip("opacus")
    if name == "transformer":
        pytest.skip("Opacus cannot take grad samples of nn.MultiheadAttention (it needs its own DPMultiheadAttention)")
    module, x, y = _setup(name)
    got = _run(module, [x, y])
    net = copy.deepcopy(module.net)
    gsm = opacus.GradSampleModule(net, loss_reduction="mean")
    F.cross_entropy(gsm(x), y).backward()  # the full batch's mean loss (1/B) Σ ℓ_i
    # With loss_reduction="mean" Opacus multiplies the backprops by B, so grad_sample[i] is B × ∂(ℓ_i / B) = ∇ℓ_i,
    # the gradient of example i's own loss: it compares unscaled with ours; its mean over i is the batch's .grad.
    for n, p in net.named_parameters():
        torch.testing.assert_close(got.grads[f"net.{n}"], p.grad_sample, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(p.grad_sample.mean(0), p.grad, atol=1e-6, rtol=1e-5)
    gsm._close()


def test_frozen_parameters_get_no_gradient_and_are_untouched():
    module, x, y = _setup("layernorm")
    frozen = {"net.0.weight", "net.1.weight", "net.1.bias"}
    for n, p in module.named_parameters():
        p.requires_grad_(n not in frozen)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    got = _run(module, [x, y])
    assert not frozen & set(got.grads) and set(got.grads) == {"net.0.bias", "net.3.weight", "net.3.bias"}
    _assert_matches(got, *_oracle_a(module, x, y))  # the frozen values still enter every example's loss
    for n, p in module.named_parameters():
        assert p.grad is None and torch.equal(p, before[n]), f"{n} was changed"


def test_a_dict_batch_gives_the_same_gradients_as_a_list():
    module, x, y = _setup("linear")
    got = _run(module, {"x": x, "y": y})
    _assert_matches(got, *_oracle_a(module, x, y))
    assert module.log_calls == 0


def test_dropout_draws_a_mask_per_example_and_the_step_does_not_log():
    torch.manual_seed(0)
    module = _Module(nn.Sequential(nn.Linear(5, 16), nn.Dropout(0.5), nn.Linear(16, C))).train()
    x = torch.randn(1, 5).expand(B, 5).contiguous()  # one example repeated: only the masks can differ
    y = torch.zeros(B, dtype=torch.long)
    noisy = _run(module, [x, y]).grads
    for n, p in module.named_parameters():
        assert noisy[n].shape == (B, *p.shape)
    clean = _run(module.eval(), [x, y]).grads  # dropout off: every copy has the same gradient
    w = "net.0.weight"
    torch.testing.assert_close(clean[w], clean[w][:1].expand_as(clean[w]))
    assert not torch.allclose(noisy[w], clean[w]), "dropout in training mode must change the gradients"
    distinct = {tuple(g.flatten().tolist()) for g in (noisy[w] != 0)}  # the rows' dropout patterns
    assert len(distinct) > 1, "every example got the same dropout mask (vmap needs randomness='different')"
    assert module.log_calls == 0
    module.training_step([x, y], 0)  # the counter does count a step run outside user_step_grads
    assert module.log_calls == 1
