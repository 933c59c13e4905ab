"""AdvSGM utility (spec A3/A4): link-prediction AUC and clustering NMI/MI of skip-gram node embeddings, side by side.

Rows per graph and seed: skip-gram (LINE, 2nd order) and skip-gram + adversarial terms without DP; the provable private
pipeline without noise (clipping only: its ceiling); provable DP-SGM and DP-AdvSGM at ε ∈ {1, 2, 4, 6} (δ = 1e-5, σ
calibrated by the PrivacyCallback, unit ``node_public_ids``); the paper-faithful AdvSGM stopped by its Theorem 7 at
each nominal ε, printed beside its provable ε (∞), and run to its 750 iterations (the paper's "no DP" row). Last
iterate everywhere; no selection. AUC: held-out edges (10 %) against as many public random non-edges; clustering:
k-means on the row-normalised W_in against the block / lexicographer-file / organ-system labels.

Settings were fixed beforehand in a development sweep on another block-model draw (the private rows: SGD, lr 50, tables
initialised at 0.01, K = 10, b = 600, k = 5, r = 16, 1000 steps; the non-private rows: Adam, lr 0.05).

    python benchmarks/advsgm.py                 # SBM 3 seeds + WordNet and HPO 1 seed (≈ 20 min on 2 CPU cores)
    python benchmarks/advsgm.py --quick         # SBM 1 seed, ε ∈ {1, 6}
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

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules.datasets import BlockModelGraph, HPOGraph, WordNetNounGraph
from lightning_dprel.methods.advsgm import AdvSGMPaperDataModule, DPSkipGramModule, PaperStop, SkipGramDataModule
from lightning_dprel.methods.advsgm.evaluation import cluster_scores, link_auc, sample_non_edges

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = dict(max_degree=10, expected_batch_size=600, neg_per_pos=5, dim=16, steps=1000, lr=50.0, optimizer="sgd", init_std=0.01)
PUBLIC = dict(lr=0.05, optimizer="adam", init_std=1.0)


def _trainer(steps: int, callbacks=()) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu",
                      callbacks=list(callbacks))


def evaluate(module: DPSkipGramModule, dm: SkipGramDataModule, graph, seed: int) -> dict:
    """Link AUC on the held-out edges vs as many public random non-edges, and clustering NMI/MI on W_in."""
    pos = torch.stack([dm.eval_query, dm.eval_target])
    neg = sample_non_edges(graph.edge_index, graph.num_nodes, pos.shape[1], generator=torch.Generator().manual_seed(10_000 + seed))
    out = {"auc": link_auc(module.node_vectors, pos, neg)}
    out.update(cluster_scores(module.node_vectors, graph.y, seed=seed, restarts=3))
    return out


def run(kind: str, graph, seed: int, eps: float | None = None) -> dict:
    p = PRIVATE
    started = time.monotonic()
    common = dict(test_fraction=0.1, seed=0)
    if kind.startswith("paper"):
        dm = AdvSGMPaperDataModule(graph, batch_size=128, neg_per_pos=5, **common)
        module = DPSkipGramModule(mode="paper", dim=p["dim"], lr=0.1)
        callbacks = [PaperStop(eps)] if eps is not None else []
        _trainer(2 * 750, callbacks).fit(module, dm)
        row = {"provable_eps": math.inf, "nominal_eps": module.paper_claim.get("nominal_epsilon"),
               "iterations": module.privacy_ledger.steps}
    else:
        private = kind.startswith("dp") or kind == "clipped"
        adv = 0.5 if "adv" in kind else 0.0
        dm = SkipGramDataModule(graph, max_degree=p["max_degree"], expected_batch_size=p["expected_batch_size"],
                                neg_per_pos=p["neg_per_pos"], **common)
        opts = {k: p[k] for k in ("lr", "optimizer", "init_std")} if private else PUBLIC
        module = DPSkipGramModule(dim=p["dim"], adversarial=adv, clipping="standard" if private else "none",
                                  noise_multiplier=1.0 if kind.startswith("dp") else 0.0, allow_untracked=not kind.startswith("dp"), **opts)
        callbacks = [PrivacyCallback(target_epsilon=eps, delta=1e-5, calibrate=True)] if kind.startswith("dp") else []
        _trainer(p["steps"], callbacks).fit(module, dm)
        spent = module.privacy_ledger.epsilon(1e-5) if kind.startswith("dp") else math.inf
        row = {"provable_eps": spent, "sigma": module.noise_spec.noise_multiplier}
    row.update(evaluate(module, dm, graph, seed))
    row.update(kind=kind, target_eps=eps, seed=seed, seconds=round(time.monotonic() - started, 1))
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict], name: str) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["target_eps"]), []).append(r)
    lines = [f"### {name}", "", "| row | nominal ε | provable ε | AUC (mean ± s.e.) | NMI | MI | seeds |", "|---|---|---|---|---|---|---|"]

    def ms(v: list[float]) -> str:
        se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
        return f"{statistics.mean(v):.4f} ± {se:.4f}"

    for (kind, eps), rs in groups.items():
        prov = max(r["provable_eps"] for r in rs)
        nominal = "–" if eps is None else f"{eps:g}"
        lines.append(f"| {kind} | {nominal} | {'∞' if math.isinf(prov) else f'{prov:.3f}'} | {ms([r['auc'] for r in rs])} | "
                     f"{statistics.mean(r['nmi'] for r in rs):.4f} | {statistics.mean(r['mi'] for r in rs):.4f} | {len(rs)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-large", action="store_true", help="skip WordNet and HPO")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "advsgm"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning_dprel", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    epsilons = (1.0, 6.0) if args.quick else (1.0, 2.0, 4.0, 6.0)
    seeds = range(1, 2 if args.quick else args.seeds + 1)
    plan = [("sgm", None), ("sgm_adv", None), ("clipped", None), ("paper", None)]
    plan += [(k, e) for k in ("dp_sgm", "dp_advsgm", "paper") for e in epsilons]
    results: dict[str, list[dict]] = {"sbm": []}
    for seed in seeds:
        graph = BlockModelGraph(seed=seed).load().train
        results["sbm"] += [run(kind, graph, seed, eps) for kind, eps in plan]
    if not (args.quick or args.no_large):
        for name, source in (("hpo", HPOGraph()), ("wordnet", WordNetNounGraph())):
            try:
                graph = source.load().train
            except (FileNotFoundError, ValueError) as err:
                print(f"{name}: skipped ({err})")
                continue
            results[name] = [run(kind, graph, 1, eps) for kind, eps in (("sgm", None), ("dp_sgm", 1.0), ("dp_sgm", 6.0), ("paper", 6.0))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    text = "\n\n".join(table(rows, name) for name, rows in results.items())
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
