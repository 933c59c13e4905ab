"""The main job's spread over runs: the README command, run N times as it is, gains over the base side by side.

Each run is ``python -m lightning_dprel fit --config configs/default.yaml`` (secret sampling and noise keys, so runs
differ), with only its output folder and a results file added. Prints every run's base / fine-tuned PREC@1 and MRR, ε
and the selected step, then the mean ± std of the gain; writes ``benchmarks/results/main_job_spread.{json,md}``.

    python benchmarks/main_job_spread.py --runs 5      # ≈ 40 s a run on 2 idle CPU cores (embeddings cached)
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
COMMAND = [sys.executable, "-m", "lightning_dprel", "fit", "--config", "configs/default.yaml"]


def run(i: int, out: Path) -> dict:
    folder = out / f"run{i}"
    started = time.monotonic()
    subprocess.run([*COMMAND, "--trainer.default_root_dir", str(folder), "--results_json", str(folder / "results.json")], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.loads((folder / "results.json").read_text())
    return {"run": i, "seconds": round(time.monotonic() - started, 1), "base_prec1": r["base"]["test_prec1"],
            "prec1": r["tuned"]["test_prec1"], "base_mrr": r["base"]["test_mrr"], "mrr": r["tuned"]["test_mrr"],
            "epsilon": r["privacy"]["epsilon"], "delta": r["privacy"]["delta"], "sigma": r["privacy"]["sigma"],
            "selected_step": (r.get("selection") or {}).get("step")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "outputs" / "main_job_spread"))
    args = parser.parse_args()
    rows = [run(i, Path(args.out)) for i in range(args.runs)]
    gains = {k: [r[k] - r[f"base_{k}"] for r in rows] for k in ("prec1", "mrr")}
    summary = {k: {"mean": statistics.mean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
                   "above_base": sum(g > 0 for g in v)} for k, v in gains.items()}
    lines = ["| run | base PREC@1 | PREC@1 | gain | base MRR | MRR | gain | ε (δ) | σ | selected step | s |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['run']} | {r['base_prec1']:.4f} | {r['prec1']:.4f} | {r['prec1'] - r['base_prec1']:+.4f} | "
                     f"{r['base_mrr']:.4f} | {r['mrr']:.4f} | {r['mrr'] - r['base_mrr']:+.4f} | {r['epsilon']:.4f} "
                     f"({r['delta']:g}) | {r['sigma']:.4g} | {r['selected_step']} | {r['seconds']} |")
    for k, label in (("prec1", "PREC@1"), ("mrr", "MRR")):
        s = summary[k]
        lines.append(f"\n{label} gain over the base: {s['mean']:+.4f} ± {s['std']:.4f} (mean ± std over {len(rows)} runs; "
                     f"above the base in {s['above_base']}/{len(rows)})")
    text = "\n".join(lines)
    print(text)
    results = ROOT / "benchmarks" / "results"
    (results / "main_job_spread.md").write_text(f"`{' '.join(COMMAND[1:])}`, {len(rows)} runs\n\n{text}\n")
    (results / "main_job_spread.json").write_text(json.dumps({"command": COMMAND[1:], "runs": rows, "gain": summary}, indent=2))


if __name__ == "__main__":
    main()
