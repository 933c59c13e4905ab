"""AdvSGM utility (spec A3/A4): link-prediction AUC and clustering NMI/MI of skip-gram node embeddings, side by side.

Rows per graph and seed (last iterate everywhere; no selection; δ = 1e-5; σ calibrated by the PrivacyCallback):

- ``sgm`` / ``sgm_adv``: skip-gram (LINE, 2nd order) without and with the adversarial terms, no DP, degree cap K = 10;
  ``sgm_uncapped``: skip-gram without DP or cap (the reference lift for the edge level).
- ``clipped`` / ``dp_sgm`` / ``dp_advsgm``: node level (unit ``node_public_ids``, K = 10): clipping only, then DP at
  ε ∈ {1, 2, 4, 6}.
- ``edge_clipped`` / ``edge_dp_sgm`` / ``edge_dp_advsgm``: edge level (unit ``edge``, uncapped, ``skipgram_edge``):
  clipping only, then DP at ε ∈ {1, 2, 4, 6}.
- ``paper``: the paper-faithful pipeline stopped by its Theorem 7 at each nominal ε (provable ε = ∞), and run to its
  750 iterations (no ε); ``paper_code``: the same 750 iterations with the code's non-edge injection and edge-labelled
  negatives.

AUC: held-out edges (10 %, one split per graph) against as many public random non-edges; clustering: k-means on the
row-normalised W_in against the block / organ-system / lexicographer-file labels. Settings were fixed before this run:
node level and non-private rows in an earlier development sweep on another block-model draw (node private: SGD, lr
50, tables at 0.01, r = 16, k = 5; non-private: Adam, lr 0.05); edge level by an investigation on another block-model
draw (two tables, r = 2, k = 1, b = 600, 12,000 steps, Adam lr 0.01, init std 1, C = 1).

    python benchmarks/advsgm.py                              # SBM, HPO and WordNet, 3 seeds (≈ 2 h on 2 CPU cores)
    python benchmarks/advsgm.py --graphs sbm --seeds 1 --out /tmp/part1   # one part ...
    python benchmarks/advsgm.py --merge /tmp/part1.json /tmp/part2.json    # ... and the parts merged, gates checked
    python benchmarks/advsgm.py --quick                      # SBM 1 seed, ε ∈ {1, 6}, short edge runs
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
from lightning_dprel.methods.advsgm import (
    AdvSGMPaperDataModule, DPSkipGramModule, EdgeSkipGramDataModule, PaperStop, SkipGramDataModule,
)
from lightning_dprel.methods.advsgm.evaluation import cluster_scores, link_auc, sample_non_edges

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
EPSILONS = (1.0, 2.0, 4.0, 6.0)
#: Node level (and the non-private rows' sampling): K, b, k, r, steps; private optimiser.
NODE = dict(max_degree=10, expected_batch_size=600, neg_per_pos=5, dim=16, steps=1000, lr=50.0, optimizer="sgd", init_std=0.01)
PUBLIC = dict(lr=0.05, optimizer="adam", init_std=1.0)
EDGE = dict(expected_batch_size=600, neg_per_pos=1, dim=2, steps=12_000, lr=0.01, optimizer="adam", init_std=1.0, clip_norm=1.0)
ADVERSARIAL = 0.5
GRAPHS = {"sbm": lambda seed: BlockModelGraph(seed=seed), "hpo": lambda seed: HPOGraph(), "wordnet": lambda seed: WordNetNounGraph()}


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


def _paper(kind: str, graph, eps: float | None, common: dict) -> tuple:
    code = kind == "paper_code"
    dm = AdvSGMPaperDataModule(graph, batch_size=128, neg_per_pos=5, inject_non_edges=code, **common)
    module = DPSkipGramModule(mode="paper", dim=NODE["dim"], lr=0.1, edge_labelled_negatives=code)
    _trainer(2 * 750, [PaperStop(eps)] if eps is not None else []).fit(module, dm)
    return dm, module, {"provable_eps": math.inf, "nominal_eps": module.paper_claim.get("nominal_epsilon"),
                        "iterations": module.privacy_ledger.steps}


def _skipgram(kind: str, graph, eps: float | None, common: dict, edge_steps: int) -> tuple:
    edge, private = kind.startswith("edge") or kind == "sgm_uncapped", "dp" in kind or "clipped" in kind
    noised = "dp" in kind
    if edge:
        p = dict(EDGE, steps=edge_steps) if private else dict(NODE, **PUBLIC)
        dm = EdgeSkipGramDataModule(graph, expected_batch_size=p["expected_batch_size"], neg_per_pos=p["neg_per_pos"], **common)
    else:
        p = NODE if private else dict(NODE, **PUBLIC)
        dm = SkipGramDataModule(graph, max_degree=p["max_degree"], expected_batch_size=p["expected_batch_size"],
                                neg_per_pos=p["neg_per_pos"], **common)
    module = DPSkipGramModule(
        dim=p["dim"], adversarial=ADVERSARIAL if "adv" in kind else 0.0, clipping="standard" if private else "none",
        noise_multiplier=1.0 if noised else 0.0, allow_untracked=not noised, clip_norm=p.get("clip_norm", 1.0),
        accounting="skipgram_edge" if edge and private else "skipgram_public_ids",
        **{k: p[k] for k in ("lr", "optimizer", "init_std")},
    )
    callbacks = [PrivacyCallback(target_epsilon=eps, delta=DELTA, calibrate=True)] if noised else []
    _trainer(p["steps"], callbacks).fit(module, dm)
    spent = module.privacy_ledger.epsilon(DELTA) if noised else math.inf
    return dm, module, {"provable_eps": spent, "sigma": module.noise_spec.noise_multiplier, "steps": module.privacy_ledger.steps}


def run(kind: str, graph, seed: int, eps: float | None = None, *, edge_steps: int = EDGE["steps"]) -> dict:
    started = time.monotonic()
    common = dict(test_fraction=0.1, seed=0)
    if kind.startswith("paper"):
        dm, module, row = _paper(kind, graph, eps, common)
    else:
        dm, module, row = _skipgram(kind, graph, eps, common, edge_steps)
    row.update(evaluate(module, dm, graph, seed))
    row.update(kind=kind, target_eps=eps, seed=seed, seconds=round(time.monotonic() - started, 1))
    print(json.dumps(row), flush=True)
    return row


def plan(graph: str, epsilons: tuple[float, ...]) -> list[tuple[str, float | None]]:
    """The rows of one seed of ``graph``: every row on the block model; the gated and reference rows on HPO and WordNet."""
    if graph != "sbm":
        return [("sgm", None), ("sgm_uncapped", None), ("paper", None), ("paper", max(epsilons)), ("dp_sgm", max(epsilons))] + [
            ("edge_dp_sgm", e) for e in (min(epsilons), max(epsilons))]
    rows = [("sgm", None), ("sgm_uncapped", None), ("sgm_adv", None), ("clipped", None), ("edge_clipped", None),
            ("paper", None), ("paper_code", None)]
    return rows + [(k, e) for k in ("paper", "dp_sgm", "dp_advsgm", "edge_dp_sgm", "edge_dp_advsgm") for e in epsilons]


# ------------------------------------------------------------------ tables and gates
def _mean_se(values: list[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.mean(values), se


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["target_eps"]), []).append(r)
    return groups


def table(rows: list[dict], name: str) -> str:
    lines = [f"### {name}", "", "| row | nominal ε | provable ε | AUC (mean ± s.e.) | NMI | MI | seeds |", "|---|---|---|---|---|---|---|"]
    for (kind, eps), rs in _groups(rows).items():
        prov = max(r["provable_eps"] for r in rs)
        nominal = "–" if eps is None else f"{eps:g}"
        m, se = _mean_se([r["auc"] for r in rs])
        lines.append(f"| {kind} | {nominal} | {'∞' if math.isinf(prov) else f'{prov:.3f}'} | {m:.4f} ± {se:.4f} | "
                     f"{statistics.mean(r['nmi'] for r in rs):.4f} | {statistics.mean(r['mi'] for r in rs):.4f} | {len(rs)} |")
    return "\n".join(lines)


def _auc(groups: dict, kind: str, eps: float | None) -> list[float]:
    return [r["auc"] for r in sorted(groups.get((kind, eps), []), key=lambda r: r["seed"])]


def gates(rows: list[dict]) -> dict:
    """A4 (paper-faithful shape) and A3 (edge level) on the block model, and the adversarial terms' paired effect."""
    g = _groups(rows)
    epsilons = sorted({e for k, e in g if k == "edge_dp_sgm" and e is not None})
    out: dict = {}
    sgm, uncapped = statistics.mean(_auc(g, "sgm", None)), statistics.mean(_auc(g, "sgm_uncapped", None))
    paper = [statistics.mean(_auc(g, "paper", e)) for e in epsilons if _auc(g, "paper", e)]
    if paper:
        out["A4"] = {"paper_auc_by_eps": dict(zip(map(str, epsilons), paper)), "sgm_capped": sgm, "sgm_uncapped": uncapped,
                     "gap_to_capped_at_max_eps": sgm - paper[-1], "gap_to_uncapped_at_max_eps": uncapped - paper[-1],
                     "rises": all(b >= a for a, b in zip(paper, paper[1:])) and paper[-1] > paper[0],
                     "within_0.05": sgm - paper[-1] <= 0.05}
    edge = [_mean_se(_auc(g, "edge_dp_sgm", e)) for e in epsilons]
    if edge:
        lift, kept = uncapped - 0.5, edge[-1][0] - 0.5
        out["A3"] = {"edge_auc_by_eps": {str(e): {"mean": m, "se": se} for e, (m, se) in zip(epsilons, edge)},
                     "uncapped_lift": lift, "share_kept_at_max_eps": kept / lift, "keeps_half": kept >= 0.5 * lift,
                     "eps1_above_chance_in_se": (edge[0][0] - 0.5) / edge[0][1] if edge[0][1] > 0 else float("inf"),
                     "non_decreasing": all(b[0] >= a[0] for a, b in zip(edge, edge[1:]))}
        out["A3"]["eps1_beats_chance_by_3se"] = out["A3"]["eps1_above_chance_in_se"] >= 3
    adv = {}
    for level in ("", "edge_"):
        for e in epsilons:
            a, b = _auc(g, f"{level}dp_advsgm", e), _auc(g, f"{level}dp_sgm", e)
            if a and len(a) == len(b):
                m, se = _mean_se([x - y for x, y in zip(a, b)])
                adv[f"{level or 'node_'}eps{e:g}"] = {"advsgm_minus_sgm": m, "se": se}
    if adv:
        out["adversarial_paired"] = adv
    return out


def write(results: dict[str, list[dict]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(results)
    if results.get("sbm"):
        payload["gates_sbm"] = gates(results["sbm"])
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str))
    text = "\n\n".join(table(rows, name) for name, rows in results.items())
    if "gates_sbm" in payload:
        text += "\n\n### Gates (block model)\n\n```\n" + json.dumps(payload["gates_sbm"], indent=1, default=str) + "\n```"
    out.with_suffix(".md").write_text(text + "\n")
    print(text)


def _resumed(log: str | None, graphs: list[str]) -> dict[tuple, dict]:
    """The rows an interrupted run printed (one JSON object per line), by (kind, target ε, seed)."""
    if log is None:
        return {}
    if len(graphs) != 1:
        raise SystemExit("--resume takes the log of one graph's run: pass one --graphs name.")
    rows = [json.loads(line) for line in Path(log).read_text().splitlines() if line.startswith("{\"")]
    return {(r["kind"], r["target_eps"], r["seed"]): r for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--graphs", default="sbm,hpo,wordnet")
    parser.add_argument("--merge", nargs="+", help="merge the JSON of parts into --out (no training)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "advsgm"))
    parser.add_argument("--resume", help="a log of an interrupted run of one graph: its JSON rows are kept, not rerun")
    parser.add_argument("--threads", type=int, help="torch threads (1 when parts run side by side)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.merge:
        merged: dict[str, list[dict]] = {}
        for part in args.merge:
            for name, rows in json.loads(Path(part).read_text()).items():
                if not name.startswith("gates"):
                    merged.setdefault(name, []).extend(rows)
        return write(merged, Path(args.out))
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning_dprel", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    epsilons, edge_steps = ((1.0, 6.0), 1500) if args.quick else (EPSILONS, EDGE["steps"])
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
    graphs = ["sbm"] if args.quick else args.graphs.split(",")
    done = _resumed(args.resume, graphs)
    results: dict[str, list[dict]] = {}
    for name in graphs:
        results[name] = []
        for seed in seeds:
            try:
                graph = GRAPHS[name](seed).load().train
            except (FileNotFoundError, ValueError) as err:
                print(f"{name}: skipped ({err})")
                break
            for kind, eps in plan(name, epsilons):
                row = done.get((kind, eps, seed)) or run(kind, graph, seed, eps, edge_steps=edge_steps)
                results[name].append(row)
    write(results, Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
