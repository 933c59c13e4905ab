"""Ghost clipping for tuples (lightning_dprel.grad_sample.ghost): the same norms and clipped sums as the vmap reference.

Every comparison is in float64 against :func:`lightning_dprel.grad_sample.per_tuple.per_tuple_grads` (per-tuple gradients
formed with torch.func), on the encoders the library builds: an MLP, a tiny BERT with LoRA and a tiny BERT
fine-tuned in full (embeddings, LayerNorm, linear layers), for FREQ-CLIP and standard clipping.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprel.core.clipping import factors_from_norms
from lightning_dprel.demos.tuple_batches import entity_removal_pair
from lightning_dprel.encoders import MLPEncoder, ResidualAdapter, TextEncoder
from lightning_dprel.grad_sample.ghost import GhostGrads, GhostUnsupported, ghost_grads, ghost_plan
from lightning_dprel.methods.relational.losses import tuple_loss
from lightning_dprel.grad_sample.memory import auto_chunk_size, slot_activation_bytes
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.grad_sample.per_tuple import MaterializedGrads, per_tuple_grads, trainable_parameters
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

B, K = 7, 3
TOL = 1e-10


def _head(h, anchor):
    return tuple_loss(h, anchor, score="cosine", temperature=0.5, loss="infonce")


def _text_inputs(vocab: int, seed: int = 0, length: int = 9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, 2 + K, length), generator=g)
    mask = torch.ones_like(ids)
    cut = torch.randint(3, length + 1, (B, 2 + K), generator=g)
    pad = torch.arange(length) >= cut.unsqueeze(-1)
    return {"input_ids": ids.masked_fill(pad, 0), "attention_mask": mask.masked_fill(pad, 0)}


def _encoder(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    if kind == "mlp":
        enc = MLPEncoder(8, hidden_dim=16, out_dim=8, num_layers=3)
        inputs = {"x": torch.randn(B, 2 + K, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)}
    else:
        enc = TextEncoder("tiny-bert", lora_r=4 if kind == "bert-lora" else 0, hidden_dropout=0.0)
        inputs = _text_inputs(enc.vocab_size)
    return enc.double().train(), inputs


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    nodes = torch.randperm(40, generator=g)
    pos = torch.stack([nodes[:B], nodes[B : 2 * B]], 1)
    pos[1, 0] = pos[0, 0]  # a repeated node, so FREQ-CLIP's max-freq varies
    neg = nodes[2 * B : 2 * B + B * K].reshape(B, K)
    anchor = torch.randint(0, 2, (B, K), generator=g)
    return anchor, max_freq(pos, neg)


def _reference(enc, inputs, anchor):
    return MaterializedGrads(per_tuple_grads(enc, inputs, _head, (anchor,)).grads)


@pytest.mark.parametrize("kind", ["mlp", "bert-lora", "bert-full"])
@pytest.mark.parametrize("clipping", ["freq", "standard"])
def test_clipped_sums_equal_vmap_reference_float64(kind, clipping):
    enc, inputs = _encoder(kind)
    anchor, freq = _batch()
    ref = _reference(enc, inputs, anchor)
    res = ghost_grads(enc, inputs, _head, (anchor,))
    assert isinstance(res.grads, GhostGrads) and not ghost_plan(enc).fallback  # every parameter on the ghost path
    torch.testing.assert_close(res.grads.norms(), ref.norms().double(), atol=TOL, rtol=0)
    norms = ref.norms()
    clip = float(norms.median()) * (2.0 if clipping == "freq" else 1.0)  # some tuples clipped, some not (t = C / 2 at max-freq 1)
    factors = factors_from_norms(norms, clipping, clip_norm=clip, max_freq=freq)
    assert 0 < int((factors < 1).sum()) < B
    want, got = ref.weighted_sum(factors), res.grads.weighted_sum(factors)
    assert set(got) == set(want) == set(trainable_parameters(enc))
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=TOL, rtol=0, msg=name)


def test_optimizer_step_is_the_same_with_either_record():
    enc, inputs = _encoder("bert-lora")
    anchor, freq = _batch(3)
    named = trainable_parameters(enc)
    updates = []
    for make in (lambda: _reference(enc, inputs, anchor), lambda: ghost_grads(enc, inputs, _head, (anchor,)).grads):
        dp = DPOptimizer(torch.optim.SGD(named.values(), lr=0.0), named_params=named, noise_multiplier=0.0,
                         clip_norm=0.01, clipping="freq")
        dp.record(make(), max_freq=freq, expected_batch_size=5.0)
        dp.step()
        updates.append({n: p.grad.clone() for n, p in named.items()})
    for name in named:
        torch.testing.assert_close(updates[0][name], updates[1][name], atol=TOL, rtol=0)


def test_chunks_give_the_same_sums():
    enc, inputs = _encoder("bert-full")
    anchor, _ = _batch()
    whole = ghost_grads(enc, inputs, _head, (anchor,)).grads
    parts = ghost_grads(enc, inputs, _head, (anchor,), chunk_size=3).grads
    factors = torch.linspace(0.1, 1.0, B, dtype=torch.float64)
    torch.testing.assert_close(parts.norms(), whole.norms(), atol=TOL, rtol=0)
    a, b = whole.weighted_sum(factors), parts.weighted_sum(factors)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=TOL, rtol=0)


class _Mixed(nn.Module):
    """A covered Linear, an uncovered raw parameter, and a Linear applied to flattened positions (not the slots)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8))
        self.tok = nn.Linear(2, 2)

    def forward(self, x):
        h = self.lin(x) * self.scale
        t = self.tok(h.reshape(-1, 2)).reshape(h.shape)  # rows = 4 per slot: demoted to vmap at run time
        return h + t


def test_uncovered_layers_fall_back_to_vmap_and_sums_still_match():
    torch.manual_seed(0)
    enc = _Mixed().double()
    inputs = {"x": torch.randn(B, 2 + K, 8, dtype=torch.float64)}
    anchor, _ = _batch()
    plan = ghost_plan(enc)
    assert set(plan.fallback) == {"scale"} and set(plan.modules) == {"lin", "tok"}
    res = ghost_grads(enc, inputs, _head, (anchor,), plan=plan)
    assert set(plan.fallback) == {"scale", "tok.weight", "tok.bias"}  # `tok` was demoted when its rows were not slots
    ref = _reference(enc, inputs, anchor)
    torch.testing.assert_close(res.grads.norms(), ref.norms(), atol=TOL, rtol=0)
    factors = factors_from_norms(ref.norms(), "standard", clip_norm=0.5 * float(ref.norms().median()))
    want, got = ref.weighted_sum(factors), res.grads.weighted_sum(factors)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=TOL, rtol=0)


def test_encoders_that_mix_slots_are_refused_and_auto_mode_uses_vmap():
    enc = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 8)).double().train()
    inputs = {"x": torch.randn(B, 2 + K, 8, dtype=torch.float64)}
    anchor, _ = _batch()
    with pytest.raises(GhostUnsupported, match="mix node slots"):
        ghost_grads(enc, inputs, _head, (anchor,))
    assert not ghost_plan(enc).usable
    # a residual adapter's own parameters are not covered: auto mode takes vmap without a ghost pass
    assert not ghost_plan(ResidualAdapter(8)).modules


def test_non_finite_tuple_is_dropped_exactly():
    enc, inputs = _encoder("mlp")
    inputs = {"x": inputs["x"].clone()}
    inputs["x"][2, 1, 0] = float("nan")
    anchor, _ = _batch()
    res = ghost_grads(enc, inputs, _head, (anchor,)).grads
    norms = res.norms()
    assert not torch.isfinite(norms[2]) and bool(torch.isfinite(norms[torch.arange(B) != 2]).all())
    factors = factors_from_norms(norms, "standard", clip_norm=1.0)
    got = res.weighted_sum(factors)
    keep = [i for i in range(B) if i != 2]
    clean = {k: v[keep] for k, v in inputs.items()}
    ref = _reference(enc, clean, anchor[keep]).weighted_sum(factors[keep])
    for name in ref:
        assert bool(torch.isfinite(got[name]).all())
        torch.testing.assert_close(got[name], ref[name], atol=TOL, rtol=0)


def test_batched_head_is_required():
    enc, inputs = _encoder("mlp")
    anchor, _ = _batch()
    with pytest.raises(ValueError, match="broadcast over tuples"):
        ghost_grads(enc, inputs, lambda h, a: _head(h, a).sum(), (anchor,))


def test_auto_chunk_size_follows_the_memory_budget():
    enc, inputs = _encoder("bert-full")
    params = trainable_parameters(enc)
    per_tuple = (2 + K) * slot_activation_bytes(enc, inputs) * 3
    grads = 3 * sum(p.numel() * p.element_size() for p in params.values())
    assert auto_chunk_size(enc, inputs, params, per_tuple_gradients=False, budget_bytes=10**12) is None
    assert auto_chunk_size(enc, inputs, params, per_tuple_gradients=False, budget_bytes=3 * per_tuple) == 3
    budget = 3 * (per_tuple + grads)  # per-tuple gradients of the full model count on the vmap path
    assert auto_chunk_size(enc, inputs, params, per_tuple_gradients=True, budget_bytes=budget) == 3
    assert auto_chunk_size(enc, inputs, params, per_tuple_gradients=True, budget_bytes=1) == 1


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")  # training only
def test_module_modes_train_to_the_same_parameters(mode):
    """Two σ = 0 clipped steps through the Lightning module: ghost and vmap paths give the same model."""
    from pytorch_lightning import Trainer
    from torch.utils.data import DataLoader

    from lightning_dprel.demos.tuple_batches import build_tuple_batch

    anchor, _ = _batch()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 8, generator=g)
    nodes = torch.randperm(40, generator=g)
    pos = torch.stack([nodes[:B], nodes[B : 2 * B]], 1)
    neg = nodes[2 * B : 2 * B + B * K].reshape(B, K)
    batch = build_tuple_batch(pos, neg, anchor, {"x": x}, expected_batch_size=float(B))
    results = {}
    for m_mode in ("vmap", mode):
        torch.manual_seed(0)
        module = DPRelationalModule(MLPEncoder(8, hidden_dim=16, out_dim=8), clipping="standard", clip_norm=0.05,
                                    noise_multiplier=0.0, per_tuple_mode=m_mode, lr=0.1, allow_untracked=True)
        trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
        trainer.fit(module, DataLoader([batch, batch], batch_size=None, collate_fn=lambda b: b))
        results[m_mode] = [p.detach().clone() for p in module.encoder.parameters()]
    for a, b in zip(results["vmap"], results[mode]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)  # float32 after two Adam steps at lr 0.1 (the float64 check is exact)


def test_module_rejects_bad_modes():
    with pytest.raises(ValueError, match="per_tuple_mode"):
        DPRelationalModule(MLPEncoder(4), per_tuple_mode="fast")
    with pytest.raises(ValueError, match="chunk_size"):
        DPRelationalModule(MLPEncoder(4), chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        DPRelationalModule(MLPEncoder(4), chunk_size="big")


def test_seeded_noise_stream_is_unaffected_by_the_path():
    """The noise drawn in a step depends on the stream only, not on how the clipped sum was formed."""
    enc, inputs = _encoder("mlp")
    anchor, freq = _batch()
    named = trainable_parameters(enc)
    grads = []
    for make in (lambda: _reference(enc, inputs, anchor), lambda: ghost_grads(enc, inputs, _head, (anchor,)).grads):
        dp = DPOptimizer(torch.optim.SGD(named.values(), lr=0.0), named_params=named, noise_multiplier=1.0,
                         clip_norm=1.0, clipping="standard", noise=KeyedStream.seeded(4, "noise", warn=False))
        dp.record(make(), max_freq=freq, expected_batch_size=5.0)
        dp.step()
        grads.append(torch.cat([p.grad.reshape(-1) for p in named.values()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("clipping", ["standard", "freq"])
def test_removing_a_node_moves_the_ghost_clipped_sum_within_the_bound(clipping):
    """Entity-level neighbours through the real ghost path: drop u's tuples, give its negative slot to a fresh z.

    Tuples without u keep their norms to rounding (one flat forward does not mix tuples); the clipped sum moves by at
    most C(i + 2j) (standard) or the corrected FREQ-CLIP profile C(1/2 + 3j/4 + i(1+k)/4), i = 2, j = 1.
    """
    torch.manual_seed(0)
    enc = MLPEncoder(8, hidden_dim=16, out_dim=8, num_layers=2).double()
    x = torch.randn(60, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (pos, neg, anchor), (pos2, neg2, anchor2) = entity_removal_pair(K)
    clip = 1e-3  # every tuple clipped: the worst case

    def clipped(p, n, a):
        inputs = {"x": x[torch.cat([p, n], 1)]}
        res = ghost_grads(enc, inputs, _head, (a,)).grads
        factors = factors_from_norms(res.norms(), clipping, clip_norm=clip, max_freq=max_freq(p, n))
        assert bool((factors < 1).all())
        return res.norms(), torch.cat([t.reshape(-1) for t in res.weighted_sum(factors).values()])

    norms, total = clipped(pos, neg, anchor)
    norms2, total2 = clipped(pos2, neg2, anchor2)
    same = [i for i in range(2, 8) if i != 5]
    torch.testing.assert_close(norms[same], norms2[[i - 2 for i in same]], atol=0, rtol=1e-12)  # BLAS blocking only
    i, j = 2, 1
    bound = clip * (i + 2 * j) if clipping == "standard" else clip * (0.5 + 0.75 * j + i * (1 + K) / 4)
    moved = float(torch.linalg.vector_norm(total - total2))
    assert 0 < moved <= bound * (1 + 1e-9), (moved, bound)


def test_bad_arguments_are_refused_with_the_vmap_paths_messages():
    enc, inputs = _encoder("mlp")
    anchor, _ = _batch()
    with pytest.raises(ValueError, match="chunk_size"):
        ghost_grads(enc, inputs, _head, (anchor,), chunk_size=0)
    with pytest.raises(ValueError, match="leading size"):
        ghost_grads(enc, inputs, _head, (anchor[:2],))
    with pytest.raises(ValueError, match="empty"):
        ghost_grads(enc, {}, _head, (anchor,))
    frozen = MLPEncoder(8).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ghost_grads(frozen, {"x": inputs["x"].float()}, _head, (anchor,))
