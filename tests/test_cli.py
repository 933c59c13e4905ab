"""The command line: every shipped config parses and instantiates; the tiny config runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dprel.cli import DPRelCLI, format_report, main

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"default", "tiny"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_config_instantiates(config: Path, tmp_path: Path) -> None:
    # parse and build on CPU: GPU configs are checked for their content, not for the hardware here
    args = ["--config", str(config), "--trainer.default_root_dir", str(tmp_path), "--trainer.accelerator", "cpu"]
    cli = DPRelCLI(args=args, run=False)
    spec = cli.model.noise_spec
    assert spec.clipping in ("freq", "standard", "none")
    assert isinstance(getattr(type(cli.datamodule), "sampling_spec", None), property)
    if spec.is_private or spec.clipping != "none":
        assert any(type(cb).__name__ == "PrivacyCallback" for cb in cli.trainer.callbacks), config.name


def test_format_report_lists_both_encoders_and_privacy() -> None:
    text = format_report(
        {"test_prec1": 0.1, "test_mrr": 0.2},
        {"test_prec1": 0.3, "test_mrr": 0.4},
        {"epsilon": 3.9, "delta": 1e-4, "target": 4.0, "steps": 10, "sigma": 1.2, "accounting": "FREQ-CLIP corrected"},
        "title",
    )
    assert "base (no fine-tuning)" in text and "0.1000" in text and "0.4000" in text
    assert "epsilon = 3.9000" in text and "FREQ-CLIP corrected" in text
    assert "no epsilon is claimed" in format_report(None, {"test_prec1": 0.3, "test_mrr": 0.4}, None, "t")


def test_main_job_tiny_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    main(["fit", "--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--results_json", str(out)])
    printed = capsys.readouterr().out
    assert "base (no fine-tuning)" in printed and "fine-tuned" in printed and "PREC@1" in printed
    results = json.loads(out.read_text())
    privacy = results["privacy"]
    assert privacy is not None and privacy["accounting"] == "FREQ-CLIP corrected"
    assert 0 < privacy["epsilon"] <= privacy["target"] == 8.0
    assert privacy["steps"] == 12
    for key in ("test_prec1", "test_mrr"):
        assert 0.0 <= results["base"][key] <= 1.0 and 0.0 <= results["tuned"][key] <= 1.0
    assert results["tuned"]["test_mrr"] >= results["tuned"]["test_prec1"]


def test_main_job_recipe_tiny_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's recipe (frozen features, directed adapter, selection on validation) through the CLI."""
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results.json"
    main(["fit", "--config", "configs/tiny_adapter.yaml", "--trainer.default_root_dir", str(tmp_path), "--results_json", str(out)])
    printed = capsys.readouterr().out
    assert "chosen on the validation graph" in printed and "the test graph was not used" in printed
    results = json.loads(out.read_text())
    assert results["privacy"]["accounting"] == "standard (Thm C.1)" and 0 < results["privacy"]["epsilon"] <= 8.0
    sel = results["selection"]
    assert sel["step"] in (0, 5, 10, 15, 20) and sel["score"] >= sel["base"]
    if sel["step"] == 0:  # the base model was kept: the tuned test numbers are the base's
        assert results["tuned"] == pytest.approx(results["base"])


def test_format_report_names_the_selected_checkpoint() -> None:
    sel = {"step": 0, "monitor": "mrr", "score": 0.3, "base": 0.3}
    assert "checkpoint: the base encoder" in format_report(None, {"test_prec1": 0.3, "test_mrr": 0.4}, None, "t", sel)
    assert "checkpoint: step 150" in format_report(None, {"test_prec1": 0.3, "test_mrr": 0.4}, None, "t", {**sel, "step": 150})
