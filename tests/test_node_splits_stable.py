"""Issue 20, finding 5: DP-GCN splits, public masks and the WordNet subset follow stable node ids, not row numbers.

Deleting one node and renumbering the rows must move no other node (Igamberdiev & Habernal 2022, Section 4: a node
lies in one subgraph, so removing it changes only that subgraph).
"""

from __future__ import annotations

import pytest
import torch

import lightning_dprel.transforms as transforms
from lightning_dprel.datamodules.datasets import nodes
from lightning_dprel.datamodules.datasets.nodes import stable_node_ids, InMemoryNodes, SyntheticNodes, WordNetNodes, public_masks
from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
from lightning_dprel.datamodules.graph_splits import keyed_split
from lightning_dprel.core.randomness import KeyedStream

pytestmark = pytest.mark.filterwarnings("ignore:.*public seed makes this randomness reproducible:UserWarning")


def _graph():
    """400 nodes (≈ 320 training) with user-supplied stable ids unrelated to the row order."""
    data = SyntheticNodes(400, 4, dim=8, seed=3).load()
    data.node_id = 10**9 + torch.randperm(400, generator=torch.Generator().manual_seed(11)) * 13
    return data


def _delete(data, row: int):
    """The graph without row ``row`` (and its edges), rows renumbered."""
    keep = torch.ones(data.num_nodes, dtype=torch.bool)
    keep[row] = False
    new = torch.full((data.num_nodes,), -1, dtype=torch.long)
    new[keep] = torch.arange(int(keep.sum()))
    ei = data.edge_index[:, keep[data.edge_index[0]] & keep[data.edge_index[1]]]
    out = data.clone()
    for key in ("x", "y", "train_mask", "val_mask", "test_mask", "node_id"):
        out[key] = data[key][keep]
    out.edge_index = new[ei]
    return out


def _dm(data) -> NodeSplitDataModule:
    dm = NodeSplitDataModule(InMemoryNodes(data), num_splits=10, sampling_rate=0.5, sampling_seed=7)
    dm.setup("fit")
    return dm


def _split_by_id(dm) -> dict[int, int]:
    d = dm.data
    return {int(i): int(s) for i, s, t in zip(d.node_id, dm.split, d.train_mask) if t}


def _edge_set(example) -> set[tuple[int, int]]:
    return set(map(tuple, example[1].t().tolist()))


def test_deleting_a_training_node_moves_no_other_node_and_changes_one_subgraph():
    data = _graph()
    row = int(torch.nonzero(data.train_mask)[17])
    gone = int(data.node_id[row])
    a, b = _dm(data), _dm(_delete(data, row))
    before, after = _split_by_id(a), _split_by_id(b)
    assert len(before) > 250 and set(after) == set(before) - {gone}
    moved = sum(before[i] != after[i] for i in after)
    assert moved == 0, f"{moved} of {len(after)} training nodes moved to another subgraph"
    hit = before[gone]
    for j in range(10):
        ex_a, ex_b = a.example(j), b.example(j)
        ids_a = set(a.data.node_id[a.split == j].tolist())
        ids_b = set(b.data.node_id[b.split == j].tolist())
        if j == hit:
            assert ids_b == ids_a - {gone}
        else:  # the same example: same nodes, features, labels and edges (members ordered by id)
            assert ids_a == ids_b
            assert torch.equal(ex_a[0], ex_b[0]) and torch.equal(ex_a[2], ex_b[2]) and _edge_set(ex_a) == _edge_set(ex_b)


def test_keyed_split_is_a_keyed_function_of_the_id_alone():
    ids = 10**12 + torch.arange(2000) * 7919
    mask = torch.ones(2000, dtype=torch.bool)
    stream = KeyedStream.seeded(3, "node-batches", warn=False)
    split = keyed_split(mask, 8, stream, node_ids=ids)
    perm = torch.randperm(2000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(keyed_split(mask, 8, stream, node_ids=ids[perm]), split[perm])  # rows do not matter
    assert torch.equal(keyed_split(mask[:500], 8, stream, node_ids=ids[:500]), split[:500])  # others do not matter
    counts = torch.bincount(split, minlength=8)
    assert counts.min() > 180 and counts.max() < 320  # ≈ 250 each
    other = keyed_split(mask, 8, KeyedStream.seeded(4, "node-batches", warn=False), node_ids=ids)
    assert (other != split).float().mean() > 0.7  # the key matters (7/8 expected)
    with pytest.raises(ValueError, match="duplicate"):
        keyed_split(mask[:3], 2, stream, node_ids=torch.tensor([5, 6, 5]))


def test_public_masks_follow_the_id_alone():
    ids = 10**6 + torch.randperm(20000, generator=torch.Generator().manual_seed(1)) * 3
    masks = public_masks(ids, seed=0)
    keep = torch.ones(20000, dtype=torch.bool)
    keep[123] = False
    fewer = public_masks(ids[keep], seed=0)
    changed = sum(int((m[keep] != f).sum()) for m, f in zip(masks, fewer))
    assert changed == 0, f"{changed} mask entries changed after deleting one node"
    assert torch.equal(masks[0] ^ masks[1] ^ masks[2], torch.ones(20000, dtype=torch.bool))
    assert not (masks[0] & masks[1]).any() and not (masks[1] & masks[2]).any() and not (masks[0] & masks[2]).any()
    for m, p in zip(masks, (0.8, 0.1, 0.1)):
        assert abs(float(m.float().mean()) - p) < 0.015
    assert not torch.equal(public_masks(ids, seed=1)[1], masks[1])


def test_in_memory_ids_are_checked_and_missing_ones_warn():
    data = SyntheticNodes(40).load()
    data.node_id = torch.arange(40)
    data.node_id[5] = 9
    with pytest.raises(ValueError, match="duplicate"):
        InMemoryNodes(data).load()
    del data.node_id
    out = InMemoryNodes(data).load()
    assert getattr(out, "node_id", None) is None  # the datamodule decides whether rows may serve as ids
    with pytest.raises(ValueError, match="no `node_id`"):
        stable_node_ids(out, allow_rows=False)
    with pytest.warns(UserWarning, match="stable"):
        assert torch.equal(stable_node_ids(out), torch.arange(40))


# --- WordNetNodes on a fake data.noun (no WordNet install needed) -------------------------------------------------
def _fake_synsets(n: int = 3000) -> dict[str, tuple[str, str, list[str]]]:
    g = torch.Generator().manual_seed(5)
    offsets = [f"{10000 + 41 * i:08d}" for i in range(n)]
    lex = ["noun.animal", "noun.plant", "noun.act", "noun.food"]
    return {o: (lex[i % 4], f"{o} w{i}: a gloss", [offsets[int(t)] for t in torch.randint(0, n, (2,), generator=g)])
            for i, o in enumerate(offsets)}


class _FakeEmbed:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def embeddings(self, texts):
        """Column 0 = the synset offset (the test's own node identity), float64 so it is exact."""
        return torch.tensor([[float(t.split()[0]), 1.0] for t in texts], dtype=torch.float64)


def _wordnet(monkeypatch, synsets, max_nodes):
    monkeypatch.setattr(nodes, "parse_wordnet_nouns", lambda _dir: dict(synsets))
    monkeypatch.setattr(transforms, "EmbedText", _FakeEmbed)
    monkeypatch.setattr(nodes, "WORDNET_NOUNS", len(_fake_synsets()), raising=False)  # the public total, here the fake's
    data = WordNetNodes(max_nodes, seed=0).load()
    ids = data.x[:, 0].long().tolist()
    return data, {i: (bool(a), bool(b), bool(c)) for i, a, b, c in zip(ids, data.train_mask, data.val_mask, data.test_mask)}


@pytest.mark.parametrize("max_nodes", [1000, None])
def test_wordnet_subset_and_masks_follow_the_synset_offset(monkeypatch, max_nodes):
    synsets = _fake_synsets()
    data, before = _wordnet(monkeypatch, synsets, max_nodes)
    gone = next(i for i, m in before.items() if m[0])  # a kept training synset
    del synsets[f"{gone:08d}"]
    _, after = _wordnet(monkeypatch, synsets, max_nodes)
    assert set(after) == set(before) - {gone}, f"{len(set(after) ^ (set(before) - {gone}))} synsets entered or left the subset"
    changed = sum(before[i] != after[i] for i in after)
    assert changed == 0, f"{changed} of {len(after)} kept synsets changed their train/val/test mask"
    if max_nodes is not None:
        assert 850 < len(before) < 1150  # Binomial(3000, 1000/3000)
    assert torch.equal(data.node_id, data.x[:, 0].long())  # the stable id is the synset offset


@pytest.mark.slow
@pytest.mark.skipif(not (nodes.DEFAULT_WORDNET_DIR and __import__("os").path.isfile(f"{nodes.DEFAULT_WORDNET_DIR}/data.noun")),
                    reason="WordNet 3.0 (Debian wordnet-base) not installed")
def test_real_wordnet_ids_are_the_offsets():
    synsets = nodes.parse_wordnet_nouns(nodes.DEFAULT_WORDNET_DIR)
    keep = nodes.public_subset(torch.tensor([int(o) for o in synsets]), 5000 / nodes.WORDNET_NOUNS, seed=0)
    assert 4700 < int(keep.sum()) < 5300
