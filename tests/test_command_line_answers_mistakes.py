"""A new user's mistakes on the command line get one plain line naming the fix, exit code 2, no traceback and no usage
dump, before anything is built (no data set-up, no embedding)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprel.cli import DPRelCLI, main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture
def nothing_built(monkeypatch):
    """Fails the test if the CLI gets as far as building the model, the data or the trainer."""

    def refuse(self):
        raise AssertionError("the CLI built its classes before refusing the command line")

    monkeypatch.setattr(DPRelCLI, "instantiate_classes", refuse)


def _refused(args: list[str], capsys) -> str:
    """Run the CLI; it must exit with code 2 and one short error (no traceback, no usage); the error's text."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err and "usage:" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) <= 3 and lines[0].startswith("error: "), err
    return lines[0]


def _config(tmp_path: Path, name: str, old: str, new: str) -> str:
    text = (ROOT / "configs" / name).read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the accelerator is fine")
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_a_gpu_asked_for_without_one_says_to_use_the_cpu(accelerator, capsys, nothing_built):
    line = _refused(["fit", "--config", TINY, "--trainer.accelerator", accelerator], capsys)
    assert re.search(r"no GPU is visible.*use --trainer\.accelerator cpu \(or auto", line), line


def test_a_yaml_syntax_error_names_the_file_line_and_problem(tmp_path, capsys, nothing_built):
    path = _config(tmp_path, "tiny.yaml", "  max_steps: 12\n", "  max_steps: [12\n")
    line = _refused(["fit", "--config", path], capsys)
    assert line.startswith(f"error: {path}, line ") and "not valid YAML" in line and "flow sequence" in line, line


@pytest.mark.parametrize(
    "config, old, new, extra, expected",
    [
        ("tiny.yaml", "target_epsilon: 8.0", "target_epsilon: four", [],
         "trainer.callbacks[0].init_args.target_epsilon (in PrivacyCallback): expected a number, got 'four'"),
        ("tiny_adapter.yaml", "every_n_steps: 5", "every_n_steps: often", [],
         "trainer.callbacks[1].init_args.every_n_steps (in ValidationSelection): expected an integer, got 'often'"),
        ("tiny.yaml", "", "", ["--model.init_args.lr", "fast"],
         "model.init_args.lr (in DPRelationalModule): expected a number, got 'fast'"),
        ("tiny.yaml", "", "", ["--model.init_args.encoder.init_args.lora_r", "big"],
         "model.init_args.encoder.init_args.lora_r (in TextEncoder): expected an integer, got 'big'"),
        ("tiny.yaml", "", "", ["--data.init_args.max_degree", "five"],
         "data.init_args.max_degree (in RelationalDataModule): expected an integer, got 'five'"),
        ("tiny.yaml", "", "", ["--trainer.max_steps", "many"], "trainer.max_steps: expected an integer, got 'many'"),
        ("tiny.yaml", "", "", ["--model.init_args.clippin", "freq"],
         "model.init_args.clippin: no such option (in DPRelationalModule); did you mean model.init_args.clipping?"),
    ],
    ids=["callback", "second-callback", "model", "nested-encoder", "data", "trainer", "unknown-init-arg"],
)
def test_a_bad_value_names_its_key_the_type_expected_and_the_value(config, old, new, extra, expected, tmp_path, capsys,
                                                                 nothing_built):
    path = _config(tmp_path, config, old, new) if old else str(ROOT / "configs" / config)
    assert _refused(["fit", "--config", path, *extra], capsys) == f"error: {expected}"


@pytest.mark.parametrize("given", [["--trainer.max_step", "5"], ["--trainer.max_step=5"]])
def test_an_abbreviated_option_is_refused_with_the_full_name(given, capsys, nothing_built):
    line = _refused(["fit", "--config", TINY, *given], capsys)
    assert "unknown option --trainer.max_step: did you mean --trainer.max_steps?" in line, line


def test_a_misspelt_key_in_a_config_file_gets_the_full_name(tmp_path, capsys, nothing_built):
    path = _config(tmp_path, "tiny.yaml", "  max_steps: 12\n", "  max_step: 12\n")
    line = _refused(["fit", "--config", path], capsys)
    assert line == "error: trainer.max_step is no option of fit: did you mean trainer.max_steps?", line


@pytest.mark.parametrize("config, module", [("tiny.yaml", "DPRelationalModule"), ("dp_gcn_tiny.yaml", "DPNodeModule"),
                                            ("advsgm_tiny.yaml", "DPSkipGramModule")])
def test_optimizer_is_refused_for_a_module_that_builds_its_own_before_anything_is_built(config, module, capsys, nothing_built):
    line = _refused(["fit", "--config", str(ROOT / "configs" / config), "--optimizer", "Adam"], capsys)
    assert re.search(rf"--optimizer torch\.optim\.Adam .*{module} builds its own DPOptimizer.*--model\.init_args\.optimizer",
                     line), line


class PlainClassifier(pl.LightningModule):
    """An ordinary LightningModule (no lightning_dprel base class): the privacy callback makes it private."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RandomRows(pl.LightningDataModule):
    def setup(self, stage=None):
        x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
        self.rows = TensorDataset(x, (x[:, 0] > 0).long())

    def train_dataloader(self):
        from lightning_dprel import DPDataLoader

        return DPDataLoader(self.rows, batch_size=32)

    def test_dataloader(self):
        return DataLoader(self.rows, batch_size=256)


@pytest.mark.filterwarnings("ignore")  # a toy fit: its warnings (few batches, δ on a small set) are beside the point
def test_optimizer_is_kept_for_a_plain_module_and_trained_privately(tmp_path):
    config = tmp_path / "plain.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 3
  max_epochs: -1
  logger: false
  enable_checkpointing: false
  enable_model_summary: false
  callbacks:
    - class_path: lightning_dprel.callbacks.PrivacyCallback
      init_args: {{target_epsilon: 8.0, delta: 1.0e-05, clip_norm: 1.0, calibrate: true}}
model: {__name__}.PlainClassifier
data: {__name__}.RandomRows
""")
    cli = main(["fit", "--config", str(config), "--trainer.default_root_dir", str(tmp_path), "--compare_base", "false",
                "--final_ckpt_path", "null", "--optimizer", "torch.optim.Adam", "--optimizer.lr", "0.01"])
    dp = cli.trainer.optimizers[0]
    assert type(dp).__name__ == "DPOptimizer" and isinstance(dp.original_optimizer, torch.optim.Adam)
    assert dp.original_optimizer.param_groups[0]["lr"] == 0.01
    privacy = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "PrivacyCallback")
    assert cli.trainer.global_step == 3 and 0 < privacy.epsilon <= 8.0


def test_export_is_listed_in_the_usage_and_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "{fit,validate,test,predict,export}" in out and "export" in out.split("options:")[0]
    with pytest.raises(SystemExit) as stop:
        main(["export", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "usage: python -m lightning_dprel export" in out and "--ckpt_path" in out
