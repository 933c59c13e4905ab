"""The main job's spread over runs: the README command, run N times as it is, its rows side by side.

Each run is ``python -m lightning_dprel fit --config configs/default.yaml`` (secret sampling, draws and noise keys, so
runs differ), with only its output folder changed; the numbers are read from the ``report.json`` it writes beside
its checkpoint. Prints every run's rows (base, the baselines, the private model, the reference), ε, σ and the
selected step, then on how many runs the private model beats each other row; writes
``benchmarks/results/main_job_spread.{json,md}`` (``--config`` another job: ``<stem>_spread``).

    python benchmarks/main_job_spread.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(config: str) -> list[str]:
    return [sys.executable, "-m", "lightning_dprel", "fit", "--config", config]


def run(i: int, config: str, out: Path) -> dict:
    folder = out / f"run{i}"
    started = time.monotonic()
    print(f"run {i}: {' '.join(command(config)[1:])} --trainer.default_root_dir {folder}", file=sys.stderr, flush=True)
    subprocess.run([*command(config), "--trainer.default_root_dir", str(folder)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)  # its progress lines go to stderr, shown
    report = json.loads((folder / "report.json").read_text())
    selection = next((r.get("selection") for r in report["rows"] if r.get("selection")), None) or {}
    return {"run": i, "seconds": round(time.monotonic() - started, 1), "rows": report["rows"],
            "epsilon": report["epsilon"], "delta": report["delta"], "bound": report.get("bound"),
            "sigma": report["sigma"], "selected_step": selection.get("step"), "unit": report.get("privacy_unit")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "main_job_spread"))
    args = parser.parse_args()
    runs = [run(i, args.config, Path(args.out)) for i in range(args.runs)]
    names = [r["name"] for r in runs[0]["rows"]]
    metrics = list(runs[0]["rows"][-1]["metrics"] or runs[0]["rows"][0]["metrics"])
    private = next(r["name"] for r in runs[0]["rows"] if r.get("selection") is not None or r["name"] == "private model")
    first = metrics[0]
    lines = ["| run | " + " | ".join(f"{n} ({first})" for n in names) + " | ε (δ, bound) | σ | selected step | s |",
             "|" + "---|" * (len(names) + 5)]
    for r in runs:
        values = {row["name"]: row["metrics"].get(first) for row in r["rows"]}
        lines.append(f"| {r['run']} | " + " | ".join("" if values.get(n) is None else f"{values[n]:.4f}" for n in names)
                     + f" | {r['epsilon']:.4f} ({r['delta']:.3g}, {r['bound']}) | {r['sigma']:.4g} | {r['selected_step']} | "
                     f"{r['seconds']} |")
    beats = {}
    for other in names:
        if other == private or "reference" in other:
            continue
        per_run = [{m: row["metrics"].get(m) for row in r["rows"] if row["name"] == private for m in metrics} for r in runs]
        theirs = [{m: row["metrics"].get(m) for row in r["rows"] if row["name"] == other for m in metrics} for r in runs]
        beats[other] = {m: sum(a[m] > b[m] for a, b in zip(per_run, theirs)) for m in metrics}
    mean = {m: statistics.mean(row["metrics"][m] for r in runs for row in r["rows"] if row["name"] == private) for m in metrics}
    lines.append("")
    lines += [f"{private} beats {other} on {', '.join(f'{m} {k}/{len(runs)}' for m, k in b.items())} runs" for other, b in beats.items()]
    lines.append(f"{private}: mean " + ", ".join(f"{m} {v:.4f}" for m, v in mean.items()) + f" over {len(runs)} runs")
    text = "\n".join(lines)
    print(text)
    stem = "main_job" if args.config == "configs/default.yaml" else Path(args.config).stem
    results = ROOT / "benchmarks" / "results"
    (results / f"{stem}_spread.md").write_text(f"`{' '.join(command(args.config)[1:])}`, {len(runs)} runs, unit: "
                                               f"{runs[0]['unit']}\n\n{text}\n")
    (results / f"{stem}_spread.json").write_text(json.dumps(
        {"command": command(args.config)[1:], "runs": runs, "private_beats": beats, "private_mean": mean}, indent=2))


if __name__ == "__main__":
    main()
