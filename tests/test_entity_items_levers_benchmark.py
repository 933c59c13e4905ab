"""The levers benchmark computes the library's private step: its closed-form clipped sum of an entity-as-example
batch equals, parameter by parameter, the sum the library's DP optimizer noises for the same batch (today's ranker and
the public-basis one), and its lever names are checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.methods.entity_items import EntityItemRanker
from test_entities_linked_to_public_items import D, dm_of, make_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import entities_items_levers as levers  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*")]


class KeepSums(pl.Callback):
    """The clipped sums (by parameter name) the DP optimizer adds its noise to."""

    def __init__(self) -> None:
        self.sums: list[dict] = []

    def on_train_start(self, trainer, pl_module) -> None:
        cb = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
        dp = cb._layer.dp
        original = dp.add_noise
        dp.add_noise = lambda summed, noise="draw": self.sums.append(
            {k: v.detach().clone() for k, v in summed.items()}) or original(summed, noise)


@pytest.mark.parametrize("clip", [0.05, 100.0])
@pytest.mark.parametrize("lever,names", [("today", {"M": "adapter.weight", "beta": "item_bias"}),
                                         ("basis=3", {"M": "adapter.inner.weight", "w": "adapter.inner.bias"}),
                                         ("precondition=0.5", {"M": "adapter.inner.weight", "beta": "item_bias"})])
def test_the_closed_form_clipped_sum_is_the_library_step(lever, names, clip):
    dm = dm_of(make_data(), recipe="entity")
    dm.setup("fit")
    tau = 0.5
    rows = torch.arange(10, 50)
    batch = {"query": dm.entity_x[dm.train_entities[rows]], "items": dm.entity_items[rows]}
    dm.next_batch = lambda: batch
    kind, value = levers.lever_of(lever)
    model = {"today": lambda: EntityItemRanker(dm.item_x, dim=D, temperature=tau, item_bias=True),
             "basis": lambda: EntityItemRanker(dm.item_x, dim=D, temperature=tau, public_basis=int(value)),
             "precondition": lambda: EntityItemRanker(dm.item_x, dim=D, temperature=tau, precondition=value,
                                                      item_bias=True)}[kind]()
    keep = KeepSums()
    pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
               callbacks=[PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0), keep]).fit(model, dm)
    pb = levers.Problem(dm, tau)
    mine = levers.LeverModel(pb, kind, value)
    norms, clipped_sum = mine.per_example(pb.x[rows], pb.base[rows], pb.items[rows], pb.targets(0.0)[rows])
    sums = clipped_sum((clip / norms).clamp(max=1.0))
    library = keep.sums[0]
    assert set(library) == set(names.values())
    for ours, theirs in names.items():
        assert torch.allclose(sums[ours], library[theirs], rtol=1e-4, atol=1e-5 * clip), ours


@pytest.mark.parametrize("name", ["tday", "basis", "today=1", "banded=", "allocation"])
def test_an_unknown_lever_is_refused(name):
    with pytest.raises(ValueError, match="unknown lever"):
        levers.lever_of(name)


def test_the_docs_levers_table_is_the_one_the_json_gives():
    """docs/entities_items.md's table is regenerated from the runs (``--table``), not typed: it cannot drift from them."""
    import json

    runs = json.loads((levers.RESULTS / "entities_items_levers.json").read_text())["runs"]
    rows = levers.table(runs).split("\n", 4)[4]  # the rows, as main() writes them into the page
    assert levers.MARKS[0] + "\n" + rows + levers.MARKS[1] in levers.DOCS.read_text()
    assert {(r["lever"], r["epsilon"], r.get("fraction", 1.0)) for r in runs} >= {("today", 4.0, 1.0),
                                                                                   ("precondition=0.5", 4.0, 1.0)}
