"""The README's resume command names ``<default_root_dir>/checkpoints/last.ckpt``: a rerun in the same folder must
overwrite it (Lightning's default would write ``last-v1.ckpt`` and leave the older run's under that name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_dprel.demos.boring_classes import quiet_trainer

ROOT = Path(__file__).resolve().parents[1]


def _savers(config: Path) -> list[dict]:
    cfg = yaml.safe_load(config.read_text())
    callbacks = ((cfg.get("trainer") or {}).get("callbacks")) or []
    return [c.get("init_args") or {} for c in callbacks if str(c.get("class_path", "")).endswith("ModelCheckpoint")]


@pytest.mark.filterwarnings("ignore")  # "checkpoint directory exists and is not empty": the rerun, on purpose
def test_a_rerun_of_the_relational_job_overwrites_last_ckpt(tmp_path):
    (saver,) = _savers(ROOT / "configs" / "relational.yaml")
    assert saver["save_last"] is True
    for steps in (4, 6):  # the same command twice; the second run is the one to resume
        callback = ModelCheckpoint(**{**saver, "every_n_train_steps": 2}, dirpath=tmp_path / "checkpoints")
        quiet_trainer([callback], enable_checkpointing=True, max_steps=steps, max_epochs=-1).fit(BoringModel())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_that_keeps_a_last_checkpoint_overwrites_it(config):
    for saver in _savers(config):
        if saver.get("save_last"):
            assert saver.get("enable_version_counter") is False, f"{config.name}: reruns would write last-v1.ckpt"
