"""The README's "Use in your own Lightning project" example runs as written (a plain Trainer, no CLI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Use in your own Lightning project") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_stops_within_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = _example().replace("pl.Trainer(", "pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, ")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    privacy, trainer = scope["privacy"], scope["trainer"]
    assert 0 < privacy.epsilon <= 8.0
    assert privacy.steps == trainer.global_step > 0
    assert privacy.accountant.epsilon_after(trainer.datamodule.sampling_spec, privacy.noise_multiplier, privacy.delta) > 8.0 or (
        trainer.current_epoch >= 9
    )
    assert "FREQ-CLIP corrected" in privacy.summary
