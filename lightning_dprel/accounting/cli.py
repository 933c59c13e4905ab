"""``python -m lightning_dprel.accounting``: ε for given parameters, σ calibration, and a Figure-2-like plot.

    python -m lightning_dprel.accounting epsilon --nodes N --edges M --max-degree K --sampling-rate G \
        --neg-per-pos k --noise-multiplier S --steps T [--delta D] --clipping {freq,standard,naive} \
        [--accounting {corrected,paper}] [--mechanism NAME] [--accountant {pld,rdp}] [--json] [--plot PATH.png]
    python -m lightning_dprel.accounting noise-multiplier … --target-epsilon E [--json] [--plot PATH.png]
    python -m lightning_dprel.accounting plot --nodes N --edges M --max-degree K --sampling-rate G \
        --neg-per-pos k --noise-multiplier S --steps T [--delta D] --out PATH.png [--json]

``plot`` writes the Figure-2-like comparison (ε against T ≤ the given steps for the paper's Eq. 3, the corrected
FREQ-CLIP, standard clipping and the naive bound; matplotlib's Agg backend) and prints ε after T steps of each.
``--delta`` defaults to 1/M (the paper's δ = 1/|E_train|); ``--accounting`` applies to ``freq`` only; ``--mechanism``
names any registered mechanism instead (e.g. ``poisson_gaussian``, ``entity_items``, ``subgraph_replace``).
``--accountant pld`` (default) reports the smaller of the PLD bound (mechanisms with a proven dominating pair) and the
RDP bound, and prints both; ``rdp`` reports RDP only. A δ that is not below 1/N is warned about (as the privacy callback
does). Imports numpy, scipy and dp-accounting only (no torch).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Sequence

import numpy as np

from lightning_dprel.accounting.accountant import ACCOUNTANTS, Accountant
from lightning_dprel.accounting.calibration import noise_multiplier_for
from lightning_dprel.accounting.curves import epsilon_curve, plot_epsilon_curve
from lightning_dprel.accounting.mechanisms import get_mechanism
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.edge_tuples import accounting as _coupled  # noqa: F401
from lightning_dprel.datamodules.edge_tuples.spec import EdgeTuples

__all__ = ["main", "build_parser", "mechanism_name", "epsilon_curve", "plot_comparison", "warn_delta"]

#: Curves of the comparison plot: (mechanism, label).
PLOT_CURVES = (
    ("freq_paper", "FREQ-CLIP, paper's Eq. 3 (under-states ε)"),
    ("freq_corrected", "FREQ-CLIP, corrected profile"),
    ("standard", "standard clipping (Thm C.1)"),
    ("naive", "naive Gaussian α/(2σ²)"),
)


def mechanism_name(clipping: str, accounting: str = "corrected") -> str:
    """CLI (clipping, accounting) → registry name: freq → freq_{accounting}; standard, naive unchanged."""
    return f"freq_{accounting}" if clipping == "freq" else clipping


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, required=True, help="n = |V|")
    p.add_argument("--edges", type=int, required=True, help="m = |Ē|, edges after degree capping")
    p.add_argument("--max-degree", type=int, required=True, help="K, the degree cap")
    p.add_argument("--sampling-rate", type=float, required=True, help="γ, Poisson rate of positives")
    p.add_argument("--neg-per-pos", type=int, required=True, help="k, negatives per positive")
    p.add_argument("--steps", type=int, required=True, help="T, training steps")
    p.add_argument("--delta", type=float, default=None, help="δ (default 1/M)")


def _add_common(p: argparse.ArgumentParser) -> None:
    _add_sampling(p)
    p.add_argument("--clipping", choices=("freq", "standard", "naive"), default=None,
                   help="the relational method's clipping (or give --mechanism)")
    p.add_argument("--accounting", choices=("corrected", "paper"), default="corrected",
                   help="for --clipping freq: 'corrected' (default, holds) or 'paper' (Eq. 3 as published)")
    p.add_argument("--mechanism", default=None, help="any registered mechanism name (instead of --clipping)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="pld",
                   help="'pld' (default): the smaller of the PLD and RDP bounds; 'rdp': RDP only")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="PATH.png", default=None, help="save a Figure-2-like ε-vs-T comparison")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lightning_dprel.accounting", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_eps = sub.add_parser("epsilon", help="ε after T steps")
    _add_common(p_eps)
    p_eps.add_argument("--noise-multiplier", type=float, required=True, help="σ")
    p_sig = sub.add_parser("noise-multiplier", help="smallest σ with ε ≤ --target-epsilon after T steps")
    _add_common(p_sig)
    p_sig.add_argument("--target-epsilon", type=float, required=True, help="ε*")
    p_plot = sub.add_parser("plot", help="save a Figure-2-like ε-vs-T comparison of the four bounds (PNG)")
    _add_sampling(p_plot)
    p_plot.add_argument("--noise-multiplier", type=float, required=True, help="σ")
    p_plot.add_argument("--out", metavar="PATH.png", required=True, help="the image to write")
    p_plot.add_argument("--json", action="store_true", help="print one JSON object (the curves)")
    return parser


def _plot_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The ``plot`` command: write the comparison to ``--out`` and print ε after T steps of each bound."""
    try:
        sampling = _sampling(args)
        delta = args.delta if args.delta is not None else 1.0 / args.edges
        warn_delta(delta, args.nodes)
        curves = plot_comparison(args.out, sampling, args.noise_multiplier, delta, args.steps)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    final = {mech: curves[mech][-1] for mech, _ in PLOT_CURVES}
    if args.json:
        print(json.dumps({"plot": args.out, "delta": delta, "noise_multiplier": args.noise_multiplier, "epsilon": final, **curves}))
    else:
        print(f"wrote {args.out}; epsilon after {args.steps} steps (delta = {delta:.3g}, sigma = {args.noise_multiplier:g}): "
              + ", ".join(f"{mech} {eps:.6g}" for mech, eps in final.items()))
    return 0


def _sampling(args: argparse.Namespace) -> SamplingSpec:
    g = args.sampling_rate
    if not (0.0 < g <= 1.0):
        raise ValueError(f"`sampling_rate` (--sampling-rate) must be in (0, 1], got {g}.")
    return SamplingSpec(
        population=args.edges, contribution_bound=args.max_degree, sampling_rate=g,
        expected_batch_size=g * args.edges, steps_per_epoch=math.ceil(1.0 / g),
        detail=EdgeTuples(num_nodes=args.nodes, neg_per_pos=args.neg_per_pos),
    )


def warn_delta(delta: float, num_nodes: int) -> None:
    """Warn (UserWarning) when δ ≥ 1/n: the privacy unit is an entity, so such a δ allows releasing one outright."""
    if 0.0 < delta < 1.0 and delta >= 1.0 / num_nodes:
        warnings.warn(
            f"δ = {delta:.3g} is not below 1/n = {1.0 / num_nodes:.3g} (n = {num_nodes} entities). The privacy "
            "unit is an entity, so a δ ≥ 1/n allows releasing one entity outright; pass a smaller `--delta` "
            "(e.g. 1/(10·n)) for a meaningful guarantee.",
            UserWarning,
            stacklevel=2,
        )


def plot_comparison(
    path: str, sampling: SamplingSpec, noise_multiplier: float, delta: float, max_steps: int
) -> dict[str, list[float]]:
    """Save ε vs T for the paper's Eq. 3, the corrected FREQ-CLIP, standard clipping and the naive bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = np.unique(np.round(np.logspace(0, math.log10(max(max_steps, 1)), 40)).astype(int))
    curves = {}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mech, label in PLOT_CURVES:
        eps = epsilon_curve(mech, sampling, noise_multiplier, delta, ts)
        curves[mech] = eps.tolist()
        plot_epsilon_curve(ts, eps, ax=ax, label=label, delta=delta)
    ax.set_title(
        f"n={sampling.detail.num_nodes:g}, m={sampling.population:g}, "
        f"K={sampling.contribution_bound}, "
        f"γ={sampling.sampling_rate:g}, k={sampling.detail.neg_per_pos}, σ={noise_multiplier:g}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"steps": ts.tolist(), **curves}


def _bounds_text(bounds: dict, order: float) -> str:
    pld = "n/a: no proven pair" if bounds["pld"] is None else f"{bounds['pld']:.6g}"
    return f"{bounds['bound'].upper()} bound; RDP {bounds['rdp']:.6g} at order {order:g}, PLD {pld}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "plot":
        return _plot_main(parser, args)
    try:
        sampling = _sampling(args)
        delta = args.delta if args.delta is not None else 1.0 / args.edges
        warn_delta(delta, args.nodes)
        if (args.clipping is None) == (args.mechanism is None):
            raise ValueError("give exactly one of --clipping (the relational method's) and --mechanism (any registered).")
        mech = args.mechanism or mechanism_name(args.clipping, args.accounting)
        if args.command == "epsilon":
            sigma = args.noise_multiplier
        else:
            sigma = noise_multiplier_for(
                args.target_epsilon, delta=delta, steps=args.steps, sampling=sampling, mechanism=mech,
                accountant=args.accountant,
            )
        acc = Accountant(mech, accountant=args.accountant)
        acc.step(sampling, sigma, args.steps)
        bounds = acc.epsilon_bounds(delta)
        eps, order = bounds["epsilon"], acc.get_epsilon_and_order(delta)[1]
        if args.plot:
            plot_comparison(args.plot, sampling, sigma, delta, args.steps)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    out = {
        "epsilon": eps,
        "bound": bounds["bound"],
        "epsilon_rdp": bounds["rdp"],
        "epsilon_pld": bounds["pld"],
        "order": order,
        "delta": delta,
        "noise_multiplier": sigma,
        "steps": args.steps,
        "mechanism": mech,
        "description": get_mechanism(mech).description,
        "privacy_unit": get_mechanism(mech).privacy_unit,
    }
    if args.plot:
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out))
    elif args.command == "epsilon":
        print(f"epsilon = {eps:.6g} ({_bounds_text(bounds, order)}; delta = {delta:.3g}, {mech}: {out['description']})")
    else:
        print(
            f"noise_multiplier = {sigma:.6g} (epsilon = {eps:.6g} <= {args.target_epsilon:g}, "
            f"{_bounds_text(bounds, order)}; delta = {delta:.3g}, {mech}: {out['description']})"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
