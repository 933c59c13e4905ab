"""A tapped Linear's weight used elsewhere too (grad_sample/user_taps.py): tied to an embedding, shared by two Linears, in
a weight penalty, tied as HuggingFace ``transformers`` ties ``lm_head``. G_iᵀA_i would miss those uses; per-example norms
and clipped sums must equal a batch-of-one autograd loop, while an ordinary MLP keeps every Linear tapped."""

from __future__ import annotations

import copy
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.grad_sample.user_step import quiet_logging, user_step_grads
from lightning_dprel.grad_sample.user_taps import tapped_layers, user_step_tapped_grads

pytestmark = pytest.mark.filterwarnings("ignore:.*(self.log|batching rule|enable_nested_tensor|trainer. reference).*")
V, D, C, L, B = 11, 6, 3, 4, 5  # vocabulary, width, classes, tokens, examples


class Tied(pl.LightningModule):
    """Case (a)/(b)/(c): an output Linear declared first and tied to an embedding (either assignment), two Linears
    sharing one weight, a Linear whose weight enters a penalty (always, or only when ``batch_idx`` is 1)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind in ("out_takes_emb", "emb_takes_out"):
            self.out, self.emb, self.mid = nn.Linear(D, V), nn.Embedding(V, D), nn.Linear(D, D)
            if kind == "out_takes_emb":
                self.out.weight = self.emb.weight
            else:
                self.emb.weight = self.out.weight
        elif kind == "shared":
            self.a, self.b, self.head = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, C)
            self.b.weight = self.a.weight
        else:
            self.fc, self.head = nn.Linear(D, D), nn.Linear(D, C)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.kind in ("out_takes_emb", "emb_takes_out"):
            return F.cross_entropy(self.out(torch.tanh(self.mid(self.emb(x)))).reshape(-1, V), y.reshape(-1))
        if self.kind == "shared":
            return F.cross_entropy(self.head(torch.tanh(self.b(torch.tanh(self.a(x))))), y)
        loss = F.cross_entropy(self.head(torch.tanh(self.fc(x))), y)
        if self.kind == "penalty" or batch_idx == 1:
            loss = loss + 1e-2 * self.fc.weight.pow(2).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class HF(pl.LightningModule):
    """A tiny ``transformers`` LM (``lm_head`` tied to the input embedding by ``tie_weights``), optionally with a handle
    to the head registered before the model (so the head's name, not the embedding's, is the parameter's first)."""

    def __init__(self, kind: str):
        super().__init__()
        tf = pytest.importorskip("transformers")
        tf.logging.set_verbosity_error()
        if kind.startswith("gpt2"):
            lm = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        else:
            lm = tf.BertForMaskedLM(tf.BertConfig(vocab_size=V, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=16, max_position_embeddings=8,
                                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        lm.tie_weights()
        assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
        if kind.endswith("handle"):
            self.head = lm.get_output_embeddings()
        self.lm = lm

    def training_step(self, batch, batch_idx):
        return self.lm(input_ids=batch[0], labels=batch[1]).loss


def _case(kind):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind.startswith(("gpt2", "bert")):
        x = torch.randint(0, V, (B, 6), generator=g)
        return HF(kind).train(), [x, x.clone()]
    if kind in ("out_takes_emb", "emb_takes_out"):
        return Tied(kind), [torch.randint(0, V, (B, L), generator=g), torch.randint(0, V, (B, L), generator=g)]
    return Tied(kind), [torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g)]


def _oracle(module, batch, batch_idx=0):
    """One plain backward per example on its batch of one (a copy): name → ``[B, *shape]``."""
    ref = copy.deepcopy(module)
    rows = []
    for i in range(B):
        ref.zero_grad(set_to_none=True)
        with quiet_logging(ref):
            ref.training_step([t[i:i + 1] for t in batch], batch_idx).backward()
        rows.append({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in ref.named_parameters()})
    return {n: torch.stack([r[n] for r in rows]) for n in rows[0]}


def _private(module, batch, batch_idx, layers):
    """What the attached step computes: the tapped path, or the formed one when it gives None."""
    params = dict(module.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = user_step_tapped_grads(module, module.training_step, TensorRows(), batch, batch_idx, params, layers)
        return got or user_step_grads(module, module.training_step, TensorRows(), batch, batch_idx, params)


def _assert_exact(got, want):
    norms = torch.cat([g.flatten(1) for g in want.values()], 1).norm(dim=1)
    torch.testing.assert_close(got.grads.norms(), norms, atol=1e-5, rtol=0)
    for factors in (torch.rand(B, generator=torch.Generator().manual_seed(3)), torch.tensor([1.0, 0.0, 0.5, 0.0, 0.2])):
        sums = got.grads.weighted_sum(factors)
        assert set(sums) == set(want)
        for n, g in want.items():
            torch.testing.assert_close(sums[n], torch.einsum("b,b...->...", factors, g), atol=1e-5, rtol=0)


def _no_overrides_left(module):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            assert "forward" not in m.__dict__ and not m._forward_hooks


@pytest.mark.parametrize("kind", ["out_takes_emb", "emb_takes_out", "shared", "penalty",
                                  "gpt2", "bert", "bert_handle"])
def test_norms_and_clipped_sums_equal_a_batch_of_one_loop(kind):
    module, batch = _case(kind)
    before = dict(module.named_parameters(remove_duplicate=False))
    layers = tapped_layers(module, dict(module.named_parameters()))
    got = _private(module, batch, 0, layers)
    _assert_exact(got, _oracle(module, batch))
    _no_overrides_left(module)
    after = dict(module.named_parameters(remove_duplicate=False))
    assert after.keys() == before.keys() and all(after[n] is p and p.grad is None for n, p in before.items())


@pytest.mark.parametrize("kind", ["out_takes_emb", "emb_takes_out", "shared", "bert_handle"])
def test_tied_linears_are_left_out_up_front(kind):
    module, _ = _case(kind)
    layers = tapped_layers(module, dict(module.named_parameters()))
    tied = {"out_takes_emb": "out", "emb_takes_out": "out", "shared": "a", "bert_handle": "head"}
    assert tied[kind] not in layers and layers  # the others stay tapped


@pytest.mark.parametrize("kind", ["out_takes_emb", "shared"])
def test_a_tie_missed_up_front_is_seen_in_the_pass(kind):
    module, batch = _case(kind)
    tied = {"out_takes_emb": "out", "shared": "a"}[kind]
    layers = {**tapped_layers(module, dict(module.named_parameters())), tied: getattr(module, tied)}
    got = _private(module, batch, 0, layers)
    _assert_exact(got, _oracle(module, batch))
    assert tied not in layers and tied not in got.grads.rows


def test_a_penalty_reached_on_one_step_only_forms_that_layer_from_then_on():
    module, batch = _case("sometimes")
    layers = tapped_layers(module, dict(module.named_parameters()))
    assert sorted(layers) == ["fc", "head"]
    for batch_idx, tapped in ((0, ["fc", "head"]), (1, ["head"]), (0, ["head"])):
        got = _private(module, batch, batch_idx, layers)
        _assert_exact(got, _oracle(module, batch, batch_idx))
        assert sorted(got.grads.rows) == sorted(layers) == tapped
        assert ("fc.weight" in got.grads.formed) == (tapped == ["head"])
    _no_overrides_left(module)


class MLP(pl.LightningModule):
    def __init__(self, fail_on_call: int | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, C))
        self.calls, self.fail_on_call = 0, fail_on_call

    def training_step(self, batch, batch_idx):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("boom")
        return F.cross_entropy(self.net(batch[0]), batch[1])


class Aliased(pl.LightningModule):
    """One head module reached under two names (a handle beside the Sequential): not tied, still tapped."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, C)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), self.head)
        self.emb, self.out = nn.Embedding(V, D), nn.Linear(D, V)  # tied below: formed, and swapped under both names
        self.lm = nn.ModuleDict({"out": self.out})
        self.out.weight = self.emb.weight

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y) + self.out(self.emb(y)).logsumexp(-1).sum()


def test_a_module_reached_under_two_names_stays_tapped_and_keeps_its_parameters():
    module, batch = Aliased(), _case("penalty")[1]
    before = dict(module.named_parameters(remove_duplicate=False))
    layers = tapped_layers(module, dict(module.named_parameters()))
    assert sorted(layers) == ["head", "net.0"]
    got = _private(module, batch, 0, layers)
    assert sorted(got.grads.rows) == ["head", "net.0"]
    _assert_exact(got, _oracle(module, batch))
    after = dict(module.named_parameters(remove_duplicate=False))
    assert all(after[n] is p for n, p in before.items())  # functional_call did not leave a traced tensor behind


def test_the_full_vmap_path_keeps_a_module_reached_under_two_names_as_its_parameters():
    """The formed path swaps each module's parameters once: after a step every name still holds the nn.Parameter."""
    module, batch = Aliased(), _case("penalty")[1]
    before = dict(module.named_parameters(remove_duplicate=False))
    with quiet_logging(module):
        user_step_grads(module, module.training_step, TensorRows(), batch, 0, dict(module.named_parameters()))
    after = dict(module.named_parameters(remove_duplicate=False))
    assert all(after[n] is p and isinstance(p, nn.Parameter) for n, p in before.items())


def test_an_ordinary_mlp_keeps_every_linear_tapped():
    module, (x, y) = MLP(), _case("penalty")[1]
    layers = tapped_layers(module, dict(module.named_parameters()))
    got = _private(module, [x, y], 0, layers)
    assert sorted(got.grads.rows) == sorted(layers) == ["net.0", "net.2", "net.4"] and not got.grads.formed
    _assert_exact(got, _oracle(module, [x, y]))
    _no_overrides_left(module)


def test_overrides_and_hooks_are_removed_when_the_step_raises():
    module, batch = MLP(fail_on_call=2), _case("penalty")[1]  # call 1: the dry run; call 2: the vmapped pass
    with pytest.raises(RuntimeError, match="boom"):
        _private(module, batch, 0, tapped_layers(module, dict(module.named_parameters())))
    _no_overrides_left(module)


def test_a_linear_with_its_own_forward_is_not_tapped():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    module = nn.Sequential(Scaled(3, 3), nn.Linear(3, 3))
    assert list(tapped_layers(module, dict(module.named_parameters()))) == ["1"]


@pytest.mark.filterwarnings("ignore:.*(does not have many workers|seed|validation_step).*")
def test_the_released_clipped_sum_through_the_attached_step_is_exact(monkeypatch):
    from lightning_dprel import DPDataLoader, PrivacyCallback

    torch.manual_seed(0)
    model, clip = Tied("penalty"), 0.05
    data = TensorDataset(torch.randn(60, D), torch.randint(0, C, (60,)))
    cb = PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0)
    pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[cb]).fit(model, DPDataLoader(data, batch_size=12.0))
    layer = cb._layer
    assert sorted(layer._layers) == ["head"]  # the first step saw the penalty: fc is formed for the rest of the fit
    seen = []
    original = DPOptimizer.add_noise
    monkeypatch.setattr(DPOptimizer, "add_noise", lambda self, summed, noise="draw": seen.append(
        {n: t.clone() for n, t in summed.items()}) or original(self, summed, noise))
    batch = [data.tensors[0][:B], data.tensors[1][:B]]
    with quiet_logging(model):
        layer.training_step(batch, 0)
    layer.dp.pre_step()
    want = _oracle(model, batch)
    norms = torch.cat([g.flatten(1) for g in want.values()], 1).norm(dim=1)
    factors = clip / torch.maximum(norms, torch.tensor(clip))
    assert set(seen[-1]) == set(want)
    for n, g in want.items():
        torch.testing.assert_close(seen[-1][n], torch.einsum("b,b...->...", factors, g), atol=1e-6, rtol=0)
