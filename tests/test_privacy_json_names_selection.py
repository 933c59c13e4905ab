"""``privacy.json`` says that a checkpoint was selected, which one, by what score, and on which (public) validation graph.

Audit item (issue 32): ValidationSelection restored the best candidate silently; the release did not say that it is
one iterate among several, chosen on a validation graph (post-processing only when that graph is public).
"""

from __future__ import annotations

import json

import pytest
from pytorch_lightning import Trainer

from lightning_dprel.callbacks import PrivacyCallback, ValidationSelection
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import GraphPair, GraphSource
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.encoders import ResidualAdapter
from lightning_dprel.export import export_model
from lightning_dprel.methods.relational.module import DPRelationalModule

pytestmark = pytest.mark.filterwarnings("ignore:(DPRelationalModule\\(noise_seed|RelationalDataModule\\(sampling_seed)=<int>\\)")
DIM = 8


class _Split(GraphSource):
    def load(self) -> GraphPair:
        train, val, test = (random_feature_graph(120, 300, dim=DIM, seed=s) for s in (0, 11, 12))
        return GraphPair(train=train, val=val, test=test, name="synthetic")

    def __repr__(self) -> str:
        return "TinySplit()"


def _fit(selection: ValidationSelection, **dm_args) -> DPRelationalModule:
    module = DPRelationalModule(ResidualAdapter(DIM, rank=2, directed=True), score="directed_cosine", clipping="standard",
                                clip_norm=1.0, noise_seed=1)
    dm = RelationalDataModule(_Split(), expected_batch_size=16.0, neg_per_pos=1, max_degree=6, sampling_seed=3,
                              directed=True, **dm_args)
    trainer = Trainer(max_steps=4, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0,
                      callbacks=[PrivacyCallback(target_epsilon=8.0, delta=1e-5, calibrate=True), selection])
    trainer.fit(module, dm)
    return module


def test_privacy_json_names_the_selected_checkpoint_and_the_validation_graph(tmp_path):
    sel = ValidationSelection(every_n_steps=2)
    module = _fit(sel)
    report = json.loads((export_model(module, tmp_path) / "privacy.json").read_text())
    chosen = report["public_data"]["selection"]
    assert chosen == {
        "step": sel.best_step, "candidate": sel.best_candidate, "monitor": "mrr", "score": sel.best_score,
        "candidates": len(sel.history), "validation_graph": "the validation graph of TinySplit()", "validation_public": True,
    }
    assert sel.best_candidate in {"base", "step 2", "step 4"} and len(sel.history) == 3  # steps 0, 2, 4
    assert chosen["score"] == max(h["mrr"] for h in sel.history)


def test_a_separate_validation_graph_is_named_and_nothing_is_claimed_without_a_restore(tmp_path):
    val = random_feature_graph(60, 150, dim=DIM, seed=21)
    module = _fit(ValidationSelection(every_n_steps=2), val_source=val)
    assert module.public_data["selection"]["validation_graph"] == repr(val)
    kept = _fit(ValidationSelection(every_n_steps=2, restore_best=False))  # the last iterate is released: no selection
    assert "selection" not in kept.public_data
    report = json.loads((export_model(kept, tmp_path) / "privacy.json").read_text())
    assert "selection" not in report.get("public_data", {})
