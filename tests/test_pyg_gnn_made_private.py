"""Recipe 3: node-level DP for an existing PyG GNN (issue 33) — your own LightningModule on DP-GCN's subgraphs.

The project below (``NodeClassifier``: a torch_geometric GCN, masked cross-entropy on ``batch.train_mask``,
``self.log``, Adam; ``FullGraphDataModule``: the whole graph as one ``Data``; the graph is the user's own ``Data`` of
x, y, edge_index and train/val/test masks, with no ``node_id`` and no ``num_classes``: ``_own_graph``) is made private
by 12 changed lines; ``training_step`` and the GNN stay as they are (``fit_existing`` → ``fit_private`` below; a
larger learning rate for the fewer, noisier steps; at 0.05 the last iterate's accuracy had a heavy low tail)::

    +from lightning_dprel import NodeSplitDataModule, PrivacyCallback
    +from lightning_dprel.datamodules.datasets import InMemoryNodes
    +NUM_CLASSES = 4  # public: the size of your label set, never y.max() + 1 (that reads the private labels)
     ...
    -    model = NodeClassifier(data.num_features, int(data.y.max()) + 1)
    -    dm = FullGraphDataModule(data)
    -    trainer = pl.Trainer(max_epochs=100, **QUIET)
    +    data.node_id = torch.arange(data.num_nodes)  # stable public ids: your database keys (here rows never move)
    +    model = NodeClassifier(data.num_features, NUM_CLASSES, lr=0.02)
    +    dm = NodeSplitDataModule(InMemoryNodes(data, num_classes=NUM_CLASSES), num_splits=200, sampling_rate=0.125,
    +                             as_pyg_batches=True)
    +    cb = PrivacyCallback(target_epsilon=8.0, delta=1e-5, clip_norm=1.0, calibrate=True)
    +    trainer = pl.Trainer(max_epochs=5, callbacks=[cb], **QUIET)

The class count C and ``data.node_id`` are the two facts a user's own ``Data`` lacks: C is public (read from the
labels it changes when the one node holding the largest label is removed, tests/test_class_count_is_public.py), and
the keyed split hashes stable ids (row numbers move when a node is removed). Without either, setup refuses with the
fix named (``test_a_users_own_data_without_num_classes_or_node_id_is_refused_with_both_fixes_named``).

Random graph splits (Igamberdiev & Habernal 2022, Sec. 4) under a keyed partition: removing a node changes one
subgraph example, so each step's clipped sum moves by at most 2C (replace-one), charged by ``subgraph_replace``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader as PyGDataLoader
from torch_geometric.nn import GCNConv
from torch.utils.data import TensorDataset

from lightning_dprel import NodeSplitDataModule, PrivacyCallback
from lightning_dprel.accounting import Accountant
from lightning_dprel.accounting.analysis.substitution import substitution_rdp
from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.mechanisms import per_step_rdp
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.datamodules.datasets import InMemoryNodes, SyntheticNodes
from lightning_dprel.datamodules.poisson import DPDataLoader
from lightning_dprel.demos import node_removed

ADD_NOISE = DPOptimizer.add_noise  # the library's, wrapped by the recording tests below


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread: tiny per-subgraph ops lose more to intra-op thread contention than they gain (2-core CI)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1, log_every_n_steps=1)
DELTA = 1e-5


# --- the existing project, written without lightning_dprel ----------------------------------------------------------
class GCN(torch.nn.Module):
    """Two GCN layers (Kipf & Welling 2017) with ReLU and dropout."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1, self.conv2, self.dropout = GCNConv(in_dim, hidden), GCNConv(hidden, num_classes), dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, edge_index))
        return self.conv2(F.dropout(x, self.dropout, self.training), edge_index)


class NodeClassifier(pl.LightningModule):
    def __init__(self, in_dim: int, num_classes: int, hidden: int = 32, dropout: float = 0.5, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.gnn = GCN(in_dim, hidden, num_classes, dropout)

    def training_step(self, batch, batch_idx):
        out = self.gnn(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=1)
        return loss

    def _accuracy(self, batch, mask):
        pred = self.gnn(batch.x, batch.edge_index).argmax(-1)
        return (pred[mask] == batch.y[mask]).float().mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", self._accuracy(batch, batch.val_mask), batch_size=1)

    def test_step(self, batch, batch_idx):
        self.log("test_acc", self._accuracy(batch, batch.test_mask), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class FullGraphDataModule(pl.LightningDataModule):
    """The whole graph, one batch per epoch (full-batch GCN training)."""

    def __init__(self, data: Data) -> None:
        super().__init__()
        self.data = data

    def train_dataloader(self):
        return PyGDataLoader([self.data], batch_size=1)

    val_dataloader = test_dataloader = train_dataloader


def fit_existing(data: Data, *, seed: int):
    torch.manual_seed(seed)
    model = NodeClassifier(data.num_features, int(data.y.max()) + 1)  # as PyG's dataset.num_classes computes it
    dm = FullGraphDataModule(data)
    trainer = pl.Trainer(max_epochs=100, **QUIET)
    trainer.fit(model, datamodule=dm)
    return model, trainer


# --- the same project, private (the diff above) -----------------------------------------------------------------------
NUM_CLASSES = 4  # public: the size of your label set, never y.max() + 1 (that reads the private labels)


def fit_private(data: Data, *, seed: int):
    torch.manual_seed(seed)
    data.node_id = torch.arange(data.num_nodes)  # stable public ids: your database keys (here rows never move)
    model = NodeClassifier(data.num_features, NUM_CLASSES, lr=0.02)
    dm = NodeSplitDataModule(InMemoryNodes(data, num_classes=NUM_CLASSES), num_splits=200, sampling_rate=0.125,
                             as_pyg_batches=True)
    cb = PrivacyCallback(target_epsilon=8.0, delta=1e-5, clip_norm=1.0, calibrate=True)
    trainer = pl.Trainer(max_epochs=5, callbacks=[cb], **QUIET)
    trainer.fit(model, datamodule=dm)
    return model, trainer


def _graph(seed: int = 0, n: int = 600) -> Data:
    return SyntheticNodes(n, 4, dim=16, seed=seed).load()


def _own_graph(seed: int = 0, n: int = 600) -> Data:
    """A user's own graph: plain x, y, edge_index and train/val/test masks; no ``node_id``, no ``num_classes``."""
    g = _graph(seed, n)
    return Data(x=g.x, y=g.y, edge_index=g.edge_index, train_mask=g.train_mask, val_mask=g.val_mask, test_mask=g.test_mask)


def _test_accuracy(model: NodeClassifier, data: Data) -> float:
    model.eval()
    with torch.no_grad():
        return float(model._accuracy(data, data.test_mask))


def _privacy(trainer: pl.Trainer) -> PrivacyCallback:
    return next(cb for cb in trainer.callbacks if isinstance(cb, PrivacyCallback))


@pytest.fixture(scope="module")
def runs():
    """Per seed: the graph, the untrained model's test accuracy, the private fit and the existing (non-private) model."""
    out = []
    for seed in range(3):
        data = _own_graph(seed)
        assert "node_id" not in data and "num_classes" not in data  # what fit_private's diff adds
        torch.manual_seed(seed)
        untrained = _test_accuracy(NodeClassifier(data.num_features, NUM_CLASSES), data)
        out.append((data, untrained, fit_private(data, seed=seed), fit_existing(data, seed=seed)[0]))
    return out


# --- (a) it trains privately and reports the accountant's ε for what ran ------------------------------------------
@pytest.mark.slow
def test_plain_gcn_trains_privately_and_epsilon_is_the_subgraph_replace_accountants(runs):
    data, _, (model, trainer), _ = runs[0]
    cb = _privacy(trainer)
    ledger = cb.ledger  # the attached DP-SGD layer's ledger (saved in checkpoints under "lightning_dprel")
    (segment,) = ledger.segments
    spec = trainer.datamodule.sampling_spec
    assert segment.mechanism == cb.mechanism == "subgraph_replace" and segment.sampling == spec
    assert segment.steps == cb.steps == 40 and spec.sampling_rate == 0.125 and spec.expected_batch_size == 25.0
    sigma = segment.noise_multiplier
    acc = Accountant("subgraph_replace")
    acc.step(spec, sigma, segment.steps)
    assert cb.epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    by_hand, _ = rdp_to_epsilon(DEFAULT_ORDERS, segment.steps * substitution_rdp(0.125, sigma, DEFAULT_ORDERS), DELTA)
    np.testing.assert_allclose(per_step_rdp("subgraph_replace", spec, sigma), substitution_rdp(0.125, sigma, DEFAULT_ORDERS))
    bounds = ledger.epsilon_bounds(DELTA)
    assert bounds["rdp"] == pytest.approx(by_hand, rel=1e-9) and 7.0 < cb.epsilon <= 8.0  # calibrated to the budget
    # the reported ε is the replace-one PLD (dp-accounting's REPLACE_ONE pair, composed), far below the RDP bound
    from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism
    from dp_accounting.privacy_accountant import NeighboringRelation

    ref = from_gaussian_mechanism(sigma, sampling_prob=0.125, value_discretization_interval=1e-4,
                                  neighboring_relation=NeighboringRelation.REPLACE_ONE).self_compose(segment.steps)
    assert cb.epsilon == bounds["pld"] < by_hand
    assert ref.get_epsilon_for_delta(DELTA) - 1e-6 <= cb.epsilon <= ref.get_epsilon_for_delta(DELTA) + 5e-3
    # the module is the user's again; its validation/test steps ran on the whole graph as one Data with its masks
    assert "training_step" not in model.__dict__ and "val_acc" in trainer.callback_metrics
    tested = trainer.test(model, datamodule=trainer.datamodule, verbose=False)[0]["test_acc"]
    assert tested == pytest.approx(_test_accuracy(model, data), abs=1e-6)


# --- (b) sensitivity through the real step ----------------------------------------------------------------------------
def _clipped_sums(graph: Data, template: NodeClassifier, monkeypatch, clip: float, steps: int = 3) -> torch.Tensor:
    """Each step's clipped sum before noise (DPOptimizer.add_noise's input), lr = 0 so every step sees the same Θ."""
    sums = []

    def recording(self, summed, noise="draw"):
        sums.append(torch.cat([t.detach().reshape(-1) for t in summed.values()]).clone())
        return ADD_NOISE(self, summed, noise)

    monkeypatch.setattr(DPOptimizer, "add_noise", recording)
    with pytest.warns(UserWarning, match="void"):  # a public sampling seed: the same split and samples on both graphs
        dm = NodeSplitDataModule(InMemoryNodes(graph), num_splits=40, sampling_rate=0.5, sampling_seed=5, as_pyg_batches=True)
    cb = PrivacyCallback(delta=DELTA, clip_norm=clip, noise_multiplier=1.0)
    pl.Trainer(max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[cb], **QUIET).fit(
        copy.deepcopy(template), datamodule=dm)
    assert cb.steps == steps
    return torch.stack(sums)


def test_removing_a_node_moves_each_steps_clipped_sum_by_at_most_2C(monkeypatch):
    """The user's own training_step per subgraph, clipped by the DP optimizer: a node removal changes one subgraph,
    so each step's sum moves by ≤ 2C; some removal moves it by more than C (add/remove's C would under-state it)."""
    data = SyntheticNodes(120, 3, dim=8, avg_degree=8, seed=1).load()
    torch.manual_seed(0)
    template = NodeClassifier(8, 3, hidden=8, dropout=0.0, lr=0.0)
    clip = 1e-3  # every subgraph's gradient is clipped: the worst case
    base = _clipped_sums(data, template, monkeypatch, clip)
    train_nodes = torch.nonzero(data.train_mask).view(-1)[:8].tolist()
    moved = [float(torch.linalg.vector_norm(base - _clipped_sums(node_removed(data, v), template, monkeypatch, clip), dim=1).max())
             for v in train_nodes]
    assert max(moved) <= 2 * clip * (1 + 1e-6)
    assert max(moved) > clip


# --- (c) the same GNN on rows of nodes (the example unit) is refused -----------------------------------------------
class FullGraphOnNodeRows(NodeClassifier):
    """The same GNN, trained full-graph on Poisson rows of node ids: each row's loss reads its neighbours' data."""

    def __init__(self, data: Data) -> None:
        super().__init__(data.num_features, int(data.num_classes))
        self.graph = data

    def training_step(self, batch, batch_idx):
        (nodes,) = batch
        out = self.gnn(self.graph.x, self.graph.edge_index)[nodes]
        return F.cross_entropy(out, self.graph.y[nodes])


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")  # rows only here
def test_gnn_under_the_example_unit_is_refused_naming_the_dp_gcn_route():
    data = _graph(0, n=100)
    model = FullGraphOnNodeRows(data)
    before = copy.deepcopy(model.state_dict())
    trainer = pl.Trainer(max_steps=2, callbacks=[PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=1.0)], **QUIET)
    loader = DPDataLoader(TensorDataset(torch.nonzero(data.train_mask).view(-1)), batch_size=16)
    with pytest.raises(ValueError, match=r"passes messages along the graph.*NodeSplitDataModule\(source, as_pyg_batches=True\)"):
        trainer.fit(model, loader)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # refused before step 1
    assert "training_step" not in model.__dict__  # the module got its own step back


# --- a user's own Data: the two public facts the diff adds ------------------------------------------------------------
def test_a_users_own_data_without_num_classes_or_node_id_is_refused_with_both_fixes_named():
    data = _own_graph(0, n=200)

    def setup(source):
        NodeSplitDataModule(source, num_splits=8, sampling_rate=0.5, as_pyg_batches=True).setup("fit")

    with pytest.raises(ValueError, match=r"no class count\. Pass InMemoryNodes\(data, num_classes=C\).*not read from `y`"
                                         r".*no `node_id` either.*`data\.node_id`, stable, unique int64 ids"):
        setup(InMemoryNodes(data))
    with pytest.raises(ValueError, match=r"no `node_id`.*Set `data\.node_id` to stable, unique int64 ids"):
        setup(InMemoryNodes(data, num_classes=NUM_CLASSES))
    assert "node_id" not in data and "num_classes" not in data  # refusals leave the caller's graph as it was
    data.node_id = torch.arange(data.num_nodes)  # the diff's two lines: then it sets up
    dm = NodeSplitDataModule(InMemoryNodes(data, num_classes=NUM_CLASSES), num_splits=8, sampling_rate=0.5,
                             as_pyg_batches=True)
    dm.setup("fit")
    assert dm.num_classes == NUM_CLASSES and torch.equal(dm.data.node_id, torch.arange(200))
    with pytest.raises(ValueError, match="no class count") as only_c:  # ids but no count: only C is named
        setup(InMemoryNodes(data))
    assert "node_id" not in str(only_c.value)


# --- the datamodule's PyG batches -------------------------------------------------------------------------------------
def test_pyg_batches_are_the_subgraphs_and_the_whole_graph_for_evaluation():
    data = _graph(1, n=200)
    with pytest.warns(UserWarning, match="void"):
        dm = NodeSplitDataModule(InMemoryNodes(data), num_splits=8, sampling_rate=0.5, sampling_seed=2, as_pyg_batches=True)
    dm.setup("fit")
    chosen = dm.sampled(0)
    batch = dm.next_batch()
    assert batch.num_graphs == len(chosen) > 0 and type(dm.example_view).__name__ == "SubgraphGraphs"
    for j, graph in zip(chosen, batch.to_data_list()):
        x, edge_index, y, mask = dm.example(j)
        assert torch.equal(graph.x, x) and torch.equal(graph.edge_index, edge_index) and torch.equal(graph.y, y)
        assert torch.equal(graph.train_mask, mask) and bool(mask.all())  # local ids; every node of a subgraph is fit
        assert graph.edge_index.numel() == 0 or int(graph.edge_index.max()) < graph.num_nodes
    (val,) = list(dm.val_dataloader())
    (test,) = list(dm.test_dataloader())
    for graph in (val, test):
        assert isinstance(graph, Data) and graph.num_nodes == data.num_nodes
        for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(graph[key], data[key])
    plain = NodeSplitDataModule(InMemoryNodes(data), num_splits=8)  # unchanged without the flag
    assert not hasattr(plain, "example_view") and type(plain.next_batch()).__name__ == "ExampleBatch"
    with pytest.raises(ValueError, match="as_pyg_batches.*mode='provable'"):
        NodeSplitDataModule(InMemoryNodes(data), mode="paper_faithful", as_pyg_batches=True)


def test_an_empty_sample_is_an_empty_batch_and_still_releases_noise(monkeypatch):
    data = _graph(1, n=200)
    noises = []

    def recording(self, summed, noise="draw"):
        out = ADD_NOISE(self, summed, noise)
        noises.append(torch.cat([(o - s).reshape(-1) for o, s in zip(out.values(), summed.values())]))
        return out

    monkeypatch.setattr(DPOptimizer, "add_noise", recording)
    with pytest.warns(UserWarning, match="void"):
        dm = NodeSplitDataModule(InMemoryNodes(data), num_splits=20, sampling_rate=0.05, sampling_seed=0, as_pyg_batches=True)
    dm.setup("fit")
    sizes = [len(dm.sampled(t)) for t in range(6)]
    assert 0 in sizes  # some of these steps draw no subgraph
    empty = dm.pyg_batch([])
    assert empty.num_graphs == 0 and dm.example_view.size(empty) == 0 and empty.x.shape == (0, data.num_features)
    cb = PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=2.0)
    pl.Trainer(max_steps=6, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[cb], **QUIET).fit(
        NodeClassifier(data.num_features, 4), datamodule=dm)
    assert cb.steps == 6 and len(noises) == 6
    # N(0, σ²C²) on every step, the empty ones too; secret noise: a std's s.e. is 0.054 per step (676 draws), 0.022 pooled
    assert all(abs(float(n.std()) - 2.0) < 0.5 for n in noises)
    assert abs(float(torch.cat(noises).std()) - 2.0) < 0.15


# --- (d) utility ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_private_gcn_beats_the_untrained_model_at_a_proven_epsilon_of_at_most_8(runs):
    rows = []
    for data, untrained, (private, trainer), existing in runs:
        cb = _privacy(trainer)
        assert cb.epsilon <= 8.0 and cb.mechanism == "subgraph_replace"
        rows.append((untrained, _test_accuracy(private, data), _test_accuracy(existing, data), cb.epsilon))
    for untrained, private, existing, eps in rows:
        print(f"untrained {untrained:.3f}  private {private:.3f} (ε = {eps:.3f})  non-private {existing:.3f}  "
              f"ratio {private / existing:.3f}")
    assert all(private > untrained + 0.15 for untrained, private, _, _ in rows)
