"""Benchmark of the entity-level accountant at the paper's Section 5.1 defaults (issue 3).

n = 10⁶, m = 5·10⁶, K = 5, γ = 10⁻⁵, σ = 0.5, k = 4, δ = 1/m, T = 10⁵, over the full order grid
(158 orders). Prints cold wall times (no cache) against the issue's targets, the σ calibration for ε = 4,
the per-step cost of the live accountant, and the ε table at T = 10³, 10⁴, 10⁵. Then (issue 12) the cold cost of
one per-step evaluation against the degree cap K = 5 … 10⁶, on a small graph and at the Section 5.1 defaults.

    python benchmarks/bench_accounting.py [--repeats 3] [--skip-k-sweep]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from lightning_dprel.accounting import DEFAULT_ORDERS, Accountant, noise_multiplier_for, rdp_to_epsilon
from lightning_dprel.accounting import mechanisms as mech_mod
from lightning_dprel.accounting.analysis import coupled_rdp, eq3_rdp
from lightning_dprel.accounting.profiles import freq_corrected_profile, paper_profile, standard_profile
from lightning_dprel.core.specs import SamplingSpec

N, M, K, GAMMA, SIGMA, KNEG = 10**6, 5 * 10**6, 5, 1e-5, 0.5, 4
DELTA = 1.0 / M
SPEC = SamplingSpec(num_nodes=N, num_edges=M, max_degree=K, sampling_rate=GAMMA, neg_per_pos=KNEG,
                    expected_batch_size=GAMMA * M, steps_per_epoch=math.ceil(1 / GAMMA))
KW = dict(num_nodes=N, num_edges=M, max_degree=K, sampling_rate=GAMMA, neg_per_pos=KNEG, noise_multiplier=SIGMA,
          orders=DEFAULT_ORDERS)


def _best_time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-k-sweep", action="store_true")
    args = parser.parse_args()
    print(f"Section 5.1 defaults: n={N:g} m={M:g} K={K} gamma={GAMMA:g} sigma={SIGMA} k={KNEG} delta=1/m, "
          f"{DEFAULT_ORDERS.size} orders")
    print(f"{'computation':<46}{'time [s]':>10}{'target [s]':>12}{'ratio':>8}")
    rows = [
        ("Eq. 3 closed form (freq_paper)", lambda: eq3_rdp(**KW), 0.2),
        ("mixture, paper profile (Delta == C)", lambda: coupled_rdp(paper_profile(K, KNEG), **KW), 2.0),
        ("mixture, corrected FREQ-CLIP profile", lambda: coupled_rdp(freq_corrected_profile(K, KNEG), **KW), 2.0),
        ("mixture, standard profile (Thm C.1)", lambda: coupled_rdp(standard_profile(K, KNEG), **KW), 2.0),
    ]
    for label, fn, target in rows:
        t, _ = _best_time(fn, args.repeats)
        print(f"{label:<46}{t:>10.3f}{target:>12.1f}{t / target:>8.2f}")

    for mech in ("freq_paper", "freq_corrected", "standard"):
        mech_mod._cached_rdp.cache_clear()
        t0 = time.perf_counter()
        sigma = noise_multiplier_for(4.0, delta=DELTA, steps=100_000, sampling=SPEC, mechanism=mech)
        t = time.perf_counter() - t0
        evals = mech_mod._cached_rdp.cache_info().misses
        eps = rdp_to_epsilon(DEFAULT_ORDERS, 100_000 * mech_mod.per_step_rdp(mech, SPEC, sigma), DELTA)[0]
        print(f"{'sigma calibration eps=4, T=1e5, ' + mech:<46}{t:>10.3f}{5.0:>12.1f}{t / 5.0:>8.2f}"
              f"   sigma*={sigma:.4f} eps={eps:.4f} ({evals} RDP evaluations)")

    acc = Accountant("freq_corrected")
    acc.step(SPEC, SIGMA)
    n_calls = 20_000
    t0 = time.perf_counter()
    for _ in range(n_calls):
        acc.epsilon_after(SPEC, SIGMA, DELTA)
        acc.step(SPEC, SIGMA)
    per_call = (time.perf_counter() - t0) / n_calls
    print(f"{'live accountant: epsilon_after + step (cached)':<46}{per_call * 1e6:>9.1f}us")

    print()
    print(f"epsilon at delta = 1/m = {DELTA:g} (best order in brackets), sigma = {SIGMA}")
    mechs = [("freq_paper", "Eq. 3 (paper)"), ("freq_corrected", "FREQ-CLIP corrected"),
             ("standard", "standard clipping (Thm C.1)"), ("naive", "naive alpha/(2 sigma^2)")]
    print(f"{'T':>8}" + "".join(f"{label:>30}" for _, label in mechs))
    for steps in (1_000, 10_000, 100_000):
        cells = []
        for mech, _ in mechs:
            eps, order = rdp_to_epsilon(DEFAULT_ORDERS, steps * mech_mod.per_step_rdp(mech, SPEC, SIGMA), DELTA)
            cells.append(f"{eps:.4g} (a={order:g})")
        print(f"{steps:>8}" + "".join(f"{c:>30}" for c in cells))
    if not args.skip_k_sweep:
        print()
        k_sweep(args.repeats)


#: (label, n, m, γ, σ, k) of the K sweep: a Cora-sized graph, and the Section 5.1 defaults.
K_SWEEP_SETTINGS = (
    ("small graph n=2708 m=5000 gamma=0.01 sigma=1 k=1", 2708, 5000, 0.01, 1.0, 1),
    ("Section 5.1 n=1e6 m=5e6 gamma=1e-5 sigma=0.5 k=4", N, M, GAMMA, SIGMA, KNEG),
)


def k_sweep(repeats: int, ks: tuple[int, ...] = (5, 16, 32, 50, 500, 10**6)) -> None:
    """Cold per-step RDP (no cache) against K: rows above HEAD_ROWS are bounded in closed form (issue 12)."""
    from lightning_dprel.accounting.analysis.coupled_rdp import HEAD_ROWS

    print(f"cold per-step RDP against K (rows i <= {HEAD_ROWS} by quadrature, the rest in closed form), "
          f"best of {repeats}; epsilon after 1000 steps at delta = 1/m")
    for label, n, m, gamma, sigma, k in K_SWEEP_SETTINGS:
        print(f"  {label}")
        for mech in ("freq_corrected", "standard"):
            cells = []
            for K in ks:
                spec = SamplingSpec(num_nodes=n, num_edges=m, max_degree=K, sampling_rate=gamma, neg_per_pos=k,
                                    expected_batch_size=gamma * m, steps_per_epoch=math.ceil(1 / gamma))

                def cold(spec=spec, mech=mech, sigma=sigma):
                    mech_mod._cached_rdp.cache_clear()
                    return mech_mod.per_step_rdp(mech, spec, sigma)

                t, rdp = _best_time(cold, repeats)
                eps = rdp_to_epsilon(DEFAULT_ORDERS, 1000 * rdp, 1.0 / m)[0]
                cells.append(f"K={K:g}: {t:.2f}s eps={eps:.3g}")
            print(f"    {mech:<15}" + "  ".join(cells))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
