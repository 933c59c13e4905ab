"""Every config under configs/ works from the command line: the tiny ones run (a few steps) as a piped subprocess and
print progress lines (step t/T, time left) on stderr; the full ones (MiniLM, WordNet, a GPU) parse (``--print_config``).
A new config is covered by the glob."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SHORT = ["--trainer.max_steps", "3", "--compare_base", "false", "--final_ckpt_path", "null"]
# The tiny configs, run end to end with a few steps; each phase outside the trainer that they go through is named.
TINY = {
    "tiny": (SHORT, ()),
    "tiny_adapter": (SHORT, ("embedding texts with",)),
    "dp_gcn_tiny": (SHORT, ()),
    "advsgm_tiny": (SHORT, ()),
    "pyg_mlp": (SHORT, ()),
    "entities_items_tiny": (SHORT, ()),
    "dp_gpl_tiny": (["--trainer.max_epochs", "3", "--model.init_args.pretrain_epochs", "3",
                     "--model.init_args.teacher_epochs", "5", "--compare_base", "false", "--final_ckpt_path", "null"],
                    ("pre-training Φ (dgi) on the public graph", "tuning 30 teacher prompts")),
}
TRAINING = re.compile(r"^training: \d+ steps …$", re.M)
DONE = re.compile(r"^training: (\d+)/\1 steps done in [0-9.]+ s$", re.M)


def _run(name: str, tmp: Path) -> tuple[subprocess.CompletedProcess, float]:
    extra, _ = TINY[name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIGHTNING_DPREL_CACHE": str(tmp / "cache")}
    start = time.perf_counter()
    done = subprocess.run(  # stdout and stderr are pipes: no terminal, as in a log
        [sys.executable, "-m", "lightning_dprel", "fit", "--config", str(ROOT / "configs" / f"{name}.yaml"),
         "--trainer.default_root_dir", str(tmp / name), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    return done, time.perf_counter() - start


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Every tiny config run once, two at a time (2 cores)."""
    tmp = tmp_path_factory.mktemp("runs")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(TINY, pool.map(lambda name: _run(name, tmp), TINY)))


@pytest.mark.slow
def test_the_tiny_set_names_existing_configs():
    assert set(TINY) <= {p.stem for p in CONFIGS}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_a_tiny_config_runs_piped_and_shows_its_progress_on_stderr(name, tiny_runs):
    done, seconds = tiny_runs[name]
    assert done.returncode == 0, done.stderr[-3000:]
    assert TRAINING.search(done.stderr) and DONE.search(done.stderr), done.stderr[-3000:]
    assert "training:" not in done.stdout  # the report goes to stdout, progress to stderr
    for phase in TINY[name][1]:
        assert re.search(rf"^{re.escape(phase)}.* …$", done.stderr, re.M), (phase, done.stderr[-3000:])
        assert re.search(rf"^{re.escape(phase)}.* done in [0-9.]+ s$", done.stderr, re.M), (phase, done.stderr[-3000:])
    print(f"{name}: {seconds:.1f} s end to end")


@pytest.mark.slow
@pytest.mark.parametrize("config", [p for p in CONFIGS if p.stem not in TINY], ids=lambda p: p.stem)
def test_every_other_config_parses(config, capsys):
    if config.stem.startswith("audit"):  # `python -m lightning_dprel.audit --config ...`, not a Lightning run
        from lightning_dprel.audit.cli import _load

        assert _load(str(config))["settings"]
        return
    from lightning_dprel.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(config), "--print_config"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "class_path:" in out and "max_steps:" in out
    assert "enable_progress_bar: false" not in out, "progress is off: piped runs of this config say nothing while training"


AUDITS = sorted((ROOT / "configs").glob("audit*.yaml"))


def _short_audit(config: Path, tmp: Path) -> Path:
    """``config`` made tiny: few canaries, at most 2 steps per white-box setting, one black-box setting of 3 short fits
    on a small graph (its own settings otherwise: the progress lines come from the same code)."""
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg.update(num_canaries=min(int(cfg.get("num_canaries", 200)), 200), seed=3, output=str(tmp / f"{config.stem}.json"))
    cfg["settings"] = [{**s, "steps": min(int(s.get("steps", 2)), 2)} for s in cfg["settings"]]
    if cfg.get("blackbox"):
        private = [s for s in cfg["blackbox"]["settings"] if s != "nonprivate"]
        cfg["blackbox"].update(settings=private[:1] or cfg["blackbox"]["settings"][:1], num_canaries=32, degree=2, epochs=2,
                               background_nodes=100, background_edges=200, expected_batch_size=16)
    short = tmp / f"{config.stem}_short.yaml"
    short.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return short


@pytest.mark.slow
@pytest.mark.parametrize("config", AUDITS, ids=lambda p: p.stem)
def test_an_audit_config_runs_piped_and_shows_its_progress_on_stderr(config, tmp_path):
    short = _short_audit(config, tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(  # piped, as in a log: the audit mutes Lightning's messages but not its own progress
        [sys.executable, "-m", "lightning_dprel.audit", "--config", str(short)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    err, cfg = done.stderr, __import__("yaml").safe_load(short.read_text())
    total = len(cfg["settings"])
    assert re.search(rf"^audit: white-box, {total} settings on .* …$", err, re.M), err[-3000:]
    for i, setting in enumerate(cfg["settings"], 1):  # a line per setting: its name, done/total and seconds
        assert re.search(rf"^audit: white-box {i}/{total} {re.escape(repr(setting['name']))} done in [0-9.]+ s", err, re.M), err[-3000:]
    if cfg.get("blackbox"):
        name = cfg["blackbox"]["settings"][0]
        assert re.search(rf"^audit: black-box, 1 setting \({name}\), 3 fits each …$", err, re.M), err[-3000:]
        for fit, world in enumerate(("secret coins", "all in", "all out"), 1):
            head = re.escape(f"audit: black-box 1/1 {name} fit {fit}/3")
            assert re.search(rf"^{head} \({world}\) …$", err, re.M), err[-3000:]  # the fit starts
            assert re.search(rf"^{head} training: \d+ steps …$", err, re.M), err[-3000:]
            assert re.search(rf"^{head} training: \d+/\d+ steps \(\d+ %\)", err, re.M), err[-3000:]  # its steps
            assert re.search(rf"^{head} training: (\d+)/\1 steps done in [0-9.]+ s$", err, re.M), err[-3000:]
            assert re.search(rf"^{head} \({world}\) done in [0-9.]+ s$", err, re.M), err[-3000:]  # and ends
        assert "Black-box audit" in done.stdout
    assert "Empirical privacy audit" in done.stdout and "audit:" not in done.stdout  # tables on stdout, progress on stderr
    for noise in ("GPU available", "LOCAL_RANK", "`Trainer.fit` stopped", "Missing logger folder"):
        assert noise not in err, noise  # Lightning's own messages stay muted
    print(f"{config.stem} (shortened): {seconds:.1f} s end to end")
