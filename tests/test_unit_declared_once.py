"""A datamodule declares its privacy unit once (its ``privacy_unit`` class attribute) and every SamplingSpec it builds
reads it there; each method registers its units and mechanisms from its own package, found in a fresh process by
discovery; a NoiseSpec (and so a checkpoint or ``model.json``) names the mechanism actually used, never a filler."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Callable

import pytest
import torch

from lightning_dprel.accounting import get_mechanism, per_step_rdp
from lightning_dprel.core.datamodule import PrivateDataModule
from lightning_dprel.core.discovery import import_methods
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec, privacy_unit
from lightning_dprel.datamodules.datasets.nodes import SyntheticNodes
from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.public_vocabulary import PublicVocabularyDataModule
from lightning_dprel.datamodules.edge_tuples.link_batches import LinkPredictionDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.methods.advsgm import (
    AdvSGMPaperDataModule, DPSkipGramModule, EdgeSkipGramDataModule, PrivateIdsSkipGramDataModule, SkipGramDataModule,
)
from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule
from lightning_dprel.methods.dp_gpl.dpsgd import DPPromptTuning, PrivateNodeExamples
from lightning_dprel.methods.entity_items import EntityItemDataModule

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|paper|does not have many workers).*")


def _graph():
    return random_feature_graph(80, 240, dim=4, seed=0)


def _prompt_dm() -> PromptDataModule:
    return PromptDataModule(SyntheticNodes(60, 3, dim=4, seed=1), num_teachers=2, num_queries=4, view="public",
                            partition_seed=0, hops=1, fanout=3)


#: One tiny instance of every private datamodule the library ships that builds a SamplingSpec.
FACTORIES: dict[type, Callable[[], Any]] = {
    RelationalDataModule: lambda: RelationalDataModule(_graph(), expected_batch_size=6, neg_per_pos=1, sampling_seed=0),
    PublicVocabularyDataModule: lambda: PublicVocabularyDataModule(
        _graph(), expected_batch_size=6, neg_per_pos=1, sampling_seed=0
    ),
    LinkPredictionDataModule: lambda: LinkPredictionDataModule(_graph(), expected_batch_size=6, neg_per_pos=1, sampling_seed=0),
    SkipGramDataModule: lambda: SkipGramDataModule(_graph(), max_degree=4, expected_batch_size=6, neg_per_pos=1, sampling_seed=0),
    EdgeSkipGramDataModule: lambda: EdgeSkipGramDataModule(_graph(), expected_batch_size=6, neg_per_pos=1, sampling_seed=0),
    PrivateIdsSkipGramDataModule: lambda: PrivateIdsSkipGramDataModule(_graph(), max_degree=4, expected_batch_size=6,
                                                                       neg_per_pos=1, sampling_seed=0),
    AdvSGMPaperDataModule: lambda: AdvSGMPaperDataModule(_graph(), batch_size=8, neg_per_pos=1, sampling_seed=0),
    NodeSplitDataModule: lambda: NodeSplitDataModule(SyntheticNodes(40), num_splits=4, sampling_rate=0.5),
    PrivateNodeExamples: lambda: PrivateNodeExamples(_prompt_dm(), expected_batch_size=4.0, sample_seed=0),
    EntityItemDataModule: lambda: EntityItemDataModule(_entities_and_items(), relation=("user", "has", "item"),
                                                       max_relations=3, expected_batch_size=4.0, seed=0),
}


def _entities_and_items():
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["user"].ids, data["user"].x = [f"u{i}" for i in range(60)], torch.randn(60, 4, generator=g)
    data["item"].ids, data["item"].x = [f"i{j}" for j in range(10)], torch.randn(10, 4, generator=g)
    data["user", "has", "item"].edge_index = torch.stack([torch.arange(60).repeat(2), torch.randint(10, (120,), generator=g)])
    return data


def _library_datamodules() -> set[type]:
    import_methods()  # every method's datamodules are defined
    found, todo = set(), [PrivateDataModule]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("lightning_dprel.") and hasattr(sub, "privacy_unit"):
                found.add(sub)
    return found


def test_every_library_datamodule_declares_a_known_unit_and_every_spec_builder_is_checked_here():
    classes = _library_datamodules()
    for cls in classes:
        privacy_unit(cls.privacy_unit)  # a registered unit
    builders = {cls for cls in classes if isinstance(getattr(cls, "sampling_spec", None), property)}
    assert builders == set(FACTORIES), "add the new datamodule to FACTORIES"


@pytest.mark.parametrize("cls", list(FACTORIES), ids=lambda c: c.__name__)
def test_the_unit_of_every_sampling_spec_is_the_class_attribute(cls):
    dm = FACTORIES[cls]()
    dm.setup("fit")
    assert type(dm) is cls
    assert dm.sampling_spec.privacy_unit == privacy_unit(cls.privacy_unit).name


def test_the_advsgm_units_are_its_four_classes():
    classes = (SkipGramDataModule, PrivateIdsSkipGramDataModule, EdgeSkipGramDataModule, AdvSGMPaperDataModule)
    units = {c: privacy_unit(c.privacy_unit).name for c in classes}
    assert units == {SkipGramDataModule: "node_public_ids", PrivateIdsSkipGramDataModule: "entity",
                     EdgeSkipGramDataModule: "edge", AdvSGMPaperDataModule: "node_replace"}


class _Declares(PrivateDataModule):
    privacy_unit = "entity"

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    @property
    def sampling_spec(self) -> SamplingSpec:
        return SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                            expected_batch_size=5.0, steps_per_epoch=2, privacy_unit=self.unit)


def test_a_spec_for_another_unit_than_declared_is_refused_when_read():
    assert _Declares("entity").sampling_spec.privacy_unit == "entity"
    with pytest.raises(ValueError, match="declares 'entity'"):
        _Declares("example").sampling_spec  # noqa: B018


def test_a_datamodule_without_a_declared_unit_cannot_be_built():
    class Undeclared(PrivateDataModule):
        pass

    with pytest.raises(TypeError, match="declares no privacy unit"):
        Undeclared()
    with pytest.raises(ValueError, match="Unknown privacy unit"):
        type("Misspelt", (PrivateDataModule,), {"privacy_unit": "entitty"})


_FRESH = """
import json, sys
import lightning_dprel.core.ledger  # the core only: no method imported yet
assert not [m for m in sys.modules if m.startswith("lightning_dprel.methods.")], "a method was imported by the core"
from lightning_dprel.accounting import get_mechanism, per_step_rdp
from lightning_dprel.core.specs import SamplingSpec
mech = get_mechanism("skipgram_public_ids")  # not registered yet: found by discovering the method packages
spec = SamplingSpec(**json.loads(sys.argv[1]))
print(json.dumps({"unit": mech.unit.name, "spec_unit": spec.unit.name, "rdp": per_step_rdp(mech.name, spec, 1.3).tolist()}))
"""


@pytest.mark.slow
def test_a_fresh_process_with_only_the_core_finds_a_methods_mechanism_and_unit():
    spec = SamplingSpec(num_nodes=500, num_edges=1500, max_degree=4, sampling_rate=0.01, neg_per_pos=2,
                        expected_batch_size=15.0, steps_per_epoch=100, privacy_unit="node_public_ids")
    out = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(spec.to_dict())], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["unit"] == got["spec_unit"] == "node_public_ids"
    assert got["rdp"] == per_step_rdp("skipgram_public_ids", spec, 1.3).tolist()


def test_an_unknown_name_is_still_refused_after_discovery():
    with pytest.raises(ValueError, match="must be one of"):
        get_mechanism("no_such_mechanism")
    with pytest.raises(ValueError, match="Unknown privacy unit"):
        privacy_unit("no_such_unit")


@pytest.mark.parametrize("clipping", ["freq", "standard", "none"])
@pytest.mark.parametrize("accounting", [None, "corrected", "paper"])
def test_a_noise_spec_names_the_mechanism_it_accounts_with(clipping, accounting):
    spec = NoiseSpec(0.0 if clipping == "none" else 1.0, 1.0, clipping, accounting)
    saved = spec.to_dict()
    assert saved["accounting"] == spec.mechanism and saved["accounting"] not in ("corrected", "paper")
    expected = {"freq": f"freq_{accounting or 'corrected'}", "standard": "standard", "none": "none"}[clipping]
    assert spec.mechanism == expected
    assert NoiseSpec(**saved) == spec  # the saved form round-trips


def test_a_checkpoint_saved_with_the_old_filler_still_loads_as_its_mechanism():
    old = {"noise_multiplier": 1.0, "clip_norm": 1.0, "clipping": "standard", "accounting": "corrected"}
    assert NoiseSpec(**old).mechanism == "standard" and NoiseSpec(**old).to_dict()["accounting"] == "standard"


def test_paper_and_non_private_modes_need_no_filler():
    assert DPSkipGramModule(num_nodes=10, dim=4, mode="paper").noise_spec.to_dict()["accounting"] == "none"
    assert DPPromptTuning(clipping="none", noise_multiplier=0.0).noise_spec.to_dict()["accounting"] == "none"
    assert DPPromptTuning().noise_spec.to_dict()["accounting"] == "labelled_node_gaussian"


def test_model_json_names_standard_clipping_standard(tmp_path):
    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.demos.boring_classes import quiet_trainer, tiny_relational_dm
    from lightning_dprel.encoders import MLPEncoder
    from lightning_dprel.export import export_model
    from lightning_dprel.methods.relational.module import DPRelationalModule

    torch.manual_seed(0)
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0)
    quiet_trainer([PrivacyCallback(delta=1e-4)], max_steps=2).fit(module, datamodule=tiny_relational_dm(stage=None))
    text = (export_model(module, tmp_path / "export") / "model.json").read_text()
    assert "corrected" not in text
    assert json.loads(text)["module"]["accounting"] == "standard"
