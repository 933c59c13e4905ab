"""DP-GPL query groups: one vote per teacher per public cluster of queries (GNMax, no threshold), every public training
node of an answered cluster labelled for the student; groups from public data only, one node moves one teacher's group
votes (brute force through the real teachers), the ledger equals dp-accounting, bad input refused."""

from __future__ import annotations

import math

import pytest
import torch
from test_dp_gpl_method import SMALL, _fit

from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.datasets import SyntheticNodes
from lightning_dprel.datamodules.datasets.nodes import InMemoryNodes
from lightning_dprel.demos.boring_classes import tiny_prompt_dm
from lightning_dprel.methods.dp_gpl import DPGPLModule, PromptDataModule, gnmax, group_votes, public_clusters, vote_histogram

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("one_thread")]


# ----------------------------------------------------------------------------- the pieces
def test_group_vote_is_each_teachers_most_frequent_class_on_the_groups_queries():
    votes = torch.tensor([[0, 1, 1, 2, 2, 0],
                          [2, 2, 0, 0, 1, 1]])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    out = group_votes(votes, group, num_groups=3, num_classes=3)
    # teacher 0: group 0 -> {0, 1, 1} = 1; group 1 -> {2, 2, 0} = 2; teacher 1: {2, 2, 0} = 2; {0, 1, 1} = 1; group 2 empty
    assert out.tolist() == [[1, 2, -1], [2, 1, -1]]
    tie = group_votes(torch.tensor([[2, 1]]), torch.tensor([0, 0]), num_groups=1, num_classes=3)
    assert tie.tolist() == [[1]]  # ties go to the lowest class: a function of the teacher's own votes only
    for g in torch.randint(0, 4, (5, 12)):
        v = torch.randint(0, 3, (6, 12))
        out = group_votes(v, g, 4, 3)
        for j in g.unique().tolist():
            want = torch.stack([torch.bincount(v[i, g == j], minlength=3).argmax() for i in range(6)])
            assert torch.equal(out[:, j], want)


def test_group_votes_and_clusters_refuse_bad_input():
    with pytest.raises(ValueError, match="one group per query"):
        group_votes(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, dtype=torch.long), 1, 2)
    with pytest.raises(ValueError, match="outside"):
        group_votes(torch.zeros(2, 2, dtype=torch.long), torch.tensor([0, 5]), 2, 2)
    for k in (0, 11, True, 2.0):
        with pytest.raises(ValueError, match="`k`"):
            public_clusters(torch.randn(10, 3), k)
    with pytest.raises(ValueError, match="σ₂"):
        gnmax(torch.ones(3, 2), sigma_vote=0.0, stream=KeyedStream.seeded(0, "t", warn=False))


def test_public_clusters_are_a_function_of_the_features_and_seed():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(40, 4, generator=g) + 10 * torch.eye(4)[i] for i in range(4)])
    a, b = public_clusters(x, 4, seed=1), public_clusters(x, 4, seed=1)
    assert torch.equal(a, b) and a.unique().numel() == 4
    blocks = a.view(4, 40)  # four well-separated blobs: each is one cluster
    assert all(row.unique().numel() == 1 for row in blocks) and blocks[:, 0].unique().numel() == 4


def test_gnmax_answers_every_query_with_the_noisy_argmax():
    counts = torch.tensor([[90.0, 5.0, 5.0], [0.0, 0.0, 100.0]]).repeat(50, 1)
    a = gnmax(counts, sigma_vote=5.0, stream=KeyedStream.seeded(3, "t", warn=False))
    assert bool(a.answered.all()) and a.labels.tolist() == [0, 2] * 50
    noisy = gnmax(torch.tensor([[10.0, 9.0]]).repeat(400, 1), sigma_vote=20.0, stream=KeyedStream.seeded(4, "t", warn=False))
    assert 0.3 < noisy.labels.float().mean().item() < 0.7  # the noise decides close votes


# ----------------------------------------------------------------------------- the datamodule
def test_groups_come_from_public_nodes_only():
    dm = tiny_prompt_dm(query_groups=5)
    dm.setup()
    data = dm.data.clone()
    g = torch.Generator().manual_seed(0)
    data.x[dm.private] = torch.randn(int(dm.private.sum()), data.x.shape[1], generator=g) * 50  # private rows rewritten
    data.y[dm.private] = (data.y[dm.private] + 1) % 3
    other = tiny_prompt_dm(InMemoryNodes(data), query_groups=5)
    other.setup()
    assert torch.equal(other.cluster, dm.cluster) and torch.equal(other.groups, dm.groups)
    assert torch.equal(other.query_group, dm.query_group)
    assert bool((dm.cluster[dm.private] == -1).all()) and bool(dm.public[dm.pool].all())
    assert dm.num_vote_queries == dm.groups.numel() <= 5 and dm.query_group.shape == (30,)


def test_an_answered_group_labels_every_public_training_node_of_its_cluster():
    dm = tiny_prompt_dm(query_groups=5)
    dm.setup()
    g = dm.num_vote_queries
    answered = torch.tensor([i % 2 == 0 for i in range(g)])
    labels = torch.where(answered, torch.arange(g) % 3, torch.full((g,), -1))
    dm.set_answers(answered, labels)
    nodes = dm.student_batch.rows[dm.student_batch.center]
    want = dm.pool[torch.isin(dm.cluster[dm.pool], dm.groups[answered])]
    assert torch.equal(nodes, want) and nodes.numel() > answered.sum()
    label_of = dict(zip(dm.groups[answered].tolist(), labels[answered].tolist()))
    assert dm.student_labels.tolist() == [label_of[int(c)] for c in dm.cluster[nodes]]
    assert bool(dm.public[dm.student_batch.rows].all())  # the student never reads a private row


# ----------------------------------------------------------------------------- sensitivity, by brute force
def test_removing_a_private_node_moves_at_most_its_own_teachers_group_votes():
    from test_dp_gpl_sensitivity import _votes

    from lightning_dprel.demos import node_removed

    data = SyntheticNodes(160, 3, dim=8, avg_degree=8.0, homophily=0.7, feature_noise=1.5, seed=4).load()
    dm, encoder, base = _votes(data, "public")
    dm_g = PromptDataModule(InMemoryNodes(data), num_teachers=6, num_queries=12, fanout=5, partition_seed=3, query_groups=4)
    dm_g.setup()
    groups = dm_g.num_vote_queries
    base_g = group_votes(base, dm_g.query_group, groups, 3)
    moved_any = False
    for v in dm.private.nonzero().view(-1)[:12].tolist():
        _, _, votes = _votes(node_removed(data, v), "public", encoder)
        after = group_votes(votes, dm_g.query_group, groups, 3)  # the clusters are public: unchanged by v
        moved = {i for i in range(6) if not torch.equal(after[i], base_g[i])}
        moved_any |= bool(moved)
        assert moved <= {int(dm.teacher[v])}, (v, moved)
        diff = vote_histogram(after, 3) - vote_histogram(base_g, 3)
        assert float(diff.abs().max()) <= 1 and float(diff.norm(dim=1).max()) <= math.sqrt(2) + 1e-12
    assert moved_any, "no removal moved a group vote: the test could not see a change"


# ----------------------------------------------------------------------------- the module
def test_gnmax_over_groups_charges_one_vote_release_per_group_equal_to_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    dm, module = tiny_prompt_dm(query_groups=5), DPGPLModule(target_epsilon=2.0, threshold=None, **SMALL)
    _fit(module, dm, epochs=20)
    s1, s2 = module.sigmas
    g = dm.num_vote_queries
    assert s1 is None and module.answers.num_answered == g == module.answers.answered.numel()
    acc = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(s2 / math.sqrt(2.0)), g)
    bounds = module.privacy_ledger.epsilon_bounds(1e-5)
    assert bounds["rdp"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    tight = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)  # g Gaussian releases: one PLD
    tight.compose(dp_accounting.GaussianDpEvent(s2 / math.sqrt(2.0)), g)
    assert tight.get_epsilon(1e-5) - 1e-6 <= module.epsilon() == bounds["pld"] <= tight.get_epsilon(1e-5) + 5e-3
    assert module.epsilon() == pytest.approx(2.0, rel=1e-6)
    assert dm.student_batch.size == dm.pool.numel()  # every group answered: the whole public training pool
    report = module.privacy_report()
    assert report["mechanism"].startswith("GNMax") and report["query_groups"] == 5 and report["sigma_threshold"] is None
    assert "query groups" in module.privacy_summary()["text"]


def test_grouped_answers_survive_a_checkpoint_and_other_groups_are_refused(tmp_path):
    dm, module = tiny_prompt_dm(query_groups=5), DPGPLModule(target_epsilon=4.0, threshold=None, **SMALL)
    trainer = _fit(module, dm, epochs=3)
    trainer.save_checkpoint(str(tmp_path / "m.ckpt"))
    back = DPGPLModule.load_from_checkpoint(str(tmp_path / "m.ckpt"))
    assert back.query_groups == 5 and torch.equal(back.answers.labels, module.answers.labels)
    with pytest.raises(ValueError, match="other queries"):
        _fit(module, tiny_prompt_dm(query_groups=3), epochs=4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(threshold=None, answer_budget=5), "threshold=None"), (dict(threshold=None, mode="paper"), "threshold=None"),
])
def test_gnmax_without_threshold_refuses_settings_it_cannot_honour(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPGPLModule(**kwargs)


def test_bad_query_groups_are_refused():
    for k in (0, -2, True, 2.5):
        with pytest.raises(ValueError, match="query_groups"):
            tiny_prompt_dm(query_groups=k)
    dm = tiny_prompt_dm(query_groups=10_000)
    with pytest.raises(ValueError, match="exceeds"):
        dm.setup()
