"""The class count of a user's node graph is public: given by the user, never read from (private) labels.

Audit item (issue 32): ``InMemoryNodes`` set ``num_classes = y.max() + 1``; when the largest label sits on one private
node only, removing that node changed C (4 → 3), and with it every teacher's answer head in DP-GPL and the classifier
of DP-GCN. Neighbouring graphs must get the same C and the same models.
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_dprel.demos import node_removed
from lightning_dprel.datamodules.datasets import SyntheticNodes
from lightning_dprel.datamodules.datasets.nodes import InMemoryNodes
from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
from lightning_dprel.methods.dp_gpl import GraphEncoder, PromptDataModule, TuningConfig, pretrain, train_teachers_and_vote

pytestmark = [pytest.mark.filterwarnings("ignore:.*(public seed|sampling_seed).*:UserWarning"), pytest.mark.usefixtures("one_thread")]

TEACHERS, QUERIES, CLASSES = 6, 12, 4
CFG = TuningConfig("gpf_plus", epochs=15, lr=0.05)


def _gpl(source: InMemoryNodes) -> PromptDataModule:
    dm = PromptDataModule(source, num_teachers=TEACHERS, num_queries=QUERIES, fanout=5, partition_seed=3)
    dm.setup()
    return dm


def _graph_with_a_lone_top_class() -> tuple[Data, int]:
    """Labels 0..2 everywhere, label 3 on one private training node only (private for DP-GPL and DP-GCN); no C set."""
    dm = _gpl(SyntheticNodes(160, 3, dim=8, avg_degree=8.0, homophily=0.7, feature_noise=1.5, seed=4))
    data = dm.data.clone()
    del data.num_classes
    v = int((dm.private & data.train_mask).nonzero()[0])
    data.y[v] = CLASSES - 1
    return data, v


def test_the_class_count_is_never_read_from_the_labels():
    data, v = _graph_with_a_lone_top_class()
    for graph in (data, node_removed(data, v)):  # y.max() + 1 would be 4, then 3
        with pytest.raises(ValueError, match="num_classes"):
            InMemoryNodes(graph).load()


def test_neighbouring_graphs_get_the_same_class_count():
    data, v = _graph_with_a_lone_top_class()
    counts = set()
    for graph in (data, node_removed(data, v)):
        assert int(InMemoryNodes(graph, num_classes=CLASSES).load().num_classes) == CLASSES
        gcn = NodeSplitDataModule(InMemoryNodes(graph, num_classes=CLASSES), num_splits=10, sampling_seed=3)
        counts |= {gcn.num_classes, _gpl(InMemoryNodes(graph, num_classes=CLASSES)).num_classes}
    assert counts == {CLASSES}
    assert not hasattr(data, "num_classes") or data.num_classes is None  # the caller's graph is not modified


def test_removing_the_lone_top_class_node_moves_at_most_its_own_teachers_votes():
    data, v = _graph_with_a_lone_top_class()
    dm = _gpl(InMemoryNodes(data, num_classes=CLASSES))
    encoder = pretrain(GraphEncoder(dm.num_features, 16), *dm.public_graph(), epochs=5)
    votes = []
    for graph in (data, node_removed(data, v)):
        d = _gpl(InMemoryNodes(graph, num_classes=CLASSES))
        examples, labels, teacher = d.teacher_examples()
        votes.append(train_teachers_and_vote(encoder, d.data.x, examples, labels, teacher, d.query_examples(),
                                             num_teachers=TEACHERS, num_classes=d.num_classes, cfg=CFG, chunk=TEACHERS))
    moved = {i for i in range(TEACHERS) if not torch.equal(votes[0][i], votes[1][i])}
    assert moved <= {int(dm.teacher[v])}, f"removing node {v} (teacher {int(dm.teacher[v])}) moved teachers {sorted(moved)}"


def test_a_class_count_below_a_present_label_is_refused():
    data, _ = _graph_with_a_lone_top_class()
    with pytest.raises(ValueError, match=r"label 3 .*num_classes=3"):
        InMemoryNodes(data, num_classes=3).load()
    data.y[0] = -1
    with pytest.raises(ValueError, match="label -1"):
        InMemoryNodes(data, num_classes=CLASSES).load()


def test_a_class_count_on_the_graph_is_the_users_and_must_agree():
    data = SyntheticNodes(60, 3, dim=4, seed=1).load()  # the generator's C = 3 travels on the graph
    assert int(InMemoryNodes(data).load().num_classes) == 3
    assert int(InMemoryNodes(data, num_classes=3).load().num_classes) == 3
    with pytest.raises(ValueError, match="num_classes=5.*3"):
        InMemoryNodes(data, num_classes=5).load()
    for bad in (1, 2.0, True):
        with pytest.raises((TypeError, ValueError), match="num_classes"):
            InMemoryNodes(data, num_classes=bad)
