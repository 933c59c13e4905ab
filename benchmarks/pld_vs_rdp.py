"""PLD vs RDP: how much tighter the privacy-loss-distribution bound is, and how close it is to independent references.

For every registered mechanism with a dominating pair (``register_mechanism(..., pld=)``), on a grid of
(q, σ, steps, δ) that includes the settings quoted when tight accounting was added, prints and writes
``benchmarks/results/pld_vs_rdp.json``:

* RDP ε and PLD ε (the library's 10⁻³ pessimistic grid), PLD/RDP and the bound the accountant reports (the smaller);
* dp-accounting's own ``PLDAccountant`` at its default 10⁻⁴ grid on the same pair (the cost of our coarser grid);
* the PRV accountant's certified [lower, upper] (Gopi et al. 2021) where prv-accountant has the mechanism
  (the Poisson-subsampled Gaussian, add/remove, and the Gaussian); a PLD ε below ``lower`` would be a bug.

    python benchmarks/pld_vs_rdp.py [--out benchmarks/results/pld_vs_rdp.json]

≈ 2 min on 2 CPU cores (the two 10⁻⁴ mixture references take most of it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from functools import lru_cache
from pathlib import Path

from scipy.stats import binom

from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.privacy_accountant import NeighboringRelation

from lightning_dprel.accounting import Accountant, get_mechanism, registered_mechanisms
from lightning_dprel.accounting.pld import VALUE_DISCRETIZATION
from lightning_dprel.core.specs import SamplingSpec

try:
    from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism, PRVAccountant
except ImportError:  # pip install -e '.[dev]'
    PRVAccountant = None

N = 10**6
REF_INTERVAL = 1e-4

#: (q, σ, steps, δ) for the one-tuple pairs; the first three are the settings quoted when PLD accounting was added.
SAMPLED = [(0.01, 1.0, 1000, 1e-5), (0.04, 1.5, 2250, 1e-5), (0.001, 1.0, 10_000, 1e-6), (0.1, 2.0, 500, 1e-5),
           (0.005, 0.8, 3000, 1e-6), (1e-4, 1.0, 100_000, 1e-6)]
#: (K', γ, σ, steps, δ) for the binomial mixtures; the first is the quoted entities-with-public-items setting.
MIXTURES = [(5, 0.0885, 5.0, 500, 1e-5), (3, 0.05, 2.0, 100, 1e-6)]
#: (σ, releases, δ) for Gaussian releases of sensitivity C.
RELEASES = [(10.0, 100, 1e-5), (3.0, 10, 1e-6), (50.0, 1000, 1e-6)]


def _spec(unit: str, q: float, max_degree: int = 1) -> SamplingSpec:
    return SamplingSpec(num_nodes=N, num_edges=N, max_degree=max_degree, sampling_rate=q, neg_per_pos=0,
                        expected_batch_size=q * N, steps_per_epoch=math.ceil(1 / q), privacy_unit=unit, num_units=N)


def _pair(name: str, q: float, k: int) -> tuple | None:
    """The dominating pair of ``name`` as the references know it (None: a mechanism this script does not know)."""
    if name in ("poisson_gaussian", "labelled_node_gaussian") or (name in ("entity_items", "skipgram_public_ids")
                                                                  and k == 1):
        return ("psg", q)
    if name in ("entity_items", "skipgram_public_ids"):
        return ("mog", k, q)
    if name == "subgraph_replace":
        return ("psg_replace", q)
    if name == "gaussian":
        return ("gauss",)
    return None


@lru_cache(maxsize=None)
def _dp_accounting(pair: tuple, sigma: float, steps: int, delta: float) -> float:
    kind = pair[0]
    relation = NeighboringRelation.REPLACE_ONE if kind == "psg_replace" else NeighboringRelation.ADD_OR_REMOVE_ONE
    acc = PLDAccountant(relation, value_discretization_interval=REF_INTERVAL)
    if kind in ("psg", "psg_replace"):
        event = dp_event.PoissonSampledDpEvent(pair[1], dp_event.GaussianDpEvent(sigma))
    elif kind == "gauss":
        event = dp_event.GaussianDpEvent(sigma)
    else:
        k, gamma = pair[1], pair[2]
        event = dp_event.MixtureOfGaussiansDpEvent(sigma, [float(i) for i in range(k + 1)],
                                                   [float(w) for w in binom.pmf(range(k + 1), k, gamma)])
    acc.compose(event, steps)
    return float(acc.get_epsilon(delta))


@lru_cache(maxsize=None)
def _prv(pair: tuple, sigma: float, steps: int, delta: float) -> tuple[float, float] | None:
    if PRVAccountant is None or pair[0] not in ("psg", "gauss"):
        return None
    prv = PoissonSubsampledGaussianMechanism(pair[1], sigma) if pair[0] == "psg" else GaussianMechanism(sigma)
    acc = PRVAccountant([prv], eps_error=0.01, delta_error=delta / 1000, max_self_compositions=[steps])
    lower, _, upper = acc.compute_epsilon(delta, [steps])
    return float(lower), float(upper)


def _settings(name: str):
    mech = get_mechanism(name)
    if not mech.needs_sampling:
        for sigma, steps, delta in RELEASES:
            yield None, 1, None, sigma, steps, delta
        return
    unit = mech.unit.name
    for q, sigma, steps, delta in SAMPLED:
        yield _spec(unit, q), 1, q, sigma, steps, delta
    if name in ("entity_items", "skipgram_public_ids"):
        for k, gamma, sigma, steps, delta in MIXTURES:
            yield _spec(unit, gamma, k), k, gamma, sigma, steps, delta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pld_vs_rdp.json"))
    args = parser.parse_args()
    start = time.perf_counter()
    names = [n for n in registered_mechanisms() if get_mechanism(n).pld is not None
             and get_mechanism(n).compositions is None]  # banded noise: benchmarks/correlated_noise.py
    print(f"PLD (grid min({VALUE_DISCRETIZATION:g}, q/10), pessimistic) vs RDP, dp-accounting PLDAccountant (grid {REF_INTERVAL:g}) "
          f"and PRV [lower, upper]; {platform.node()}, load {os.getloadavg()[0]:.2f}")
    head = (f"{'mechanism':<23}{'K':>3}{'q':>8}{'σ':>6}{'steps':>8}{'δ':>7}{'RDP':>9}{'PLD':>9}{'PLD/RDP':>8}"
            f"{'bound':>6}{'dp-acc':>9}{'PLD−ref':>9}{'PRV [lo, hi]':>20}{'s':>6}")
    print(head)
    rows = []
    for name in names:
        for sampling, k, q, sigma, steps, delta in _settings(name):
            t0 = time.perf_counter()
            acc = Accountant(name)
            acc.step(sampling, sigma, steps)
            b = acc.epsilon_bounds(delta)
            pair = _pair(name, q, k)
            ref = None if pair is None or b["pld"] is None else _dp_accounting(pair, sigma, steps, delta)
            prv = None if pair is None else _prv(pair, sigma, steps, delta)
            row = {
                "mechanism": name, "max_degree": k, "q": q, "sigma": sigma, "steps": steps, "delta": delta,
                "epsilon_rdp": b["rdp"], "epsilon_pld": b["pld"], "bound": b["bound"], "epsilon": b["epsilon"],
                "pld_over_rdp": None if b["pld"] is None else b["pld"] / b["rdp"],
                "dp_accounting_1e-4": ref, "pld_minus_dp_accounting": None if ref is None else b["pld"] - ref,
                "prv_lower": None if prv is None else prv[0], "prv_upper": None if prv is None else prv[1],
                "pld_below_prv_lower": None if prv is None or b["pld"] is None else b["pld"] < prv[0],
                "pld_above_prv_upper": None if prv is None or b["pld"] is None else b["pld"] > prv[1],
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            pld = "—" if b["pld"] is None else f"{b['pld']:.4f}"
            ratio = "—" if b["pld"] is None else f"{row['pld_over_rdp']:.3f}"
            refs = ("—", "—") if ref is None else (f"{ref:.4f}", f"{b['pld'] - ref:+.4f}")
            prvs = "—" if prv is None else f"[{prv[0]:.4f}, {prv[1]:.4f}]"
            print(f"{name:<23}{k:>3}{'—' if q is None else f'{q:g}':>8}{sigma:>6g}{steps:>8}{delta:>7.0e}"
                  f"{b['rdp']:>9.4f}{pld:>9}{ratio:>8}{b['bound']:>6}{refs[0]:>9}{refs[1]:>9}{prvs:>20}"
                  f"{row['seconds']:>6.1f}")
    with_prv = [r for r in rows if r["prv_lower"] is not None]
    loose = sorted({r["q"] for r in with_prv if r["pld_above_prv_upper"]})
    total = time.perf_counter() - start
    print(f"PLD below PRV's lower bound (unsound): {sum(r['pld_below_prv_lower'] for r in with_prv)} of {len(with_prv)} "
          f"rows; above PRV's upper bound (looser than needed): "
          f"{sum(r['pld_above_prv_upper'] for r in with_prv)} rows (q = {loose}); "
          f"largest PLD − dp-accounting(10⁻⁴): {max(r['pld_minus_dp_accounting'] or 0 for r in rows):.4f}; "
          f"{total:.0f} s")
    out = {"value_discretization": f"min({VALUE_DISCRETIZATION:g}, q/10)", "reference_interval": REF_INTERVAL, "machine": platform.node(),
           "cpu_count": os.cpu_count(), "load_average": os.getloadavg()[0], "seconds": total, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
