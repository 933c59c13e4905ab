"""Piped or logged output (stdout not a terminal, where no bar draws) still says how far training and the public warm
start are: plain lines with step t/T, ε when logged, and the time left, every tenth of the steps or every few seconds."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_dprel.demos.boring_classes import quiet_trainer, rank_zero_messages
from lightning_dprel.progress import ProgressLog, StepLogProgressBar, StepRichProgressBar, step_progress_bar

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^training: (\d+)/(\d+) steps \(\d+ %\), ε = ([0-9.e+-]+), \d+ s elapsed, ~\d+ s left$")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_draws_on_a_terminal_and_logs_lines_when_piped():
    assert isinstance(step_progress_bar(_Terminal()), StepRichProgressBar)
    assert isinstance(step_progress_bar(io.StringIO()), StepLogProgressBar)  # a pipe or a file: no terminal


class _LogsEpsilon(BoringModel):
    """Logs ``epsilon`` = the step number to the bar and advances a fake clock 10 s per step."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock[0] += 10.0
        self.log("epsilon", float(self.global_step + 1), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        return super().training_step(batch, batch_idx)


def test_lines_come_every_few_seconds_with_epsilon_and_the_time_left():
    clock = [0.0]
    bar = StepLogProgressBar(every=30.0, fraction=None, clock=lambda: clock[0])  # time only: a line per 30 fake seconds
    trainer = quiet_trainer([bar], enable_progress_bar=True, max_steps=10, max_epochs=-1)
    with rank_zero_messages() as said:
        trainer.fit(_LogsEpsilon(clock))
    lines = [m for m in said if m.startswith("training")]
    assert lines == [
        "training: 10 steps …",
        "training: 3/10 steps (30 %), ε = 3, 30 s elapsed, ~70 s left",
        "training: 6/10 steps (60 %), ε = 6, 60 s elapsed, ~40 s left",
        "training: 9/10 steps (90 %), ε = 9, 90 s elapsed, ~10 s left",
        "training: 10/10 steps done in 100.0 s",
    ]


def test_a_resumed_phase_counts_on_and_estimates_from_its_own_rate():
    clock = iter([0.0, 10.0, 20.0])
    with rank_zero_messages() as said:
        log = ProgressLog("training", 100, unit="steps", first=60, every=5.0, clock=lambda: next(clock))
        log.update(70)  # 10 steps in 10 s since the resume: 30 left → ~30 s
        log.close(80)  # stopped early (e.g. the budget): says where
    assert said == ["training: 100 steps (from 60) …", "training: 70/100 steps (70 %), 10 s elapsed, ~30 s left",
                    "training: 80/100 steps done in 20.0 s"]


@pytest.mark.slow
def test_a_piped_cli_fit_logs_every_tenth_of_the_steps(tmp_path):
    from lightning_dprel.cli import main

    with rank_zero_messages() as said:  # under pytest stdout is captured: not a terminal, as when piped
        main(["fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--trainer.default_root_dir", str(tmp_path),
              "--compare_base", "false", "--final_ckpt_path", "null"])
    found = [LINE.match(m) for m in said]
    steps = [int(m.group(1)) for m in found if m]
    tenths = [t for t in range(1, 12) if t * 10 // 12 > (t - 1) * 10 // 12]  # a line each time a tenth (1.2 steps) is crossed
    assert tenths == [2, 3, 4, 5, 6, 8, 9, 10, 11] and set(tenths) <= set(steps), said
    assert all(m.group(2) == "12" and float(m.group(3)) > 0 for m in found if m)
    assert any(re.fullmatch(r"training: 12/12 steps done in [0-9.]+ s", m) for m in said)


@pytest.mark.filterwarnings("ignore")  # an untracked, non-private fit: its warnings are beside the point here
def test_the_public_warm_start_logs_its_progress():
    from lightning_dprel.callbacks import PublicWarmStart
    from lightning_dprel.datamodules import RelationalDataModule
    from lightning_dprel.demos import random_feature_graph
    from lightning_dprel.encoders import ResidualAdapter
    from lightning_dprel.methods.relational.module import DPRelationalModule

    dm = RelationalDataModule(random_feature_graph(120, 300, dim=8), expected_batch_size=16.0, neg_per_pos=1,
                              public=random_feature_graph(90, 240, dim=8, seed=7))
    module = DPRelationalModule(ResidualAdapter(8, rank=2), clipping="none", noise_multiplier=0.0, allow_untracked=True)
    trainer = quiet_trainer([PublicWarmStart(steps=20, batch_size=32)], max_steps=1, max_epochs=-1)
    with rank_zero_messages() as said:
        trainer.fit(module, datamodule=dm)
    lines = [m for m in said if m.startswith("PublicWarmStart")]
    done = [int(re.search(r": (\d+)/20 non-private steps \(\d+ %\), \d+ s elapsed, ~\d+ s left$", m).group(1)) for m in lines[1:-1]]
    assert lines[0].endswith("20 non-private steps …") and done == list(range(2, 20, 2))
    assert re.search(r": 20 non-private steps done in [0-9.]+ s$", lines[-1])
    assert torch.isfinite(torch.stack([p.detach().sum() for p in module.parameters()])).all()
