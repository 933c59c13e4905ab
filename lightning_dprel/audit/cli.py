"""``python -m lightning_dprel.audit --config configs/audit_tiny.yaml``: proven ε next to audited lower bounds.

The config names the canary design, the number of canaries m, their degree K, δ, the confidence, the JSON
output path, and a list of settings (:class:`~lightning_dprel.audit.whitebox.WhiteBoxSetting` fields). Exit
status 0; 3 when an audited lower bound exceeds a proven ε (a violation: report it as a bug). The tables go to
stdout; plain progress lines (``audit: …``: each white-box setting, each black-box fit and its steps) go to stderr,
also when piped, while Lightning's own per-fit messages stay muted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lightning_dprel.audit.canaries import canary_graph
from lightning_dprel.audit.runner import AuditRecord, audit_setting
from lightning_dprel.audit.whitebox import WhiteBoxSetting

__all__ = ["format_audit", "main", "run_config"]

_TOP = {"design", "num_canaries", "degree", "extra_nodes", "delta", "confidence", "seed", "output", "settings", "blackbox"}


def _load(path: str) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"audit: config file not found: {path}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("settings"), list) or not cfg["settings"]:
        raise SystemExit(f"audit: {path} must be a mapping with a non-empty list `settings`.")
    unknown = sorted(set(cfg) - _TOP)
    if unknown:
        raise SystemExit(f"audit: unknown keys {unknown} in {path}; allowed: {sorted(_TOP)}.")
    seed = cfg.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise SystemExit(f"audit: `seed` must be null (secret) or an int >= 0, got {seed!r}.")
    if not (0.0 < float(cfg.get("delta", 1e-5)) < 1.0) or not (0.0 < float(cfg.get("confidence", 0.95)) < 1.0):
        raise SystemExit("audit: `delta` and `confidence` must be in (0, 1).")
    _settings(cfg)  # every setting checked before any training run
    return cfg


def _settings(cfg: dict[str, Any]) -> list[WhiteBoxSetting]:
    out = []
    for raw in cfg["settings"]:
        try:
            out.append(WhiteBoxSetting(**raw))
        except (TypeError, ValueError) as err:
            raise SystemExit(f"audit: bad setting {raw}: {err}") from None
    return out


def say(line: str) -> None:
    """One progress line on stderr, flushed (the command's progress: plain lines, also when piped)."""
    print(line, file=sys.stderr, flush=True)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def run_config(cfg: dict[str, Any], progress: Callable[[str], None] | None = None) -> list[AuditRecord]:
    """Audit every setting of a loaded config on one canary graph; ``progress`` (e.g. :func:`say`) gets a line as the
    audit starts and one per setting done (name, done/total, seconds)."""
    settings = _settings(cfg)
    design, m, k = cfg.get("design", "freq_adversarial"), int(cfg.get("num_canaries", 2000)), int(cfg.get("degree", 10))
    start = time.perf_counter()
    if progress is not None:
        progress(f"audit: white-box, {_count(len(settings), 'setting')} on {design} canaries (m = {m:,}, K = {k}) …")
    graph = canary_graph(design, m, k, extra_nodes=int(cfg.get("extra_nodes", 0)))
    records = []
    for i, setting in enumerate(settings, 1):
        began = time.perf_counter()
        records.append(
            audit_setting(graph, setting, delta=float(cfg.get("delta", 1e-5)), confidence=float(cfg.get("confidence", 0.95)),
                          seed=cfg.get("seed"))
        )
        if progress is not None:
            now = time.perf_counter()
            progress(f"audit: white-box {i}/{len(settings)} {setting.name!r} done in {now - began:.1f} s "
                     f"({now - start:.0f} s elapsed)")
    return records


def run_blackbox(cfg: dict[str, Any], progress: Callable[[str], None] | None = None) -> list[Any]:
    """The config's optional ``blackbox`` section: real training, released model only (``audit.blackbox``);
    ``progress`` (e.g. :func:`say`) gets a line as each fit starts and ends and step lines during each fit."""
    section = cfg.get("blackbox")
    if not section:
        return []
    if not isinstance(section, dict) or not isinstance(section.get("settings"), list):
        raise SystemExit("audit: `blackbox` must be a mapping with a list `settings` (e.g. [nonprivate, freq_corrected]).")
    if "progress" in section:
        raise SystemExit("audit: `progress` is no `blackbox` key: the command always prints progress lines to stderr.")
    names = section["settings"]
    if progress is not None:  # before Lightning's import, which takes seconds
        fits = 1 if section.get("two_run") is False else 3
        progress(f"audit: black-box, {_count(len(names), 'setting')} ({', '.join(map(str, names))}), "
                 f"{_count(fits, 'fit')} each …")
    from lightning_dprel.audit.blackbox import (
        blackbox_audit,  # Lightning only when asked for
    )

    kwargs = {k: v for k, v in section.items() if k != "settings"}
    kwargs.setdefault("delta", float(cfg.get("delta", 1e-5)))
    kwargs.setdefault("confidence", float(cfg.get("confidence", 0.95)))

    def each(i: int) -> Callable[[str], None] | None:
        return None if progress is None else (lambda line: progress(f"audit: black-box {i}/{len(names)} {line}"))

    try:
        with _quiet():
            return [blackbox_audit(name, progress=each(i), **kwargs) for i, name in enumerate(names, 1)]
    except TypeError as err:
        raise SystemExit(f"audit: bad `blackbox` section: {err}") from None


@contextlib.contextmanager
def _quiet():
    """Lightning's per-fit banners and our per-fit info lines, for the many short fits of an audit."""
    names = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric")
    levels = {n: logging.getLogger(n).level for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in names:
            logging.getLogger(n).setLevel(logging.WARNING)
        try:
            yield
        finally:
            for n, level in levels.items():
                logging.getLogger(n).setLevel(level)


def format_blackbox(audits: list[Any]) -> str:
    """The black-box table: proven ε of the real training run next to both lower bounds."""
    first = audits[0]
    each = first.one_run.confidence  # each bound's; the pair's is 1 − 2(1 − each) when both were taken
    overall = 1.0 - 2.0 * (1.0 - each) if first.two_run is not None else each
    lines = [
        (f"Black-box audit — real training, released model only (m = {first.num_canaries}, K = {first.degree}, "
         f"{first.steps} steps), δ = {first.delta:g}, lower bounds at {overall:.0%} confidence per setting"),
        f"{'setting':<30}{'sigma':>7}{'proven eps':>12}{'claimed eps':>13}{'one-run lb':>12}{'two-run lb':>12}  verdict",
    ]
    for a in audits:
        two = a.two_run.epsilon if a.two_run is not None else float("nan")
        verdict = "NO NOISE: not private" if math.isinf(a.epsilon) else ("VIOLATION" if a.violation else "ok")
        lines.append(
            f"{a.setting:<30}{a.noise_multiplier:>7.3g}{a.epsilon_proven:>12.3f}{a.epsilon:>13.3f}{a.one_run.epsilon:>12.3f}"
            f"{two:>12.3f}  {verdict}"
        )
    return "\n".join(lines)


def _verdict(r: AuditRecord) -> str:
    if r.no_noise:
        return "NO NOISE: not private"
    if r.violation:
        return "VIOLATION: lower bound > proven ε"
    if r.claim_refuted:
        return "claimed ε refuted (proven holds)"
    return "ok"


def format_audit(records: list[AuditRecord], cfg: dict[str, Any]) -> str:
    """The audit table: per setting σ, proven ε, claimed ε, both audited lower bounds, the verdict."""
    first = records[0]
    lines = [
        (f"Empirical privacy audit — white-box gradient canaries ({first.design}, m = {first.canaries}, K = {first.degree}), "
         f"δ = {first.delta:g}, lower bounds at {first.confidence:.0%} confidence per setting (each bound at "
         f"{first.one_run.confidence:.1%})"),
        f"{'setting':<30}{'sigma':>7}{'proven eps':>12}{'claimed eps':>13}{'one-run lb':>12}{'two-run lb':>12}  verdict",
    ]
    for r in records:
        s = r.setting
        lines.append(
            f"{s['name']:<30}{s['noise_multiplier']:>7.3g}{r.epsilon_proven:>12.3f}{r.epsilon_claimed:>13.3f}"
            f"{r.one_run.epsilon:>12.3f}{_two(r.two_run):>12}  {_verdict(r)}"
        )
    lines.append("proven = FREQ-CLIP corrected accounting / Theorem C.1 (standard); claimed = the setting's own accounting.")
    return "\n".join(lines)


def _two(bound: Any) -> str:
    return "n/a (k>0)" if bound is None else f"{bound.epsilon:.3f}"


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dprel.audit", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML audit config (e.g. configs/audit_tiny.yaml)")
    parser.add_argument("--output", default=None, help="JSON record path (default: the config's `output`)")
    args = parser.parse_args(argv)
    cfg = _load(args.config)
    start = time.perf_counter()
    records = run_config(cfg, progress=say)
    print(format_audit(records, cfg), flush=True)
    blackbox = run_blackbox(cfg, progress=say)
    if blackbox:
        print(format_blackbox(blackbox))
    out = args.output or cfg.get("output")
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"config": cfg, "seconds": time.perf_counter() - start, "audits": [r.to_dict() for r in records],
                  "blackbox": [{k: v for k, v in a.to_dict().items() if k not in ("scores", "coins", "in_scores", "out_scores")}
                               for a in blackbox]}
        path.write_text(json.dumps(_json_safe(record), indent=2) + "\n")
        print(f"JSON record: {path}")
    if any(r.violation for r in records) or any(a.violation for a in blackbox):
        print("audit: an audited lower bound exceeds a proven ε (each setting at the stated confidence) — the guarantee "
              "looks broken; re-run to rule out the 1 − confidence chance, then please report it.", file=sys.stderr)
        return 3
    return 0
