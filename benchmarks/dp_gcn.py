"""DP-GCN with random graph splits on WordNet noun classification (the paper's Figure 4 analogue), on CPU.

Rows: non-private GCN; DP-GCN without splits (s = 1: the whole training graph is one example, q = 1); DP-GCN with
s ∈ {4, 10, 50, 500} secret random subgraphs (Poisson q = min(1, max(10/s, 0.2)): every subgraph at s ≤ 10, 10 of 50,
100 of 500 per step); and the no-graph baseline, a 2-layer MLP on s = 500 examples with every edge ignored. Columns: ε ∈ {1, 4, 10} (δ = 1e-5, node-level, replace-one
accounting, σ calibrated by the PrivacyCallback for the run's T steps). Test accuracy and macro-F1 of the last
iterate, mean ± std over 3 seeds (model init; the splits and batches come from secret keyed streams).

Data: WordNet 3.0 nouns (82,115 synsets, 26 lexicographer files, hypernym/holonym edges), node text embedded once by
MiniLM-L6 (cached). Usage: ``python benchmarks/dp_gcn.py [--steps 100] [--seeds 3] [--max-nodes N]``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch

EPSILONS = (1.0, 4.0, 10.0)


def run(data, *, conv: str, splits: int, epsilon: float | None, seed: int, steps: int, lr: float) -> dict:
    from pytorch_lightning import Trainer

    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.datamodules.datasets.nodes import InMemoryNodes
    from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
    from lightning_dprel.methods.dp_gcn.gnn import GNNClassifier
    from lightning_dprel.methods.dp_gcn.module import DPNodeModule

    dm = NodeSplitDataModule(InMemoryNodes(data, "WordNet nouns"), num_splits=splits, sampling_rate=min(1.0, max(10.0 / splits, 0.2)))
    torch.manual_seed(seed)
    enc = GNNClassifier(int(data.x.shape[1]), int(data.num_classes), hidden_dim=32, dropout=0.0, conv=conv)
    private = epsilon is not None
    module = DPNodeModule(enc, clipping="standard" if private else "none", noise_multiplier=1.0 if private else 0.0, lr=lr)
    callbacks = [PrivacyCallback(target_epsilon=epsilon, delta=1e-5, calibrate=True)] if private else []
    trainer = Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    out = trainer.test(module, datamodule=dm, verbose=False)[0]
    res = {"acc": out["test_acc"], "macro_f1": out["test_macro_f1"]}
    if private:
        res.update(epsilon=callbacks[0].epsilon, sigma=module.noise_spec.noise_multiplier)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--max-nodes", type=int, default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from lightning_dprel.datamodules.datasets.nodes import WordNetNodes

    data = WordNetNodes(args.max_nodes).load()
    print(f"WordNet nouns: {data.num_nodes} nodes, {data.edge_index.shape[1] // 2} edges, {data.num_classes} classes; "
          f"{int(data.train_mask.sum())} training nodes; majority-class test accuracy "
          f"{float((data.y[data.test_mask] == data.y[data.train_mask].mode().values).float().mean()):.3f}")
    rows = [("GCN, non-private", "gcn", 1, False)] + [("DP-GCN, no splits (s = 1)", "gcn", 1, True)] + \
        [(f"DP-GCN, s = {s}", "gcn", s, True) for s in (4, 10, 50, 500)] + [("MLP (no edges), s = 500", "none", 500, True),
                                                                           ("MLP (no edges), non-private", "none", 1, False)]
    t0, results = time.time(), []
    for label, conv, s, private in rows:
        for eps in (EPSILONS if private else (None,)):
            runs = [run(data, conv=conv, splits=s, epsilon=eps, seed=seed, steps=args.steps, lr=args.lr) for seed in range(args.seeds)]
            acc, f1 = np.array([r["acc"] for r in runs]), np.array([r["macro_f1"] for r in runs])
            entry = {"row": label, "conv": conv, "splits": s, "epsilon_target": eps, "acc_mean": acc.mean(), "acc_std": acc.std(),
                     "f1_mean": f1.mean(), "f1_std": f1.std(), "runs": runs}
            results.append(entry)
            sig = f" σ = {runs[0]['sigma']:.3g}" if private else ""
            print(f"{label:<30} ε = {eps if eps else '∞':<5} acc {acc.mean():.3f} ± {acc.std():.3f}   macro-F1 {f1.mean():.3f} ± "
                  f"{f1.std():.3f}{sig}   ({time.time() - t0:.0f} s)", flush=True)
    lines = ["| method | ε = 1 acc / F1 | ε = 4 acc / F1 | ε = 10 acc / F1 | non-private acc / F1 |", "|---|---|---|---|---|"]
    for label, _, _, private in rows:
        cells = []
        for eps in EPSILONS + (None,):
            hit = [e for e in results if e["row"] == label and e["epsilon_target"] == eps]
            cells.append(f"{hit[0]['acc_mean']:.3f} ± {hit[0]['acc_std']:.3f} / {hit[0]['f1_mean']:.3f}" if hit else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print("\n" + table + f"\n\n{args.steps} steps, {args.seeds} seeds, {time.time() - t0:.0f} s")
    out = Path(__file__).parent / "results"
    (out / "dp_gcn.md").write_text(table + "\n")
    (out / "dp_gcn.json").write_text(json.dumps({"steps": args.steps, "seeds": args.seeds, "lr": args.lr, "results": results}, indent=1, default=float))


if __name__ == "__main__":
    main()
