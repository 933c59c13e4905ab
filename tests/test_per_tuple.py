"""Per-tuple gradients (torch.func) against a one-tuple-at-a-time autograd oracle; tuple independence."""

from __future__ import annotations

import pytest
import torch

from lightning_dprel.demos import WORDS, save_tiny_bert
from lightning_dprel.encoders import MLPEncoder, TextEncoder
from lightning_dprel.methods.relational.losses import tuple_loss
from lightning_dprel.grad_sample.per_tuple import per_tuple_grads, trainable_parameters, uses_dropout
from lightning_dprel.datamodules.edge_tuples.batch import tuple_inputs
from lightning_dprel.demos.tuple_batches import build_tuple_batch, tokenize_nodes


def _head(score="cosine", loss="infonce"):
    return lambda h, anchor: tuple_loss(h, anchor, score=score, temperature=0.1, loss=loss, margin=1.0)


def _oracle(encoder, inputs, anchors, head):
    """Loop of single-tuple torch.autograd.grad calls (the reference)."""
    params = trainable_parameters(encoder)
    out = {name: [] for name in params}
    for i in range(anchors.shape[0]):
        h = encoder(**{k: v[i] for k, v in inputs.items()})
        grads = torch.autograd.grad(head(h, anchors[i]), list(params.values()), allow_unused=True)
        for (name, p), g in zip(params.items(), grads):
            out[name].append(torch.zeros_like(p) if g is None else g)
    return {name: torch.stack(v) if v else None for name, v in out.items()}


def _assert_match(got, want, atol=1e-5):
    bad = [name for name in want if not torch.allclose(got[name], want[name], atol=atol, rtol=1e-4)]
    assert not bad, f"per-tuple gradients differ from the loop oracle for: {bad}"


def _dense_batch(size, k, seed, num_nodes=40, dim=8):
    g = torch.Generator().manual_seed(seed)
    pos = torch.stack([torch.randperm(num_nodes, generator=g)[:2] for _ in range(size)]) if size else torch.zeros(0, 2, dtype=torch.long)
    neg = torch.randperm(num_nodes, generator=g)[: size * k].reshape(size, k)
    anchor = torch.randint(0, 2, (size, k), generator=g)
    x = torch.randn(num_nodes, dim, generator=g)
    return build_tuple_batch(pos, neg, anchor, {"x": x}, expected_batch_size=max(size, 1))


@pytest.mark.parametrize("size,k,chunk,score,loss", [
    (5, 4, None, "cosine", "infonce"),
    (7, 2, 3, "dot", "hinge"),
    (1, 0, None, "cosine", "infonce"),
    (6, 3, 1, "dot", "infonce"),
])
def test_mlp_vmap_matches_loop(size, k, chunk, score, loss):
    torch.manual_seed(0)
    enc = MLPEncoder(8, hidden_dim=16, out_dim=8)
    batch = _dense_batch(size, k, seed=size + k)
    inputs, head = tuple_inputs(batch), _head(score, loss)
    res = per_tuple_grads(enc, inputs, head, (batch.neg_anchor,), chunk_size=chunk)
    assert res.size == size
    _assert_match(res.grads, _oracle(enc, inputs, batch.neg_anchor, head))
    want_losses = torch.stack([head(enc(x=inputs["x"][i]), batch.neg_anchor[i]) for i in range(size)])
    torch.testing.assert_close(res.losses, want_losses.detach(), atol=1e-5, rtol=1e-5)


def test_empty_batch_gives_zero_rows():
    enc = MLPEncoder(8, hidden_dim=16, out_dim=8)
    batch = _dense_batch(0, 4, seed=1)
    res = per_tuple_grads(enc, tuple_inputs(batch), _head(), (batch.neg_anchor,))
    assert res.size == 0
    for name, p in enc.named_parameters():
        assert res.grads[name].shape == (0,) + tuple(p.shape)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _text_batch(path, size, k, seed, num_nodes=30):
    g = torch.Generator().manual_seed(seed)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(torch.randint(1, 7, (1,), generator=g)),), generator=g)) for _ in range(num_nodes)]
    tokens = tokenize_nodes(path, texts, max_length=10)
    pos = torch.stack([torch.randperm(num_nodes, generator=g)[:2] for _ in range(size)])
    neg = torch.randperm(num_nodes, generator=g)[: size * k].reshape(size, k)
    anchor = torch.randint(0, 2, (size, k), generator=g)
    return build_tuple_batch(pos, neg, anchor, tokens, expected_batch_size=size)


def test_lora_bert_vmap_matches_loop_and_only_adapters_get_grads(tiny_bert):
    torch.manual_seed(0)
    enc = TextEncoder(tiny_bert, lora_r=4, lora_alpha=8)
    enc.eval()
    # LoRA B starts at zero, which would make A's gradients vanish: move off the init
    with torch.no_grad():
        for name, p in trainable_parameters(enc).items():
            p.add_(0.05 * torch.randn_like(p))
    batch = _text_batch(tiny_bert, size=4, k=3, seed=3)
    inputs, head = tuple_inputs(batch), _head()
    res = per_tuple_grads(enc, inputs, head, (batch.neg_anchor,), chunk_size=2)
    assert res.grads and all("lora_" in name for name in res.grads)
    assert set(res.grads) == {n for n, p in enc.named_parameters() if p.requires_grad}
    want = _oracle(enc, inputs, batch.neg_anchor, head)
    _assert_match(res.grads, want)
    assert all(float(g.abs().max()) > 0 for g in want.values()), "oracle gradients should be non-trivial"


def test_tuple_independence_mlp():
    torch.manual_seed(0)
    enc = MLPEncoder(8, hidden_dim=16, out_dim=8)
    batch = _dense_batch(6, 3, seed=11)
    inputs = tuple_inputs(batch)
    base = per_tuple_grads(enc, inputs, _head(), (batch.neg_anchor,))
    changed = {"x": inputs["x"].clone()}
    changed["x"][2] += torch.randn_like(changed["x"][2])  # only tuple 2's inputs move
    anchors = batch.neg_anchor.clone()
    anchors[2] = 1 - anchors[2]
    other = per_tuple_grads(enc, changed, _head(), (anchors,))
    for name in base.grads:
        keep = [i for i in range(6) if i != 2]
        assert torch.equal(base.grads[name][keep], other.grads[name][keep]), name
    assert any(not torch.allclose(base.grads[n][2], other.grads[n][2]) for n in base.grads)


def test_tuple_independence_text(tiny_bert):
    torch.manual_seed(1)
    enc = TextEncoder(tiny_bert, lora_r=2).eval()
    batch = _text_batch(tiny_bert, size=3, k=2, seed=5)
    inputs = tuple_inputs(batch)
    base = per_tuple_grads(enc, inputs, _head(), (batch.neg_anchor,))
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["input_ids"][0] = torch.roll(changed["input_ids"][0], 1, dims=0)
    other = per_tuple_grads(enc, changed, _head(), (batch.neg_anchor,))
    for name in base.grads:
        assert torch.equal(base.grads[name][1:], other.grads[name][1:]), name  # bit for bit, not within a tolerance


def _text_datamodule(path, long_text):
    """A text graph whose node 11 has a 14-word text and every other node 1-3 words (max_length 16)."""
    import warnings

    from torch_geometric.data import Data

    from lightning_dprel.datamodules import RelationalDataModule

    texts = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(1 + i % 3)) for i in range(24)]
    texts[11] = long_text
    ring = torch.stack([torch.arange(24), (torch.arange(24) + 1) % 24])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dm = RelationalDataModule(Data(edge_index=ring, text=texts, num_nodes=24), tokenizer=path, max_length=16,
                                  expected_batch_size=1, neg_per_pos=2, sampling_seed=0, test_fraction=0.3)
    dm.setup("fit")
    return dm


def test_tuple_gradients_do_not_depend_on_the_other_tuples_text_lengths(tiny_bert):
    """Issue 11, finding 4: removing a tuple with a long text leaves every other tuple's gradient bit for bit.

    The datamodule pads every training batch to the fixed ``max_length``; trimming to the batch's longest text
    changed the other tuples' float32 gradients by ~1e-7 relative (a different attention width and reduction).
    """
    from lightning_dprel.datamodules.edge_tuples.rows import gather_rows

    dm = _text_datamodule(tiny_bert, " ".join(WORDS[:14]))
    assert int(dm.train_inputs["attention_mask"][11].sum()) == 16 and int(dm.train_inputs["attention_mask"].sum(1).min()) == 3
    torch.manual_seed(0)
    enc = TextEncoder(tiny_bert, lora_r=0).eval()  # the random 2-layer BERT (hidden 32), all weights trained
    pos = torch.tensor([[0, 1], [2, 3], [4, 11]])  # tuple 2 holds the long text
    neg = torch.tensor([[5, 6], [7, 8], [9, 10]])
    anchor = torch.tensor([[0, 1], [1, 0], [0, 0]])

    def grads(rows, trim=False):
        batch = dm.make_batch(pos[rows], neg[rows], anchor[rows], step=0)
        if trim:  # the old behaviour, to show the test can see the difference
            batch.node_inputs = gather_rows(dm.train_inputs, batch.node_ids, trim=True)
        return per_tuple_grads(enc, tuple_inputs(batch), _head(), (batch.neg_anchor,)).grads

    with_long, without = grads([0, 1, 2]), grads([0, 1])
    assert next(iter(with_long.values())).shape[0] == 3
    for name in without:
        assert torch.equal(with_long[name][:2], without[name]), name
    trimmed_long, trimmed_short = grads([0, 1, 2], trim=True), grads([0, 1], trim=True)
    assert any(not torch.equal(trimmed_long[n][:2], trimmed_short[n]) for n in trimmed_short)


def test_dropout_uses_different_randomness():
    torch.manual_seed(0)
    enc = MLPEncoder(8, hidden_dim=32, out_dim=8, dropout=0.5).train()
    assert uses_dropout(enc) and not uses_dropout(enc.eval().train(False))
    enc.train()
    batch = _dense_batch(4, 2, seed=2)
    inputs = tuple_inputs(batch)
    same = {"x": inputs["x"][:1].expand(4, *inputs["x"].shape[1:]).contiguous()}
    anchors = batch.neg_anchor[:1].expand(4, -1).contiguous()
    res = per_tuple_grads(enc, same, _head(), (anchors,))  # identical tuples, different dropout masks
    w = next(iter(res.grads.values()))
    assert not torch.allclose(w[0], w[1])


def test_bad_arguments():
    enc = MLPEncoder(8)
    batch = _dense_batch(3, 2, seed=0)
    with pytest.raises(ValueError, match="chunk_size"):
        per_tuple_grads(enc, tuple_inputs(batch), _head(), (batch.neg_anchor,), chunk_size=0)
    with pytest.raises(ValueError, match="leading size"):
        per_tuple_grads(enc, tuple_inputs(batch), _head(), (batch.neg_anchor[:2],))
    frozen = MLPEncoder(8).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        per_tuple_grads(frozen, tuple_inputs(batch), _head(), (batch.neg_anchor,))


@pytest.mark.parametrize("mode", ["lowrank", "full", "diagonal"])
def test_directed_adapter_hinge_vmap_matches_loop_and_tuples_are_independent(mode):
    """The main job's model (directed residual adapter, hinge on directed cosine): vmap = loop; tuple independence."""
    from lightning_dprel.encoders import ResidualAdapter

    torch.manual_seed(0)
    enc = ResidualAdapter(8, mode=mode, rank=3, directed=True)
    with torch.no_grad():  # move off the identity so every parameter gets a gradient
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = _dense_batch(6, 3, seed=21)
    inputs = tuple_inputs(batch)
    head = lambda h, a: tuple_loss(h, a, score="directed_cosine", temperature=0.05, loss="hinge", margin=8.0)  # noqa: E731
    res = per_tuple_grads(enc, inputs, head, (batch.neg_anchor,))
    want = _oracle(enc, inputs, batch.neg_anchor, head)
    _assert_match(res.grads, want)
    assert any(float(g.abs().max()) > 0 for g in want.values())
    changed = {"x": inputs["x"].clone()}
    changed["x"][4] += torch.randn_like(changed["x"][4])
    other = per_tuple_grads(enc, changed, head, (batch.neg_anchor,))
    keep = [i for i in range(6) if i != 4]
    for name in res.grads:
        assert torch.equal(res.grads[name][keep], other.grads[name][keep]), name
