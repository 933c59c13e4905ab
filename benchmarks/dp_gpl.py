"""DP-GPL utility (issue 23): the released student's test accuracy on WordNet nouns, side by side, per seed.

Rows: the majority class; the noise-free ensemble's student (ε = ∞); provable DP-GPL at ε ∈ {1, 2, 4} (δ = 1e-5,
σ₁ = σ₂ calibrated to ε for Q = 200, data-independent), and with the budget filter (answering stops after A answers,
A vote releases charged: ρ = Q/(2σ₁²) + A/σ₂²); DP-SGD prompt tuning at equal ε on the same labelled nodes. ``dp_gpl_groups``: the 200 queries grouped
by k public clusters, one GNMax vote per teacher per group (no threshold, k vote releases), every public training node of
an answered cluster labelled for the student (``query_groups``; k chosen on seed 0 with ``--develop-groups``). The
teachers are tuned once per seed and their votes reused across ε (the votes are not released; each ε is its own run).
The threshold T per ε was chosen on seed 0's public validation nodes (``--develop``), never on a test node or an
evaluation seed. Last iterate everywhere.

    python benchmarks/dp_gpl.py              # WordNet nouns (10k-synset subset), 3 seeds (≈ 6 min on 2 cores, embeddings cached)
    python benchmarks/dp_gpl.py --develop    # the threshold sweep on seed 0 (validation accuracy)
    python benchmarks/dp_gpl.py --develop-filter   # T, A and σ₁/σ₂ of the budget filter on seed 0
    python benchmarks/dp_gpl.py --develop-groups   # k of the query groups on seed 0
    python benchmarks/dp_gpl.py --quick      # 1 seed, ε ∈ {1, 4}
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

from lightning_dprel.datamodules.datasets import WordNetNodes
from lightning_dprel.methods.dp_gpl import DPGPLModule, PromptDataModule

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(num_teachers=250, num_queries=200, fanout=10)
MODULE = dict(hidden_dim=128, pretrain_epochs=50, teacher_epochs=100, teacher_lr=0.05, lr=0.01, delta=1e-5)
STUDENT_EPOCHS = 100
#: T (fraction of N) per ε, chosen with --develop on seed 0's validation nodes.
THRESHOLD = {1.0: 0.2, 2.0: 0.6, 4.0: 0.5}


def _trainer() -> pl.Trainer:
    return pl.Trainer(max_epochs=STUDENT_EPOCHS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=STUDENT_EPOCHS)


#: (T, A, σ₁/σ₂) per ε for the budget filter (answering stops after A answers), chosen with --develop on seed 0.
FILTER = {1.0: (0.5, 20, 2.0), 2.0: (0.5, 20, 2.0), 4.0: (0.4, 40, 2.0)}
#: k (public clusters of the query groups) per ε, chosen with --develop-groups on seed 0.
GROUPS = {None: 26, 1.0: 13, 2.0: 26, 4.0: 26}


def run(source, seed: int, eps: float | None, threshold: float | None, votes: dict, budget: tuple | None = None,
        groups: int | None = None) -> dict:
    """One DP-GPL run (teachers' votes cached per seed); returns val/test accuracy, ε, answered."""
    started = time.monotonic()
    dm = PromptDataModule(source, partition_seed=seed, seed=0, query_groups=groups, **SETTINGS)
    kw = dict(sigma_threshold=0.0, sigma_vote=0.0) if eps is None else dict(target_epsilon=eps)
    if budget is not None:
        kw.update(answer_budget=budget[0], sigma_ratio=budget[1])
    module = DPGPLModule(seed=seed, threshold=threshold, allow_untracked=True, **MODULE, **kw)
    if seed in votes:
        module.vote = lambda dm, v=votes[seed]: v  # the same teachers for every ε of this seed
    else:
        inner = module.vote
        module.vote = lambda dm: votes.setdefault(seed, inner(dm))
    trainer = _trainer()
    trainer.fit(module, dm)
    val = trainer.validate(module, dm, verbose=False)[0]["val_acc"]
    test = trainer.test(module, dm, verbose=False)[0]["test_acc"]
    y = dm.data.y[dm.public & dm.data.test_mask]
    kind = ("noise_free" if eps is None else "dp_gpl" if budget is None else "dp_gpl_filter") + ("_groups" if groups else "")
    row = dict(kind=kind, target_eps=eps, seed=seed, threshold=threshold, budget=budget, groups=groups,
               val_acc=val, test_acc=test, epsilon=module.epsilon(), answered=module.answers.num_answered,
               student_examples=dm.student_batch.size, sigmas=module.sigmas, majority=torch.bincount(y).max().item() / y.numel(), seconds=round(time.monotonic() - started, 1))
    print(json.dumps(row, default=str), flush=True)
    return row


def dpsgd(source, seed: int, eps: float) -> dict | None:
    try:
        from lightning_dprel.methods.dp_gpl.dpsgd import dpsgd_baseline_accuracy
    except ImportError:
        return None
    dm = PromptDataModule(source, partition_seed=seed, seed=0, **SETTINGS)
    dm.setup()
    started = time.monotonic()
    out = dpsgd_baseline_accuracy(dm, None, target_epsilon=eps, delta=1e-5, steps=200, expected_batch_size=250, lr=0.05,
                                  clip_norm=1.0, seed=seed)
    row = dict(kind="dp_sgd", target_eps=eps, seed=seed, test_acc=out["test_acc"], epsilon=out["epsilon"], sigma=out.get("sigma"),
               seconds=round(time.monotonic() - started, 1))
    print(json.dumps(row, default=str), flush=True)
    return row


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["target_eps"]), []).append(r)
    lines = ["| row | target ε | proven ε | test accuracy (mean ± s.e.) | per seed | answered | seeds |", "|---|---|---|---|---|---|---|"]
    for (kind, eps), rs in groups.items():
        accs = [r["test_acc"] for r in rs]
        se = statistics.stdev(accs) / math.sqrt(len(accs)) if len(accs) > 1 else float("nan")
        prov = max(float(r["epsilon"]) for r in rs)
        answered = "–" if "answered" not in rs[0] else f"{statistics.mean(r['answered'] for r in rs):.0f}"
        lines.append(f"| {kind} | {'∞' if eps is None else f'{eps:g}'} | {'∞' if math.isinf(prov) else f'{prov:.3f}'} | "
                     f"{statistics.mean(accs):.4f} ± {se:.4f} | {', '.join(f'{a:.3f}' for a in accs)} | {answered} | {len(rs)} |")
    majority = statistics.mean(r["majority"] for r in rows if "majority" in r)
    lines.append(f"| majority class | – | – | {majority:.4f} | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--develop", action="store_true")
    parser.add_argument("--develop-filter", action="store_true")
    parser.add_argument("--develop-groups", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-nodes", type=int, default=10_000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dp_gpl"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning_dprel", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    source = WordNetNodes(max_nodes=args.max_nodes)
    votes: dict = {}
    rows: list[dict] = []
    if args.develop:
        for eps in (1.0, 2.0, 4.0):
            for t in (0.2, 0.3, 0.4, 0.5, 0.6):
                rows.append(run(source, 0, eps, t, votes))
        for eps in (1.0, 2.0, 4.0):
            best = max((r for r in rows if r["target_eps"] == eps), key=lambda r: r["val_acc"])
            print(f"ε = {eps:g}: T = {best['threshold']} (val {best['val_acc']:.4f})")
        return
    if args.develop_filter:
        for eps in (1.0, 2.0, 4.0):
            for a in (10, 20, 40):
                for r in (1.0, 2.0):
                    for t in (0.4, 0.5):
                        rows.append(run(source, 0, eps, t, votes, (a, r)))
            best = max((r for r in rows if r["target_eps"] == eps), key=lambda r: r["val_acc"])
            print(f"ε = {eps:g}: T = {best['threshold']}, (A, σ₁/σ₂) = {best['budget']} (val {best['val_acc']:.4f})", flush=True)
        return
    if args.develop_groups:
        for eps in (None, 1.0, 2.0, 4.0):
            for k in (13, 26, 52):
                rows.append(run(source, 0, eps, None, votes, groups=k))
            best = max((r for r in rows if r["target_eps"] == eps), key=lambda r: r["val_acc"])
            print(f"ε = {eps}: k = {best['groups']} (val {best['val_acc']:.4f})", flush=True)
        Path(args.out + "_develop_groups.json").write_text(json.dumps(rows, indent=1, default=str))
        return
    epsilons = (1.0, 4.0) if args.quick else (1.0, 2.0, 4.0)
    for seed in range(1, 2 if args.quick else args.seeds + 1):
        rows.append(run(source, seed, None, 0.3, votes))
        rows += [run(source, seed, eps, THRESHOLD[eps], votes) for eps in epsilons]
        rows += [run(source, seed, eps, FILTER[eps][0], votes, FILTER[eps][1:]) for eps in epsilons]
        rows.append(run(source, seed, None, None, votes, groups=GROUPS[None]))
        rows += [run(source, seed, eps, None, votes, groups=GROUPS[eps]) for eps in epsilons]
        rows += [r for r in (dpsgd(source, seed, eps) for eps in epsilons) if r is not None]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    text = f"### WordNet nouns ({args.max_nodes:,}-synset subset; N = 250, Q = 200, GPF-plus, δ = 1e-5)\n\n" + table(rows)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
