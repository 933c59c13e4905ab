"""Ctrl-C keeps what was trained: checkpoints by default in the main job, the resume command printed, ε exact after resume."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from lightning_dprel.callbacks.resume import resume_command
from lightning_dprel.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore")


def _config(tmp_path: Path, *, interrupt_at: int | None) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg["trainer"]["enable_checkpointing"] = True
    cfg["trainer"]["enable_progress_bar"] = False
    cfg["trainer"]["callbacks"].append({"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {
        "dirpath": str(tmp_path / "checkpoints"), "every_n_train_steps": 3, "save_top_k": 0, "save_last": True}})
    if interrupt_at is not None:
        cfg["trainer"]["callbacks"].append({"class_path": "lightning_dprel.demos.boring_classes.InterruptAt",
                                            "init_args": {"step": interrupt_at, "flag_file": str(tmp_path / "pressed")}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fit(args: list[str]) -> dict:
    main(args)
    return json.loads(Path(args[args.index("--results_json") + 1]).read_text())


@pytest.mark.slow
def test_ctrl_c_prints_the_resume_command_and_resuming_is_exact(tmp_path, capsys):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir(), cut_dir.mkdir()
    common = ["--compare_base", "false", "--final_ckpt_path", "null"]
    full = _fit(["fit", "--config", str(_config(full_dir, interrupt_at=None)), "--trainer.default_root_dir", str(full_dir),
                 "--results_json", str(full_dir / "r.json"), *common])
    args = ["fit", "--config", str(_config(cut_dir, interrupt_at=7)), "--trainer.default_root_dir", str(cut_dir),
            "--results_json", str(cut_dir / "r.json"), *common]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(args)
    out = capsys.readouterr().out
    assert "Interrupted after 7 private steps" in out and "resume exactly with:" in out
    command = shlex.split(out.split("resume exactly with:")[1].strip().splitlines()[0])
    assert command[:3] == ["python", "-m", "lightning_dprel"] and command[-2:] == ["--ckpt_path", str(cut_dir / "checkpoints" / "last.ckpt")]
    resumed = _fit(command[3:])
    assert resumed["privacy"]["steps"] == full["privacy"]["steps"] == 12
    assert resumed["privacy"]["sigma"] == full["privacy"]["sigma"]
    assert resumed["privacy"]["epsilon"] == full["privacy"]["epsilon"]  # exact: the ledger continued from step 6


def test_the_resume_command_replaces_an_earlier_checkpoint():
    cmd = resume_command(["fit", "--config", "c.yaml", "--ckpt_path", "old.ckpt", "--ckpt_path=older.ckpt"], "new dir/last.ckpt")
    assert cmd == "python -m lightning_dprel fit --config c.yaml --ckpt_path 'new dir/last.ckpt'"


def test_the_relational_job_checkpoints_by_default():
    cfg = yaml.safe_load((ROOT / "configs" / "relational.yaml").read_text())
    assert cfg["trainer"]["enable_checkpointing"] is True
    saver = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert saver and saver[0]["init_args"]["save_last"] is True and saver[0]["init_args"]["every_n_train_steps"] <= 50
