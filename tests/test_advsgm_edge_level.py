"""AdvSGM at the edge level (unit ``edge``): one relation is one tuple of the raw graph, the step moves by at most C when
a relation is removed, the ``skipgram_edge`` accounting is the per-example Poisson sampled Gaussian, and the unit is
refused for the node-level mechanisms and vice versa."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from test_advsgm_soundness import _released_sum  # the real step's clipped sum, σ = 0
from torch_geometric.data import Data

from lightning_dprel.accounting import Accountant, get_mechanism, per_step_rdp
from lightning_dprel.accounting.mechanisms import check_unit
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.demos.specs import make_spec
from lightning_dprel.export import export_model
from lightning_dprel.methods.advsgm import DPSkipGramModule, EdgeSkipGramDataModule, SkipGramDataModule
from lightning_dprel.methods.advsgm.accounting import EDGE

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _graph(n: int = 60, m: int = 300, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=g)
    return Data(edge_index=ei[:, ei[0] != ei[1]], num_nodes=n)


def _relations(edges: torch.Tensor, n: int) -> set[int]:
    return set((torch.minimum(edges[0], edges[1]) * n + torch.maximum(edges[0], edges[1])).tolist())


# ---------------------------------------------------------------- the unit and its accounting
def test_the_edge_mechanism_is_the_per_example_poisson_gaussian_and_matches_dp_accounting():
    mech = get_mechanism("skipgram_edge")
    assert mech.unit == EDGE and mech.clipping == ("standard",) and mech.accounting == "skipgram_edge" and mech.pld is not None
    spec = make_spec(4000, 36_000, K=1, gamma=600 / 36_000, k=1, unit="edge")
    np.testing.assert_array_equal(per_step_rdp("skipgram_edge", spec, 0.8), per_step_rdp("poisson_gaussian", make_spec(
        4000, 36_000, K=1, gamma=600 / 36_000, k=1, unit="example"), 0.8))
    acc = Accountant("skipgram_edge")
    acc.step(spec, 0.8, 2000)
    ours = acc.epsilon_bounds(1e-5)
    ref = PLDAccountant(value_discretization_interval=1e-4)
    ref.compose(dp_event.PoissonSampledDpEvent(600 / 36_000, dp_event.GaussianDpEvent(0.8)), 2000)
    assert ours["bound"] == "pld"
    assert ref.get_epsilon(1e-5) - 1e-4 <= ours["epsilon"] <= ref.get_epsilon(1e-5) + 0.01  # pessimistic, tight


@pytest.mark.parametrize("mechanism, unit", [("skipgram_edge", "node_public_ids"), ("skipgram_edge", "entity"),
                                             ("skipgram_public_ids", "edge"), ("standard", "edge"),
                                             ("subgraph_replace", "edge")])
def test_the_edge_unit_and_the_node_level_mechanisms_refuse_each_other(mechanism, unit):
    with pytest.raises(ValueError, match="Privacy unit mismatch"):
        check_unit(mechanism, unit)


@pytest.mark.parametrize("datamodule, accounting", [(EdgeSkipGramDataModule, "skipgram_public_ids"),
                                                    (EdgeSkipGramDataModule, "standard"),
                                                    (SkipGramDataModule, "skipgram_edge")])
def test_a_fit_with_the_other_levels_accounting_is_refused_before_step_one(datamodule, accounting):
    kwargs = {} if datamodule is EdgeSkipGramDataModule else {"max_degree": 4}
    dm = datamodule(_graph(), expected_batch_size=10, neg_per_pos=1, sampling_seed=0, **kwargs)
    module = DPSkipGramModule(num_nodes=60, dim=4, accounting=accounting)
    before = module.node_vectors.clone()
    with pytest.raises(ValueError, match="Privacy unit mismatch|holds only for uncapped data"):
        quiet_trainer([PrivacyCallback(target_epsilon=3.0, delta=1e-5, calibrate=True)], max_steps=2).fit(module, dm)
    assert torch.equal(module.node_vectors, before)


@pytest.mark.parametrize("option", [{"max_degree": 5}, {"capping": "assert"}])
def test_the_edge_level_datamodule_caps_nothing(option):
    with pytest.raises(ValueError, match="caps no degree"):
        EdgeSkipGramDataModule(_graph(), **option)


def test_removing_one_relation_from_the_raw_graph_removes_exactly_its_own_training_relation():
    """No cap and a per-relation hash split: for every relation e, train(G − e) = train(G) − {e}, nothing else moves."""
    data, n = _graph(40, 160), 40
    full = EdgeSkipGramDataModule(data, expected_batch_size=4, neg_per_pos=1, sampling_seed=0)
    full.setup("fit")
    train = _relations(full.train_edges, n)
    simple = sorted(_relations(data.edge_index, n))
    assert len(simple) > 100 and len(train) < len(simple)  # some relations are held out
    for key in simple:
        u, v = divmod(key, n)
        keep = ~(((data.edge_index[0] == u) & (data.edge_index[1] == v)) | ((data.edge_index[0] == v) & (data.edge_index[1] == u)))
        dm = EdgeSkipGramDataModule(Data(edge_index=data.edge_index[:, keep], num_nodes=n), expected_batch_size=4,
                                    neg_per_pos=1, sampling_seed=0)
        dm.setup("fit")
        assert _relations(dm.train_edges, n) == train - {key}


# ---------------------------------------------------------------- sensitivity through the real step
@pytest.mark.parametrize("mode, adversarial", [("ghost", 0.0), ("vmap", 0.0), ("ghost", 0.5)])
def test_removing_any_relation_of_a_real_batch_moves_the_released_sum_by_at_most_c(mode, adversarial):
    """Brute force over every relation of a real batch: ‖S(G) − S(G − e)‖ ≤ C, met with equality where a tuple's
    gradient was clipped (the rest of G − e's batch is G's batch without e's tuple: NEG-SAMPLE-WOR is exchangeable, and
    each tuple's fake neighbours are drawn i.i.d. with it)."""
    dm = EdgeSkipGramDataModule(_graph(80, 400), expected_batch_size=14, neg_per_pos=2, sampling_seed=5)
    dm.setup("fit")
    pos, neg, anchor = dm.stream.draw_global(0)
    assert pos.shape[0] > 5
    clip = 0.5
    module = DPSkipGramModule(num_nodes=80, dim=6, init_std=8.0, clip_norm=clip, noise_multiplier=0.0, optimizer="sgd",
                              lr=1.0, per_tuple_mode=mode, allow_untracked=True, accounting="skipgram_edge")
    fakes = torch.randn(pos.shape[0], 2, 6, generator=torch.Generator().manual_seed(0)) if adversarial else None
    full = _released_sum(module, dm.stream.make_batch(pos, neg, anchor, step=0), fakes)
    ratios = []
    for t in range(pos.shape[0]):
        keep = torch.arange(pos.shape[0]) != t
        batch = dm.stream.make_batch(pos[keep], neg[keep], anchor[keep], step=0)
        moved = float((full - _released_sum(module, batch, None if fakes is None else fakes[keep])).norm())
        ratios.append(moved / clip)
    assert max(ratios) <= 1 + 1e-5  # float32 tables
    assert sorted(ratios)[len(ratios) // 2] == pytest.approx(1.0, rel=1e-5)  # most tuples sit at norm C


def test_an_edge_level_fit_spends_at_most_its_budget_and_exports_its_unit(tmp_path):
    dm = EdgeSkipGramDataModule(_graph(), expected_batch_size=10, neg_per_pos=1, sampling_seed=0)
    module = DPSkipGramModule(dim=4, accounting="skipgram_edge")
    quiet_trainer([PrivacyCallback(target_epsilon=2.0, delta=1e-5, calibrate=True)], max_steps=25).fit(module, dm)
    assert module.privacy_ledger.private_mechanism == "skipgram_edge"
    assert dm.sampling_spec.privacy_unit == "edge" and dm.sampling_spec.max_degree >= 1 << 40
    assert 1.5 < module.privacy_ledger.epsilon(1e-5) <= 2.0
    export_model(module, tmp_path)
    privacy = json.loads((tmp_path / "privacy.json").read_text())
    assert privacy["mechanism"] == "skipgram_edge" and privacy["privacy_unit"] == str(EDGE)
    assert "not a node" in privacy["privacy_unit"]  # what it does not protect travels with the model


# ---------------------------------------------------------------- facts of the data the private edges may not set
def test_a_node_count_inferred_from_the_edges_is_refused():
    """PyG infers n from the largest id in edge_index: with (0, 9) as node 9's only edge the tables would have 10 rows
    with it and 6 without, so the shape alone would reveal the relation."""
    ei = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 5, 9]])
    dm = EdgeSkipGramDataModule(Data(edge_index=ei), expected_batch_size=2, neg_per_pos=1, sampling_seed=0)
    with pytest.raises(ValueError, match="states no node count"):
        dm.setup("fit")
    stated = EdgeSkipGramDataModule(Data(edge_index=ei, num_nodes=12), expected_batch_size=2, neg_per_pos=1, sampling_seed=0)
    stated.setup("fit")
    assert stated.num_nodes == 12


def test_a_transform_that_could_rewrite_the_relations_is_refused():
    from torch_geometric.transforms import TwoHop

    for datamodule in (EdgeSkipGramDataModule, SkipGramDataModule):
        with pytest.raises(ValueError, match="takes no `transform`"):
            datamodule(_graph(), transform=TwoHop())


def test_capped_data_is_refused_by_the_edge_mechanism_however_it_was_declared():
    class CappedButSaysEdge(SkipGramDataModule):
        privacy_unit = "edge"

    class CapsAfterInit(EdgeSkipGramDataModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.max_degree = 3

    for dm, match in ((CappedButSaysEdge(_graph(), max_degree=3, expected_batch_size=10, neg_per_pos=1, sampling_seed=0),
                       "holds only for uncapped data"),
                      (CapsAfterInit(_graph(), expected_batch_size=10, neg_per_pos=1, sampling_seed=0), "caps no degree")):
        module = DPSkipGramModule(num_nodes=60, dim=4, accounting="skipgram_edge")
        before = module.node_vectors.clone()
        with pytest.raises(ValueError, match=match):
            quiet_trainer([PrivacyCallback(target_epsilon=2.0, delta=1e-5, calibrate=True)], max_steps=2).fit(module, dm)
        assert torch.equal(module.node_vectors, before)
