"""The main job's report is titled by what the test measures: zero-shot relation prediction on a separate test graph,
relation prediction on held-out relations when the test relations were held out of the training graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dprel.cli import main
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import SyntheticGraphs
from lightning_dprel.demos import random_feature_graph

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("source,held_out", [(random_feature_graph(60, 150), True), (SyntheticGraphs("features"), False)],
                         ids=["one graph", "train and test graphs"])
def test_the_datamodule_says_whether_its_test_relations_were_held_out(source, held_out):
    dm = RelationalDataModule(source, expected_batch_size=8, neg_per_pos=1)
    dm.setup("fit")
    assert dm.held_out_test is held_out


@pytest.mark.slow
@pytest.mark.parametrize("config,title", [
    ("pyg_mlp.yaml", "Relation prediction on held-out relations of: "),  # FakeDataset: 20 % of its relations held out
    ("tiny.yaml", "Zero-shot relation prediction on: "),  # SyntheticGraphs: a separate test graph
])
def test_the_cli_report_is_titled_by_the_split(config, title, tmp_path, monkeypatch, capsys):
    from pytorch_lightning import Trainer

    monkeypatch.setattr(Trainer, "fit", lambda self, *a, **k: None)  # the title is the point: no training needed
    main(["fit", "--config", str(ROOT / "configs" / config), "--trainer.default_root_dir", str(tmp_path),
          "--final_ckpt_path", "null"])
    out = capsys.readouterr().out
    assert title in out
    assert ("Zero-shot" in out) is title.startswith("Zero-shot")
