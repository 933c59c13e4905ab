"""Why clipped training did not help (issue 10), reproduced on the frozen-feature adapter (HPO large, seed 0).

For the old loss (InfoNCE, τ = 0.05, C ≈ the median per-tuple norm) and the new one (hinge, margin 8): proven
ε ∈ {10, 30, 100} reporting the *last* iterate (as the runs in issue 10 did) and the checkpoint selected on
validation, plus clipped σ = 0 and non-private runs. Prints a Markdown table.

    python benchmarks/diagnose_clipping.py     # ≈ 5 min on 2 CPU cores (embeddings cached)
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utility import _datamodule, _setup_worker, run_one  # noqa: E402

BASE = {"b": 1024.0, "k": 4, "steps": 300, "lr": 3e-3, "rank": 8, "mode": "lowrank", "tau": 0.05, "optimizer": "adam",
        "every": 50, "directed": True}
LOSSES = {"infonce": dict(BASE, loss="infonce", margin=1.0), "hinge": dict(BASE, loss="hinge", margin=8.0)}
CLIP = {"infonce": 0.001, "hinge": 0.05}


def main() -> int:
    _setup_worker()
    _datamodule("hpo_large", BASE | {"loss": "hinge", "margin": 8.0}, 0).setup("fit")
    jobs = []
    for loss, cfg in LOSSES.items():
        jobs.append(dict(dataset="hpo_large", method="nonprivate", epsilon=None, seed=0, cfg=cfg))
        jobs.append(dict(dataset="hpo_large", method="clipped_sigma0", epsilon=None, seed=0, cfg=cfg, clip_norm=CLIP[loss]))
        for eps in (10.0, 30.0, 100.0):
            for select in (False, True):
                jobs.append(dict(dataset="hpo_large", method="standard", epsilon=eps, seed=0, cfg=cfg, clip_norm=CLIP[loss], select=select))
    with ProcessPoolExecutor(max_workers=2) as pool:
        records = list(pool.map(run_one, jobs))
    base = run_one(dict(dataset="hpo_large", method="base", epsilon=None, seed=0, cfg=LOSSES["hinge"]))
    print(f"base: PREC@1 {base['prec1']:.4f}  MRR {base['mrr']:.4f}  val MRR {base['val_mrr']:.4f}\n")
    print("| loss | run | σ | reported iterate | val MRR (last / selected) | test PREC@1 | test MRR |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        run = r["method"] if r["epsilon"] is None else f"standard, ε = {r['epsilon']:g}"
        which = f"step {r['selected_step']} (selected)" if r.get("selected", True) else f"step {r['steps']} (last)"
        print(f"| {r['cfg_loss']} | {run} | {r['sigma']:.3g} | {which} | {r['val_history'][-1]['mrr']:.4f} / {r['val_mrr']:.4f} | "
              f"{r['prec1']:.4f} | {r['mrr']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
