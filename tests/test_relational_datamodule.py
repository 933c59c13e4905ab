"""Tests of RelationalDataModule: graphs in, TupleBatch / RankingBatch out, as Algorithms 2-3 assume."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from lightning_fabric.utilities.data import has_iterable_dataset
from torch_geometric.data import Data
from torch_geometric.datasets import FakeDataset, StochasticBlockModelDataset

from lightning_dprel.datamodules import GraphPair, GraphSource, PyGSource, RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.batch import RankingBatch, TupleBatch
from lightning_dprel.demos import random_feature_graph, random_text_graph, save_tiny_bert
from lightning_dprel.datamodules.edge_tuples.sampling import cap_degree, max_freq, to_simple_undirected

pytestmark = pytest.mark.filterwarnings(
    r"ignore:RelationalDataModule\(sampling_seed=<int>\)", "ignore:RelationalDataModule has no validation graph"
)


def _feature_dm(**kwargs) -> RelationalDataModule:
    opts = {"expected_batch_size": 8, "neg_per_pos": 2, "seed": 3, "sampling_seed": 7, **kwargs}
    dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), **opts)
    dm.setup("fit")
    return dm


def _take(loader, count: int) -> list:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == count:
            break
    return out


def _check_tuple_batch(batch: TupleBatch, inputs: dict[str, torch.Tensor], k: int) -> None:
    assert batch.pos.shape == (batch.size, 2) and batch.neg.shape == (batch.size, k)
    assert batch.neg_anchor.shape == (batch.size, k) and batch.max_freq.shape == (batch.size,)
    ids = batch.node_ids[batch.tuple_nodes]
    assert torch.equal(ids[:, :2], batch.pos) and torch.equal(ids[:, 2:], batch.neg)
    assert batch.node_ids.unique().numel() == batch.node_ids.numel()
    for key, val in batch.node_inputs.items():
        assert val.shape[0] == batch.node_ids.numel()
        assert torch.equal(val, inputs[key][batch.node_ids])  # full width: never trimmed per batch
    assert batch.neg.unique().numel() == batch.neg.numel()


# ----------------------------------------------------------------------------- a hand-built Data
def test_hand_built_data_spec_and_batches():
    # Self-loops, duplicates and reverse duplicates collapse to the 80-cycle's edges.
    n = 80
    cyc = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    ei = torch.cat([cyc, cyc.flip(0), cyc, torch.tensor([[3, 7], [3, 7]])], dim=1)
    data = Data(x=torch.randn(n, 5, generator=torch.Generator().manual_seed(0)), edge_index=ei)
    dm = RelationalDataModule(data, max_degree=2, capping="assert", expected_batch_size=4, neg_per_pos=3, test_fraction=0.25)
    with pytest.raises(RuntimeError, match=r"only after setup\(\)"):
        _ = dm.sampling_spec
    dm.setup("fit")
    spec = dm.sampling_spec
    # Held-out split: a per-relation hash decision, so the test count is Binomial(80, 0.25) (mean 20, sd 3.9).
    train = set(map(tuple, dm.train_edges.t().tolist()))
    test = {tuple(sorted(e)) for e in torch.stack([dm.eval_query, dm.eval_target]).t().tolist()}
    m = n - len(test)
    assert abs(len(test) - 20) <= 4 * math.sqrt(80 * 0.25 * 0.75) and not (train & test)
    assert (spec.num_nodes, spec.num_edges, spec.max_degree, spec.neg_per_pos) == (n, m, 2, 3)
    assert spec.sampling_rate == pytest.approx(4 / m) and spec.expected_batch_size == 4.0
    assert spec.steps_per_epoch == math.ceil(m / 4) == len(dm.train_dataloader())
    assert train | test == set(map(tuple, to_simple_undirected(cyc, n).t().tolist()))
    threads = torch.get_num_threads()
    batches = list(dm.train_dataloader())
    assert torch.get_num_threads() == threads  # batch construction's single-thread section is undone
    assert len(batches) == spec.steps_per_epoch
    for step, batch in enumerate(batches):
        assert isinstance(batch, TupleBatch) and batch.step == step
        _check_tuple_batch(batch, dm.train_inputs, 3)
        assert torch.equal(batch.max_freq, max_freq(batch.pos, batch.neg))
        assert batch.global_size == batch.size and batch.expected_batch_size == 4.0
        assert all(tuple(sorted(p)) in train for p in batch.pos.tolist())


def test_positive_counts_per_step_are_binomial_m_gamma():
    dm = _feature_dm(expected_batch_size=6, steps_per_epoch=1500)
    spec = dm.sampling_spec
    counts = torch.tensor([b.global_size for b in dm.train_dataloader()], dtype=torch.float64)
    mean, var = spec.num_edges * spec.sampling_rate, spec.num_edges * spec.sampling_rate * (1 - spec.sampling_rate)
    assert mean == pytest.approx(6.0)
    assert abs(float(counts.mean()) - mean) < 5 * math.sqrt(var / counts.numel())
    assert abs(float(counts.var()) - var) < 5 * var * math.sqrt(2 / (counts.numel() - 1))


def test_steps_per_epoch_override_and_epochs_continue_the_stream():
    dm = _feature_dm(steps_per_epoch=3)
    assert dm.sampling_spec.steps_per_epoch == 3
    loader = dm.train_dataloader()
    first, second = list(loader), list(loader)
    assert [b.step for b in first + second] == [0, 1, 2, 3, 4, 5]
    fresh = _feature_dm(steps_per_epoch=6)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first + second, fresh.train_dataloader()))


def test_no_negatives_k_zero():
    dm = _feature_dm(neg_per_pos=0)
    batch = next(iter(dm.train_dataloader()))
    assert batch.neg.shape == (batch.size, 0) and batch.tuple_nodes.shape == (batch.size, 2)
    assert torch.equal(batch.max_freq, max_freq(batch.pos, batch.neg)) and dm.sampling_spec.neg_per_pos == 0


def test_empty_poisson_sample_is_a_real_empty_batch():
    dm = _feature_dm(expected_batch_size=0.05, steps_per_epoch=20)
    batches = list(dm.train_dataloader())
    assert len(batches) == 20
    empty = [b for b in batches if b.size == 0]
    assert empty, "with b = 0.05 most steps should draw no positive"
    b = empty[0]
    assert b.pos.shape == (0, 2) and b.neg.shape == (0, 2) and b.max_freq.shape == (0,)
    assert b.node_ids.numel() == 0 and b.node_inputs["x"].shape == (0, 16) and b.global_size == 0
    assert b.expected_batch_size == 0.05


def test_negatives_do_not_depend_on_which_positives_were_drawn():
    """Two graphs with the same n and m (a relabelled cycle): same counts ⇒ same negatives, other positives."""
    n = 300
    cyc = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    relabel = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    held_out = Data(x=torch.randn(n, 2), edge_index=cyc[:, :10])  # a separate test graph: no split, so m = n for both
    opts = {"max_degree": 2, "capping": "assert", "expected_batch_size": 10, "neg_per_pos": 3, "steps_per_epoch": 8,
            "sampling_seed": 7, "test_source": held_out}
    dms = [RelationalDataModule(Data(x=torch.randn(n, 2), edge_index=ei), **opts) for ei in (cyc, relabel[cyc])]
    for dm in dms:
        dm.setup()
    assert dms[0].sampling_spec == dms[1].sampling_spec
    a, b = (list(dm.train_dataloader()) for dm in dms)
    assert [x.size for x in a] == [y.size for y in b]
    assert all(torch.equal(x.neg, y.neg) and torch.equal(x.neg_anchor, y.neg_anchor) for x, y in zip(a, b))
    assert any(not torch.equal(x.pos, y.pos) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- resumable stream
def test_state_dict_resume_draws_the_same_batches():
    dm = _feature_dm(steps_per_epoch=4)
    it = iter(dm.train_dataloader())
    for _ in range(3):
        next(it)
    state = dm.state_dict()
    rest = [next(it)] + list(dm.train_dataloader())  # step 3, then epoch 1
    resumed = _feature_dm(steps_per_epoch=4)
    resumed.load_state_dict(state)
    again = list(resumed.train_dataloader()) + list(resumed.train_dataloader())
    assert [b.step for b in again] == [b.step for b in rest] == [3, 4, 5, 6, 7]
    assert all(torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg) for a, b in zip(rest, again))
    other = _feature_dm(seed=4)
    with pytest.raises(ValueError, match="drawn with seed=3, this datamodule has seed=4"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="empty state"):
        other.load_state_dict({})
    changed = _feature_dm(steps_per_epoch=5)
    changed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"had \(m, steps_per_epoch\) = \(\d+, 4\), this datamodule has \(\d+, 5\)"):
        list(changed.train_dataloader())


def test_seek_reproduces_any_epoch_from_the_seed():
    dm = _feature_dm(steps_per_epoch=4)
    loader = dm.train_dataloader()
    whole = list(loader) + list(loader) + list(loader)
    other = _feature_dm(steps_per_epoch=4)
    other.seek(1, 3)
    tail = list(other.train_dataloader()) + list(other.train_dataloader())
    assert [b.step for b in tail] == list(range(7, 12))
    assert all(torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg) for a, b in zip(whole[7:], tail))
    with pytest.raises(ValueError, match=r"`index` must be <= steps_per_epoch=4, got 5"):
        other.seek(0, 5)


class _Recorder:
    """A tiny LightningModule factory that records the training batches it sees."""

    @staticmethod
    def make():
        import pytorch_lightning as pl

        class Rec(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))
                self.seen: list[tuple[int, list]] = []

            def training_step(self, batch, batch_idx):
                assert isinstance(batch, TupleBatch)
                self.seen.append((batch.step, batch.pos.tolist()))
                return (self.w - float(batch.size)).pow(2).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        return Rec()


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader`", "ignore:Be aware that when using `ckpt_path`")
def test_trainer_mid_epoch_resume_draws_the_same_batches(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    def trainer(**kw):
        return pl.Trainer(
            max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0, accelerator="cpu", devices=1,
            default_root_dir=tmp_path, **{"enable_checkpointing": False, **kw},
        )

    full = _Recorder.make()
    trainer().fit(full, datamodule=_feature_dm(steps_per_epoch=4))
    assert [s for s, _ in full.seen] == list(range(12))

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1, save_last=False)
    part = _Recorder.make()
    trainer(callbacks=[ckpt], enable_checkpointing=True).fit(part, datamodule=_feature_dm(steps_per_epoch=4))
    path = next(p for p in (tmp_path / "ckpt").iterdir() if "step=6" in p.name)  # mid-epoch: epoch 1, batch 2 of 4
    resumed = _Recorder.make()
    trainer().fit(resumed, datamodule=_feature_dm(steps_per_epoch=4), ckpt_path=str(path))
    assert resumed.seen == full.seen[6:]


# ----------------------------------------------------------------------------- DDP slicing
def test_ddp_slices_union_is_the_single_process_batch():
    single = _take(_feature_dm(expected_batch_size=20, steps_per_epoch=5).train_dataloader(), 5)
    world = 3
    per_rank = []
    for rank in range(world):
        dm = _feature_dm(expected_batch_size=20, steps_per_epoch=5)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=world)  # simulated rank, in-process
        per_rank.append(_take(dm.train_dataloader(), 5))
    for step, whole in enumerate(single):
        parts = [per_rank[r][step] for r in range(world)]
        assert all(p.step == whole.step and p.global_size == whole.size for p in parts)
        assert abs(parts[0].size - parts[-1].size) <= 1
        for field in ("pos", "neg", "neg_anchor", "max_freq"):
            assert torch.equal(torch.cat([getattr(p, field) for p in parts]), getattr(whole, field)), field
        # max_freq counted on the global batch, not on a slice.
        assert torch.equal(torch.cat([p.max_freq for p in parts]), max_freq(whole.pos, whole.neg))


_DDP_SCRIPT = """
import json, sys, torch
import pytorch_lightning as pl
from ddp_helpers import ReleaseGroupAtTeardown
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph

class Rec(pl.LightningModule):
    def __init__(self, out):
        super().__init__()
        self.w, self.out, self.seen = torch.nn.Parameter(torch.zeros(1)), out, []
    def training_step(self, batch, batch_idx):
        self.seen.append([batch.step, batch.pos.tolist(), batch.max_freq.tolist(), batch.global_size])
        return (self.w - float(batch.size)).pow(2).sum()
    def on_train_end(self):
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump(self.seen, f)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), expected_batch_size=20, neg_per_pos=2, seed=3,
                              sampling_seed=7, steps_per_epoch=4)
    pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
               num_sanity_val_steps=0, callbacks=[ReleaseGroupAtTeardown()]).fit(Rec(sys.argv[1]), datamodule=dm)
"""


@pytest.mark.slow
@pytest.mark.slow
def test_real_ddp_two_processes_slices_union_is_the_single_process_batch(tmp_path):
    """Two gloo ranks under Lightning (default use_distributed_sampler=True): no re-wrapping, global max_freq."""
    import json

    from ddp_helpers import run_script

    run_script(_DDP_SCRIPT, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    single = _take(_feature_dm(expected_batch_size=20, steps_per_epoch=4).train_dataloader(), 4)
    assert len(ranks[0]) == len(ranks[1]) == 4
    for whole, a, b in zip(single, *ranks):
        assert a[0] == b[0] == whole.step and a[3] == b[3] == whole.size
        assert a[1] + b[1] == whole.pos.tolist()
        assert a[2] + b[2] == whole.max_freq.tolist() == max_freq(whole.pos, whole.neg).tolist()


def test_loaders_are_iterable_so_lightning_never_adds_a_distributed_sampler():
    dm = _feature_dm(eval_candidates=5)
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        assert has_iterable_dataset(loader)  # Lightning's `_requires_distributed_sampler` is False for these


def test_ddp_eval_slices_cover_every_query_with_equal_batch_counts():
    dm = _feature_dm(eval_candidates=5, eval_batch_size=4)
    total = dm.eval_query.numel()
    seen, counts = [], []
    for rank in range(3):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=3)
        batches = list(dm.val_dataloader())
        counts.append(len(batches))
        seen += [b.node_ids[b.query] for b in batches]
    assert len(set(counts)) == 1
    assert torch.equal(torch.cat(seen), dm.eval_query) and total > 0


# ----------------------------------------------------------------------------- evaluation batches
def test_ranking_batches_sampled_candidates():
    dm = _feature_dm(eval_candidates=6, eval_batch_size=16, max_eval_queries=40)
    batches = list(dm.val_dataloader())
    assert sum(b.size for b in batches) == 40 == dm.eval_query.numel()
    for b in batches:
        assert isinstance(b, RankingBatch) and b.candidates.shape == (b.size, 7)
        assert torch.equal(b.candidates[:, 0], b.target)
        assert not bool((b.candidates == b.query[:, None]).any())
        assert torch.equal(b.node_inputs["x"], dm.test_inputs["x"][b.node_ids])
    # Candidates are fixed at setup: two passes agree.
    again = list(dm.val_dataloader())
    assert all(torch.equal(a.node_ids[a.candidates], c.node_ids[c.candidates]) for a, c in zip(batches, again))


def test_ranking_batches_all_nodes():
    dm = _feature_dm(eval_batch_size=1000)
    (b,) = list(dm.test_dataloader())
    assert b.candidates is None and b.meta["exclude_query"] is True
    assert torch.equal(b.node_ids, torch.arange(200)) and b.node_inputs["x"].shape == (200, 16)
    assert b.size == dm.eval_query.numel()


# ----------------------------------------------------------------------------- text graphs
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def test_text_graph_tokenised_once_and_zero_shot_test_graph(tiny_bert, monkeypatch):
    import transformers
    from transformers import AutoTokenizer

    calls = []
    real = AutoTokenizer.from_pretrained(tiny_bert)

    class Counting:
        def __call__(self, texts, **kwargs):
            calls.append(len(texts))
            return real(texts, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: Counting())
    train, test = random_text_graph(80, 200, seed=0), random_text_graph(50, 120, seed=1)
    dm = RelationalDataModule(
        train, test_source=test, tokenizer=tiny_bert, max_length=12, expected_batch_size=6, neg_per_pos=3, eval_candidates=4
    )
    dm.setup("fit")
    list(dm.train_dataloader())
    list(dm.val_dataloader())
    assert calls == [80, 50]  # one call per graph at setup, one text per node; none per batch
    monkeypatch.undo()
    assert dm.train_inputs["input_ids"].shape == (80, 12) and dm.test_inputs["input_ids"].shape == (50, 12)
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    batch = next(iter(dm.train_dataloader()))
    _check_tuple_batch(batch, dm.train_inputs, 3)
    # Training batches keep the full max_length width (no trimming to the batch's longest text: issue 11, finding 4).
    assert batch.node_inputs["input_ids"].shape[1] == batch.node_inputs["attention_mask"].shape[1] == 12
    for row, node in enumerate(batch.node_ids.tolist()):
        ref = tok(train.text[node], padding="max_length", truncation=True, max_length=12, return_tensors="pt")
        assert torch.equal(batch.node_inputs["input_ids"][row], ref["input_ids"][0])
        assert torch.equal(batch.node_inputs["attention_mask"][row], ref["attention_mask"][0])
    # Zero-shot: the queries are the test graph's relations, the inputs its nodes.
    assert dm.eval_query.numel() == to_simple_undirected(test.edge_index, 50).shape[1]
    rb = next(iter(dm.val_dataloader()))
    assert int(rb.node_ids.max()) < 50
    assert torch.equal(rb.node_inputs["input_ids"], dm.test_inputs["input_ids"][rb.node_ids][:, : rb.node_inputs["input_ids"].shape[1]])


def test_mismatched_text_count_and_missing_text(tiny_bert):
    g = random_text_graph(30, 60)
    g.text = g.text[:-1]
    with pytest.raises(ValueError, match=r"`source.text` has 29 entries but the graph has 30 nodes"):
        RelationalDataModule(g, tokenizer=tiny_bert, expected_batch_size=2, neg_per_pos=1).setup()
    with pytest.raises(ValueError, match=r"`source` has no `text` but `tokenizer` is set"):
        RelationalDataModule(random_feature_graph(30, 60), tokenizer=tiny_bert, expected_batch_size=2).setup()


# ----------------------------------------------------------------------------- other PyG datasets
def test_fake_dataset_directly_and_through_pyg_source():
    ds = FakeDataset(num_graphs=1, avg_num_nodes=300, avg_degree=6, num_channels=8)
    direct = RelationalDataModule(ds, expected_batch_size=16, neg_per_pos=4)
    direct.setup()
    batch = next(iter(direct.train_dataloader()))
    _check_tuple_batch(batch, direct.train_inputs, 4)
    src = PyGSource("FakeDataset", num_graphs=1, avg_num_nodes=300, avg_degree=6, num_channels=8)
    via = RelationalDataModule(src, expected_batch_size=16, neg_per_pos=4)
    via.setup()
    assert via.sampling_spec.num_nodes >= 1 and int(torch.bincount(via.train_edges.flatten()).max()) <= 5


@pytest.mark.filterwarnings("ignore:Unable to accurately infer 'num_nodes'")
def test_stochastic_block_model_dataset(tmp_path):
    pytest.importorskip("sklearn")  # StochasticBlockModelDataset.process imports scikit-learn
    from torch_geometric.transforms import LocalDegreeProfile

    torch.manual_seed(0)  # the dataset draws its graph from the global generator
    # Features from degrees (its own `num_channels` path passes a tensor to sklearn, which sklearn 1.9 rejects).
    ds = StochasticBlockModelDataset(
        str(tmp_path), block_sizes=[60, 60, 60], edge_probs=[[0.2, 0.01, 0.01], [0.01, 0.2, 0.01], [0.01, 0.01, 0.2]],
        transform=LocalDegreeProfile(),
    )
    dm = RelationalDataModule(ds, max_degree=4, expected_batch_size=10, neg_per_pos=2, eval_candidates=10)
    dm.setup()
    assert dm.sampling_spec.num_nodes == 180
    _check_tuple_batch(next(iter(dm.train_dataloader())), dm.train_inputs, 2)
    assert next(iter(dm.val_dataloader())).candidates.shape[1] == 11


class _PairSource(GraphSource):
    def __init__(self, train: Data, test: Data | None) -> None:
        self.train, self.test = train, test

    def load(self) -> GraphPair:
        return GraphPair(self.train, self.test, name="pair")


def test_graph_source_with_its_own_test_graph():
    dm = RelationalDataModule(_PairSource(random_feature_graph(100, 300), random_feature_graph(40, 90, seed=2)), expected_batch_size=4)
    dm.setup()
    assert dm.test_num_nodes == 40 and int(dm.eval_query.max()) < 40


# ----------------------------------------------------------------------------- bad input
def _data(n=20, ei=None, x=True) -> Data:
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]) if ei is None else ei
    return Data(x=torch.randn(n, 3) if x else None, edge_index=ei, num_nodes=n)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"max_degree": 0}, ValueError, r"`max_degree` must be an int >= 1, got 0"),
        ({"neg_per_pos": -1}, ValueError, r"`neg_per_pos` must be an int >= 0, got -1"),
        ({"expected_batch_size": 0}, ValueError, r"`expected_batch_size` \(b\) must be > 0 and finite, got 0"),
        ({"expected_batch_size": -2.5}, ValueError, r"`expected_batch_size` \(b\) must be > 0"),
        ({"capping": "greedy"}, ValueError, r"`capping` must be one of \('drop', 'assert'\), got 'greedy'"),
        ({"test_fraction": 1.0}, ValueError, r"`test_fraction` must be in \(0, 1\)"),
        ({"eval_candidates": 0}, ValueError, r"`eval_candidates` must be an int >= 1, got 0"),
        ({"max_degree": 2.5}, TypeError, r"`max_degree` must be an int"),
    ],
)
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        RelationalDataModule(_data(), **kwargs)


@pytest.mark.parametrize(
    ("data_fn", "kwargs", "match"),
    [
        (lambda: _data(ei=torch.zeros(2, 0, dtype=torch.long)), {}, r"`source` has no edges"),
        (lambda: _data(ei=torch.tensor([[0, 1], [0, 1]])), {}, r"no edges once self-loops are removed"),
        (lambda: _data(ei=torch.tensor([[0, 1], [1, 20]])), {}, r"node ids in \[0, 20\], outside \[0, num_nodes\) = \[0, 20\)"),
        (lambda: _data(x=False), {}, r"nodes have no features \(`data.x` is None\) and `tokenizer` is None"),
        (lambda: _data(), {"expected_batch_size": 50}, r"`expected_batch_size` \(b=50\) exceeds the 3 capped training relations"),
        (lambda: _data(), {"capping": "assert", "max_degree": 1}, r"capping='assert' needs max degree <= max_degree=1"),
    ],
)
def test_bad_graphs(data_fn, kwargs, match):
    opts = {"expected_batch_size": 1, "neg_per_pos": 1, "test_fraction": 0.25, **kwargs}
    with pytest.raises(ValueError, match=match):
        RelationalDataModule(data_fn(), **opts).setup()


def test_test_graph_with_no_relations():
    empty = Data(x=torch.randn(5, 3), edge_index=torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="the test graph has no relations to evaluate on"):
        RelationalDataModule(random_feature_graph(), test_source=empty, expected_batch_size=4).setup()
    bad = Data(x=torch.randn(5, 3), edge_index=torch.tensor([[0, 1], [1, 5]]))
    with pytest.raises(ValueError, match=r"`test_source.edge_index` holds node ids in \[0, 5\], outside \[0, num_nodes\) = \[0, 5\)"):
        RelationalDataModule(random_feature_graph(), test_source=bad, expected_batch_size=4).setup()


def test_source_missing_or_wrong_type():
    with pytest.raises(ValueError, match=r"`source` is None"):
        RelationalDataModule().setup()
    with pytest.raises(TypeError, match=r"`source` must be a GraphSource, a torch_geometric Data"):
        RelationalDataModule(torch.zeros(3)).setup()


def test_refuses_likely_negative_overflow_and_names_the_knobs():
    # n = 200, k = 8: |E+| may not exceed 25; with b = 20 that happens with probability ≈ 0.1.
    with pytest.raises(ValueError, match=r"P\(\|E\+\| > 25\) = .* lower expected_batch_size or neg_per_pos"):
        _feature_dm(expected_batch_size=20, neg_per_pos=8)
    _feature_dm(expected_batch_size=5, neg_per_pos=8)  # tail ≈ 1e-10: accepted


def test_runtime_overflow_raises_instead_of_truncating():
    dm = _feature_dm(expected_batch_size=26, neg_per_pos=8, max_overflow_probability=0.9, steps_per_epoch=200)
    with pytest.raises(RuntimeError, match=r"never truncated; lower expected_batch_size or neg_per_pos"):
        list(dm.train_dataloader())


def test_datamodule_capping_is_deterministic_and_within_k():
    dm = _feature_dm(max_degree=2)
    raw = random_feature_graph(200, 600, seed=1)
    assert int(torch.bincount(dm.train_edges.flatten()).max()) <= 2
    assert dm.sampling_spec.num_edges == dm.train_edges.shape[1]
    again = _feature_dm(max_degree=2)
    assert torch.equal(dm.train_edges, again.train_edges)
    assert set(map(tuple, dm.train_edges.t().tolist())) <= set(map(tuple, to_simple_undirected(raw.edge_index, 200).t().tolist()))
    ref = cap_degree(dm.train_edges, 200, 2, policy="assert")  # already within the cap: unchanged
    assert torch.equal(ref, dm.train_edges)


# ----------------------------------------------------------------------------- CLI
def test_lightning_cli_builds_the_datamodule_from_yaml_style_args():
    from pytorch_lightning.cli import LightningCLI

    cli = LightningCLI(
        _Recorder.make().__class__,
        RelationalDataModule,
        run=False,
        args=[
            "--data.source=datamodules.PyGSource",
            "--data.source.dataset=FakeDataset",
            "--data.max_degree=3",
            "--data.expected_batch_size=16",
            "--data.eval_candidates=20",
            "--trainer.logger=false",
        ],
    )
    dm = cli.datamodule
    assert isinstance(dm.source, PyGSource) and dm.max_degree == 3 and dm.eval_candidates == 20
