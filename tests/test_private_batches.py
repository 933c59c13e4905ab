"""Every private training batch derives from one base (``PrivateBatch``: b and the sample token ``step``), with one batch
type per sampling family: ``TupleBatch`` (coupled edge tuples) and ``ExampleBatch`` (per-example Poisson)."""

from __future__ import annotations

import dataclasses
from itertools import islice

import pytest
import torch

from lightning_dprel.core.batch import ExampleBatch, PrivateBatch
from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.datamodules.edge_tuples.link_batches import LinkBatch
from test_unit_declared_once import FACTORIES

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|paper|does not have many workers).*")

FAMILY = {"RelationalDataModule": TupleBatch, "SkipGramDataModule": TupleBatch, "PrivateIdsSkipGramDataModule": TupleBatch,
          "EdgeSkipGramDataModule": TupleBatch, "PublicVocabularyDataModule": TupleBatch,
          "AdvSGMPaperDataModule": TupleBatch, "NodeSplitDataModule": ExampleBatch, "PrivateNodeExamples": ExampleBatch,
          "LinkPredictionDataModule": LinkBatch, "EntityItemDataModule": dict}
#: Batches in PyG's shape for a user's own module: a ``Data`` (LinkBatch: no ``edge_index``) that carries b and the
#: sample token as attributes.
PYG_SHAPED = {"LinkPredictionDataModule"}
#: Rows for a user's own module (a dict of tensors, as DPDataLoader's): the attached layer takes b from the SamplingSpec
#: and the sample token from the loop, so the batch carries neither; the datamodule's step counts the samples drawn.
USER_ROWS = {"EntityItemDataModule"}


@pytest.mark.parametrize("cls", list(FACTORIES), ids=lambda c: c.__name__)
def test_each_datamodule_yields_its_familys_batch_with_b_and_the_step_that_drew_it(cls):
    dm = FACTORIES[cls]()
    dm.setup("fit")
    batches = list(islice(iter(dm.train_dataloader()), 2))
    assert [type(b) for b in batches] == [FAMILY[cls.__name__]] * 2
    if cls.__name__ in USER_ROWS:
        assert dm._step == 2 and all(isinstance(v, torch.Tensor) for b in batches for v in b.values())
        return
    assert all(isinstance(b, PrivateBatch) for b in batches) or cls.__name__ in PYG_SHAPED
    assert [b.step for b in batches] == [0, 1]
    assert all(b.expected_batch_size == pytest.approx(dm.sampling_spec.expected_batch_size) for b in batches)


def test_b_and_step_are_declared_once_on_the_base():
    for family in (TupleBatch, ExampleBatch):
        own = family.__dict__.get("__annotations__", {})
        assert "expected_batch_size" not in own and "step" not in own, family
        assert {"expected_batch_size", "step"} <= {f.name for f in dataclasses.fields(family)}


def _tuple_batch(**kw) -> TupleBatch:
    z = torch.zeros(0, 1, dtype=torch.long)
    fields = dict(pos=torch.zeros(0, 2, dtype=torch.long), neg=z, neg_anchor=z, max_freq=torch.zeros(0), node_ids=z.view(-1),
                  tuple_nodes=torch.zeros(0, 3, dtype=torch.long), node_inputs={}, global_size=0)
    return TupleBatch(**{**fields, **kw})


def test_the_sample_token_is_required_and_checked():
    assert _tuple_batch(expected_batch_size=2.0, step=3).step == 3  # an empty Poisson sample is a real step
    with pytest.raises(TypeError, match="step"):
        _tuple_batch(expected_batch_size=2.0)  # no default: two samples never share a token by omission
    with pytest.raises(ValueError, match="sample token"):
        ExampleBatch(examples=[], expected_batch_size=2.0, step=-1)
    with pytest.raises(ValueError, match="expected_batch_size"):
        ExampleBatch(examples=[], expected_batch_size=0.0, step=0)
    assert ExampleBatch(examples=[1, 2], expected_batch_size=2.0, step=0).size == 2
