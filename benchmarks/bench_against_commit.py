"""A benchmark run on this tree's library and on an earlier commit's, alternating, side by side in one run.

The earlier commit is checked out into a temporary ``git worktree``; each round runs *this* tree's benchmark script
twice in fresh processes, once importing the earlier library (``PYTHONPATH`` ahead of the editable install) and once
this tree's, in alternating order so a shared machine's load falls on both. It prints, per model, the private step of
each tree, their ratio (this / earlier) per round and the median, and writes the records to ``--out``.

Usage: ``python benchmarks/bench_against_commit.py --ref cce4920 [--rounds 3] [--models mlp,transformer] [--quick]``
(each run is ``bench_made_private.py``: 5 alternating rounds inside, about 40 s on a 2-core CPU; ``--quick`` 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "made_private_vs_commit.json"


def _run(tree: Path, models: str, threads: int, out: Path, quick: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_made_private.py"), "--models", models,
           "--threads", str(threads), "--out", str(out), *(["--quick"] if quick else [])]
    subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", required=True, help="the earlier commit (e.g. the main this change starts from)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="bench_made_private.py --quick per run (noisier)")
    args = parser.parse_args()
    ref = subprocess.run(["git", "rev-parse", "--short", args.ref], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), ref], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            trees = {"ref": worktree, "this": ROOT}
            runs: dict[str, list[dict]] = {"ref": [], "this": []}
            for r in range(args.rounds):
                for name in (("ref", "this") if r % 2 == 0 else ("this", "ref")):
                    runs[name].append(_run(trees[name], args.models, args.threads, Path(tmp) / f"{name}{r}.json", args.quick))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)
    record = {"ref": ref, "this": f"{head} + working tree", "rounds": args.rounds, "quick": args.quick, "models": {}}
    mode = " --quick" if args.quick else ""
    print(f"\nprivate step (bench_made_private.py{mode}), {ref} vs this tree, {args.rounds} alternating rounds")
    for model in args.models.split(","):
        ref_ms = [x["models"][model]["private_step_ms"] for x in runs["ref"]]
        this_ms = [x["models"][model]["private_step_ms"] for x in runs["this"]]
        ratios = [t / f for t, f in zip(this_ms, ref_ms)]
        record["models"][model] = {"ref_private_step_ms": ref_ms, "this_private_step_ms": this_ms, "ratios": ratios,
                                   "median_ratio": statistics.median(ratios)}
        print(f"  {model}: {ref} {statistics.median(ref_ms):.2f} ms, this {statistics.median(this_ms):.2f} ms; "
              f"this / {ref} = {statistics.median(ratios):.3f} (rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
