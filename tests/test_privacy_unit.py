"""The privacy unit is declared by the data, proven by the mechanism, and a mismatch is refused before step 1.

Also: δ defaults and the "δ ≥ 1/n" warning count privacy units (entities, nodes), not examples or subgraphs.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lightning_dprel.accounting import Accountant, get_mechanism, registered_mechanisms
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets.nodes import SyntheticNodes
from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.core.events import StepRecord
from lightning_dprel.methods.dp_gcn.gnn import GNNClassifier
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.methods.dp_gcn.module import DPNodeModule
from lightning_dprel.core.specs import (
    PRIVACY_UNITS, PrivacyUnit, SamplingSpec, register_privacy_unit,
)
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY
from lightning_dprel.methods.dp_gcn.accounting import NODE_IN_SUBGRAPH

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|does not have many workers|paper_faithful).*")


def _relational_dm() -> RelationalDataModule:
    return RelationalDataModule(random_feature_graph(300, 900, dim=16, seed=0), expected_batch_size=6, neg_per_pos=2,
                                max_degree=3, sampling_seed=1)


def _node_dm() -> NodeSplitDataModule:
    return NodeSplitDataModule(SyntheticNodes(200, 3, dim=8, seed=2), num_splits=10, sampling_rate=0.5, sampling_seed=3)


def test_relational_module_with_a_subgraph_mechanism_is_refused_before_the_first_step():
    dm = _relational_dm()
    dm.setup("fit")
    spec = dm.sampling_spec
    # What the finding saw: the subgraph bound reports ≈ 4.4 for 30 steps where Theorem C.1 for the run gives ≈ 18.3.
    wrong, right = Accountant("subgraph_replace"), Accountant("standard")
    wrong.step(spec, 1.0, 30)
    right.step(spec, 1.0, 30)
    assert wrong.get_epsilon(1 / spec.num_edges) < 0.3 * right.get_epsilon(1 / spec.num_edges)
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), clipping="standard",
                                accounting="subgraph_replace", noise_multiplier=1.0, noise_seed=0)
    with pytest.raises(ValueError, match=r"(?s)Privacy unit mismatch.*'subgraph_replace'.*'node_in_subgraph'.*'entity'"):
        quiet_trainer([PrivacyCallback()], max_steps=30).fit(module, datamodule=dm)
    assert module.privacy_ledger.steps == 0


def test_untracked_fit_checks_the_unit_too():
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), clipping="standard",
                                accounting="subgraph_replace", noise_multiplier=1.0, noise_seed=0, allow_untracked=True)
    with pytest.raises(ValueError, match=r"Privacy unit mismatch.*'subgraph_replace'"), pytest.warns(UserWarning, match="allow_untracked=True"):
        quiet_trainer(max_steps=30).fit(module, datamodule=_relational_dm())
    assert module.privacy_ledger.steps == 0


def test_node_module_with_an_entity_mechanism_is_refused_before_the_first_step():
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), accounting="corrected", noise_multiplier=1.0,
                          noise_seed=0)
    assert module.noise_spec.mechanism == "standard"  # Theorem C.1, proven for entities
    with pytest.raises(ValueError, match=r"(?s)Privacy unit mismatch.*'standard'.*'entity'.*'node_in_subgraph'"):
        quiet_trainer([PrivacyCallback()], max_steps=30).fit(module, datamodule=_node_dm())
    assert module.privacy_ledger.steps == 0


def test_the_matching_mechanisms_still_train():
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    quiet_trainer([PrivacyCallback(delta=1e-4)], max_steps=3).fit(module, datamodule=_node_dm())
    assert module.privacy_ledger.private_steps == 3 and module.privacy_ledger.unit == NODE_IN_SUBGRAPH.name


def test_every_library_datamodule_declares_its_unit_and_every_mechanism_one():
    rel, node = _relational_dm(), _node_dm()
    rel.setup("fit")
    assert rel.sampling_spec.unit is ENTITY and node.sampling_spec.unit is NODE_IN_SUBGRAPH
    for name in registered_mechanisms():
        mech = get_mechanism(name)
        assert mech.unit is None or PRIVACY_UNITS[mech.unit.name] == mech.unit, name
        assert mech.unit is not None or not mech.needs_sampling, name  # only unsampled releases state their unit


def test_a_ledger_refuses_events_for_another_unit():
    ledger = PrivacyLedger()
    entity = SamplingSpec(num_nodes=100, num_edges=200, max_degree=3, sampling_rate=0.05, neg_per_pos=1,
                          expected_batch_size=10.0, steps_per_epoch=20)
    ledger.open(entity)
    ledger.charge(StepRecord("standard", 1.0, 1.0, "standard", 1.0, 10.0))
    nodes = SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                         expected_batch_size=5.0, steps_per_epoch=2, privacy_unit="node_in_subgraph", num_units=80)
    with pytest.raises(ValueError, match="one unit only"):
        ledger.open(nodes)
    with pytest.raises(ValueError, match="Unknown privacy unit"):
        SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                     expected_batch_size=5.0, steps_per_epoch=2, privacy_unit="household")
    with pytest.raises(ValueError, match="PrivacyUnit needs"):
        PrivacyUnit("", "nothing")
    with pytest.raises(ValueError, match="already named 'entity'"):
        register_privacy_unit(PrivacyUnit("entity", "a household"))
    household = register_privacy_unit(PrivacyUnit("household", "one household (add/remove)", "households"))
    spec = SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                        expected_batch_size=5.0, steps_per_epoch=2, privacy_unit="household")
    assert spec.unit is household


def test_a_sampling_spec_whose_b_is_not_gamma_m_is_refused():
    with pytest.raises(ValueError, match=r"must equal γ·m"):
        SamplingSpec(num_nodes=100, num_edges=200, max_degree=3, sampling_rate=0.05, neg_per_pos=1,
                     expected_batch_size=12.0, steps_per_epoch=20)


# ---------------------------------------------------------------------- finding 6: δ counts units
def test_node_level_delta_default_and_warning_count_nodes_not_subgraphs():
    dm = _node_dm()
    spec = dm.sampling_spec
    nodes = int(dm.data.train_mask.sum())
    assert spec.units == nodes and spec.num_nodes == 10  # 10 subgraph examples, ~160 private nodes
    callback = PrivacyCallback()
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_trainer([callback], max_steps=2).fit(module, datamodule=dm)
    assert not [w for w in seen if "not below 1/n" in str(w.message)]  # the default δ itself is below 1/n
    assert callback.delta == pytest.approx(1.0 / (10 * nodes))
    assert callback.delta < 1.0 / nodes < 1.0 / spec.num_edges  # was 1/(number of subgraphs) = 0.1

    loose = PrivacyCallback(delta=0.7 / nodes)  # below 1/subgraphs = 0.1, not well below 1/nodes
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    with pytest.warns(UserWarning, match=rf"not well below 1/n = .* \(n = {nodes} nodes\)"):
        quiet_trainer([loose], max_steps=1).fit(module, datamodule=_node_dm())
    above = PrivacyCallback(delta=2.0 / nodes)  # not below 1/nodes: refused before the first step
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    with pytest.raises(ValueError, match=rf"not below 1/n = .* \(n = {nodes} nodes\)"):
        quiet_trainer([above], max_steps=1).fit(module, datamodule=_node_dm())
    assert module.privacy_ledger.steps == 0


def test_entity_delta_default_is_a_tenth_of_one_over_n_when_one_over_m_is_not_below_it():
    dm = _relational_dm()
    callback = PrivacyCallback()
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0,
                                noise_seed=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_trainer([callback], max_steps=1).fit(module, datamodule=dm)
    assert not [w for w in seen if "below 1/n" in str(w.message)]
    spec = dm.sampling_spec
    assert spec.num_edges <= spec.units  # 1/m is not below 1/(entities): the default is 1/(10·n)
    assert callback.delta == pytest.approx(1.0 / (10 * spec.units))
    assert dm.sampling_spec.units == dm.sampling_spec.num_nodes and math.isfinite(callback.epsilon)
    assert torch.isfinite(torch.tensor(callback.epsilon))


def test_a_stand_in_mechanism_for_another_unit_is_refused_and_module_mechanisms_must_name_a_unit():
    import numpy as np

    from lightning_dprel.accounting import register_mechanism

    register_mechanism("test_per_example_stand_in", lambda s, sig, a: np.asarray(a) * s.sampling_rate ** 2 / sig ** 2,
                       description="per-example", privacy_unit="example", stands_in_for=("subgraph_replace",),
                       overwrite=True)
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    with pytest.raises(ValueError, match=r"(?s)Privacy unit mismatch.*'test_per_example_stand_in'.*'example'"):
        quiet_trainer([PrivacyCallback(mechanism="test_per_example_stand_in")], max_steps=2).fit(module, datamodule=_node_dm())
    assert module.privacy_ledger.steps == 0
    with pytest.raises(ValueError, match="must name the unit"):
        register_mechanism("test_unitless", lambda s, sig, a: np.asarray(a), description="no unit", privacy_unit=None,
                           clipping=("standard",), accounting="test_unitless")


def test_a_unit_object_in_a_sampling_spec_is_stored_by_name_and_survives_a_ledger_round_trip():
    spec = SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                        expected_batch_size=5.0, steps_per_epoch=2, privacy_unit=NODE_IN_SUBGRAPH, num_units=80)
    assert spec.privacy_unit == "node_in_subgraph" and spec.unit is NODE_IN_SUBGRAPH
    ledger = PrivacyLedger()
    ledger.open(spec)
    ledger.charge(StepRecord("subgraph_replace", 1.0, 1.0, "standard", 1.0, 5.0))
    restored = PrivacyLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.segments == ledger.segments and restored.unit == "node_in_subgraph"


def test_provable_node_splits_refuse_row_numbers_as_ids_unless_allowed():
    from lightning_dprel.datamodules.datasets.nodes import InMemoryNodes

    data = SyntheticNodes(200, 3, dim=8, seed=2).load()
    del data.node_id
    with pytest.raises(ValueError, match="no `node_id`"):
        NodeSplitDataModule(InMemoryNodes(data), num_splits=10, sampling_seed=3).setup("fit")
    with pytest.warns(UserWarning, match="row numbers serve as node ids"):
        NodeSplitDataModule(InMemoryNodes(data), num_splits=10, sampling_seed=3, allow_row_ids=True).setup("fit")


def test_an_exported_node_level_report_uses_the_units_delta():
    from lightning_dprel.export import privacy_report

    dm = _node_dm()
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=1.0, noise_seed=0)
    quiet_trainer([PrivacyCallback(delta=1e-4)], max_steps=2).fit(module, datamodule=dm)
    module._trainer, module._saved_delta = None, None  # a saved model without its fit's δ
    report = privacy_report(module)
    assert report["delta"] == pytest.approx(1.0 / (10 * dm.sampling_spec.units))  # not 1/(number of subgraphs)
