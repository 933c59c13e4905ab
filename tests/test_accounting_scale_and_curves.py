"""Accounting at scale and ε over time: a huge K answers fast with a bound that holds, graph preparation says what capping
did and refuses non-finite features, the accounting CLI warns on δ ≥ 1/n and needs no torch, ε over time as data."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dprel.accounting import DEFAULT_ORDERS, Accountant, per_step_rdp
from lightning_dprel.accounting.analysis import coupled_rdp
from lightning_dprel.accounting.profiles import freq_corrected_profile, standard_profile
from lightning_dprel.demos.specs import make_spec

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {"freq": freq_corrected_profile, "standard": standard_profile}


def _kw(n, m, K, gamma, k, sigma):
    return {"num_nodes": n, "num_edges": m, "max_degree": K, "sampling_rate": gamma, "neg_per_pos": k,
            "noise_multiplier": sigma, "orders": DEFAULT_ORDERS}


def _cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lightning_dprel.accounting", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


# --------------------------------------------------------------------------------------------- A: huge K
@pytest.mark.slow
def test_cli_answers_for_a_huge_max_degree_within_10_seconds():
    t0 = time.perf_counter()
    res = _cli("epsilon", "--nodes", "2708", "--edges", "5000", "--max-degree", "1000000", "--sampling-rate", "0.01",
               "--neg-per-pos", "1", "--noise-multiplier", "1.0", "--steps", "1000", "--clipping", "freq", "--json",
               timeout=30)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert math.isfinite(out["epsilon"]) and out["epsilon"] > 1e6  # K = 10⁶ is no guarantee: ε is huge, not hidden
    assert elapsed < 10.0, f"the CLI took {elapsed:.1f} s for K = 10^6"


def test_a_degree_bound_above_the_accountant_limit_is_refused_with_a_reason():
    res = _cli("epsilon", "--nodes", str(2**23), "--edges", "5000000", "--max-degree", str(2**23), "--sampling-rate",
               "0.001", "--neg-per-pos", "1", "--noise-multiplier", "1.0", "--steps", "10", "--clipping", "standard",
               timeout=30)
    assert res.returncode == 2
    assert re.search(r"min\(K, n\) = 8,388,608\) is above the 4,194,304 the coupled accountant evaluates", res.stderr)
    assert "Lower max_degree" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["freq", "standard"])
@pytest.mark.parametrize("n,m,gamma,k,sigma", [(300, 400, 0.05, 1, 2.0), (500, 400, 0.2, 1, 3.0),
                                               (300, 400, 0.2, 0, 3.0), (2708, 4000, 0.01, 1, 1.0)])
def test_head_and_tail_bound_is_above_the_full_quadrature_and_close_to_it(profile, n, m, gamma, k, sigma):
    from lightning_dprel.accounting import rdp_to_epsilon
    from lightning_dprel.accounting.analysis.coupled_rdp import HEAD_ROWS

    K = 40  # rows HEAD_ROWS + 1 .. K go through the closed-form tail bound
    assert HEAD_ROWS < K
    kw = _kw(n, m, K, gamma, k, sigma)
    full = coupled_rdp(PROFILES[profile](K, k), head_rows=K, **kw)
    split = coupled_rdp(PROFILES[profile](K, k), **kw)
    assert np.all(split >= full * (1 - 1e-9))  # an upper bound at every order (to the quadrature's accuracy)
    for steps in (100, 1000, 10000):
        e_full = rdp_to_epsilon(DEFAULT_ORDERS, steps * full, 1e-5)[0]
        e_split = rdp_to_epsilon(DEFAULT_ORDERS, steps * split, 1e-5)[0]
        assert e_full * (1 - 1e-9) <= e_split <= e_full * (1 + 1e-3)
    e_full = rdp_to_epsilon(DEFAULT_ORDERS, full, 1e-5)[0]  # one step: orders where Minkowski loses may set ε
    assert e_full * (1 - 1e-9) <= rdp_to_epsilon(DEFAULT_ORDERS, split, 1e-5)[0] <= e_full * 1.1


def test_head_rows_at_or_above_K_is_the_full_quadrature_bit_for_bit():
    kw = _kw(300, 400, 5, 0.05, 1, 2.0)
    prof = freq_corrected_profile(5, 1)
    base = coupled_rdp(prof, **kw)
    assert np.array_equal(base, coupled_rdp(prof, head_rows=5, **kw))
    assert np.array_equal(base, coupled_rdp(prof, head_rows=40, **kw))
    with pytest.raises(ValueError, match=r"`profile` must have shape \(K\+1, 2\) = \(6, 2\)"):
        coupled_rdp(freq_corrected_profile(4, 1), **kw)


@pytest.mark.parametrize("mechanism", ["freq_corrected", "standard"])
def test_degree_cap_min_K_n_holds_against_the_uncapped_mixture(mechanism):
    n, m, gamma, k, sigma = 20, 30, 0.1, 1, 2.0  # K = 28 > n: an entity has at most n relations
    capped = per_step_rdp(mechanism, make_spec(n, m, 28, gamma, k), sigma)
    assert np.array_equal(capped, per_step_rdp(mechanism, make_spec(n, m, n, gamma, k), sigma))
    profile = PROFILES["freq" if mechanism == "freq_corrected" else "standard"]
    uncapped = coupled_rdp(profile(28, k), **_kw(n, m, 28, gamma, k, sigma))  # the mixture with K = 28 rows
    assert np.all(capped <= uncapped * (1 + 1e-12))
    assert np.all(capped <= per_step_rdp(mechanism, make_spec(n, m, n + 1, gamma, k), sigma) * (1 + 1e-12))


@pytest.mark.parametrize("profile", ["freq", "standard"])
def test_huge_K_is_fast_and_within_a_permille_of_a_lower_bound(profile):
    K, gamma, sigma = 10**6, 1e-3, 1.0
    kw = _kw(10**7, 10**5, K, gamma, 0, sigma)  # k = 0: p ≡ 0, the mixture has rows (i, 0) only
    t0 = time.perf_counter()
    rdp = coupled_rdp(PROFILES[profile](K, 0), **kw)
    assert time.perf_counter() - t0 < 5.0
    # Ψ_fwd ≥ E_N[(b_K L_K)^α] = b_K^α e^{α(α−1)ν_K²/2}: one component of the mixture alone.
    a = DEFAULT_ORDERS
    nu = PROFILES[profile](K, 0)[K, 0] / sigma
    lower = (a * K * math.log(gamma) + a * (a - 1) * nu**2 / 2) / (a - 1)
    assert np.all(rdp >= lower * (1 - 1e-12))
    assert np.all(rdp <= lower * (1 + 1e-3))


def test_cost_stops_growing_with_K():
    def cost(K):
        t0 = time.perf_counter()
        coupled_rdp(freq_corrected_profile(K, 1), **_kw(2708, 4000, K, 0.01, 1, 1.0))
        return time.perf_counter() - t0

    cost(32)
    base = min(cost(32) for _ in range(2))
    assert min(cost(500) for _ in range(2)) < 3 * base + 0.2


# --------------------------------------------------------------------------------------------- A: graph preparation
def _capping_messages(dm) -> list[str]:
    from lightning_dprel.demos.boring_classes import rank_zero_messages

    with rank_zero_messages() as messages:
        dm.setup("fit")
    return [m for m in messages if m.startswith("capping to K=")]


def test_a_far_too_large_K_warns_with_the_largest_degree():
    from lightning_dprel.datamodules.edge_tuples.sampling import to_simple_undirected
    from lightning_dprel.demos.boring_classes import tiny_relational_dm

    dm = tiny_relational_dm(stage=None, max_degree=10**6)  # random_feature_graph(200, 600, seed=1)
    with pytest.warns(UserWarning, match=r"max_degree K = 1,000,000 is far above the largest degree of the training "
                                         r"relations \((\d+)\): ε is charged for an entity with up to K relations") as rec:
        messages = _capping_messages(dm)
    largest = int(re.search(r"relations \((\d+)\)", str(next(w.message for w in rec if "far above" in str(w.message)))).group(1))
    simple = to_simple_undirected(dm.train_edges, 200)
    assert largest == int(torch.bincount(simple.flatten(), minlength=200).max())  # nothing was capped at K = 10⁶
    expected = (f"capping to K=1,000,000 dropped 0 of {simple.shape[1]:,} relations (0 %); "
                f"{simple.shape[1]:,} remain for training.")
    assert messages == [expected]


def test_capping_logs_how_many_relations_it_dropped():
    from lightning_dprel.demos.boring_classes import tiny_relational_dm

    dm = tiny_relational_dm(stage=None, max_degree=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*far above the largest degree.*")
        messages = _capping_messages(dm)
    assert len(messages) == 1
    match = re.fullmatch(r"capping to K=2 dropped ([\d,]+) of ([\d,]+) relations \((\d+) %\); ([\d,]+) remain for "
                         r"training\.", messages[0])
    assert match, messages
    dropped, total, pct, kept = (int(g.replace(",", "")) for g in match.groups())
    assert kept == dm.train_edges.shape[1] and dropped == total - kept and dropped > 0
    assert pct == round(100 * dropped / total)


# --------------------------------------------------------------------------------------------- B: non-finite features
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_training_features_are_refused(bad):
    from lightning_dprel.demos import random_feature_graph
    from lightning_dprel.demos.boring_classes import tiny_relational_dm

    graph = random_feature_graph(200, 600, seed=1)
    graph.x = graph.x.double()
    graph.x[[3, 50, 51], 2] = bad
    with pytest.raises(ValueError, match=r"`source.x` has non-finite features \(NaN or ±inf, after conversion to "
                                         r"float32\) in 3 of 200 nodes \(first: \[3, 50, 51\]\).*torch.nan_to_num"):
        tiny_relational_dm(graph)


@pytest.mark.parametrize("which", ["test_source", "val_source"])
def test_non_finite_evaluation_features_are_refused(which):
    from lightning_dprel.demos import random_feature_graph
    from lightning_dprel.demos.boring_classes import tiny_relational_dm

    other = random_feature_graph(100, 300, seed=2)
    other.x[7] = float("nan")
    with pytest.raises(ValueError, match=rf"`{which}.x` has non-finite features .* in 1 of 100 nodes \(first: \[7\]\)"):
        tiny_relational_dm(**{which: other})


# --------------------------------------------------------------------------------------------- C: the accounting CLI
BASE = ["--edges", "50", "--max-degree", "5", "--sampling-rate", "0.1", "--neg-per-pos", "1",
        "--noise-multiplier", "1.0", "--steps", "100", "--clipping", "freq", "--json"]


def test_cli_warns_when_delta_is_not_below_one_over_n(capsys):
    from lightning_dprel.accounting.cli import main

    with pytest.warns(UserWarning, match=r"δ = 0.02 is not below 1/n = 0.01 \(n = 100 entities\)\. The privacy unit is "
                                         r"an entity, so a δ ≥ 1/n allows releasing one entity outright"):
        assert main(["epsilon", "--nodes", "100", *BASE]) == 0  # default δ = 1/M = 1/50
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["epsilon", "--nodes", "100", *BASE, "--delta", "1e-3"]) == 0


_NO_TORCH = """
import sys
{prelude}
from lightning_dprel.accounting.cli import main
main(["epsilon", "--nodes", "2708", "--edges", "5000", "--max-degree", "5", "--sampling-rate", "0.01",
      "--neg-per-pos", "1", "--noise-multiplier", "1.0", "--steps", "1000", "--clipping", "freq", "--plot", {png!r}])
heavy = sorted(m for m in ("torch", "torch_geometric", "pytorch_lightning", "lightning", "transformers") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""

# Bypass lightning_dprel/__init__.py: the accounting package itself must not pull torch in.
_BARE_PACKAGE = """
import types, pathlib
pkg = types.ModuleType("lightning_dprel")
pkg.__path__ = [str(pathlib.Path({root!r}) / "lightning_dprel")]
sys.modules["lightning_dprel"] = pkg
"""


def _heavy_modules(prelude: str, tmp_path) -> list[str]:
    code = _NO_TORCH.format(prelude=prelude, png=str(tmp_path / "p.png"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "MPLBACKEND": "Agg"}, check=False)
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("HEAVY="))
    return [m for m in line[len("HEAVY="):].split(",") if m]


@pytest.mark.slow
def test_accounting_package_imports_no_torch(tmp_path):
    assert _heavy_modules(_BARE_PACKAGE.format(root=str(ROOT)), tmp_path) == []


@pytest.mark.slow
def test_accounting_cli_imports_no_torch(tmp_path):
    # Needs lightning_dprel/__init__.py to load the batch records (which import torch) lazily.
    assert _heavy_modules("", tmp_path) == []


# --------------------------------------------------------------------------------------------- D: ε over time
@pytest.mark.parametrize("mechanism", ["freq_corrected", "freq_paper", "standard", "naive"])
def test_epsilon_curve_equals_the_accountant_step_by_step(mechanism):
    from lightning_dprel.accounting import epsilon_curve

    spec, sigma, delta = make_spec(2000, 3000, 3, 0.01, 1), 1.1, 1e-4
    steps = list(range(61))
    curve, orders = epsilon_curve(mechanism, spec, sigma, delta, steps, return_orders=True)
    acc = Accountant(mechanism)
    assert curve[0] == 0.0
    for t in steps[1:]:
        acc.step(spec, sigma)
        assert (curve[t], orders[t]) == acc.get_epsilon_and_order(delta)  # bit for bit
    assert np.array_equal(epsilon_curve(mechanism, spec, sigma, delta, [60, 5, 60]), curve[[60, 5, 60]])


def test_epsilon_curve_checks_its_inputs():
    from lightning_dprel.accounting import epsilon_curve

    spec = make_spec(2000, 3000, 3, 0.01, 1)
    with pytest.raises(ValueError, match=r"`steps` must be ints >= 0"):
        epsilon_curve("naive", spec, 1.0, 1e-4, [1, -2])
    with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\)"):
        epsilon_curve("naive", spec, 1.0, 1.5, [1])
    with pytest.raises(ValueError, match=r"`mechanism` must be one of"):
        epsilon_curve("nope", spec, 1.0, 1e-4, [1])


def test_the_cli_uses_the_public_curve():
    from lightning_dprel import accounting
    from lightning_dprel.accounting import cli, curves

    assert cli.epsilon_curve is curves.epsilon_curve is accounting.epsilon_curve
    assert accounting.plot_epsilon_curve is curves.plot_epsilon_curve


def test_plot_epsilon_curve_saves_a_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from lightning_dprel.accounting import epsilon_curve, plot_epsilon_curve

    spec = make_spec(2000, 3000, 3, 0.01, 1)
    steps = np.arange(0, 201, 20)
    path = tmp_path / "eps.png"
    ax = plot_epsilon_curve(steps, epsilon_curve("freq_corrected", spec, 1.0, 1e-4, steps), label="corrected",
                            delta=1e-4, target_epsilon=4.0, path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ax.get_xlabel() == "steps T" and ax.get_ylabel() == "ε (δ = 0.0001)"
    assert len(ax.lines[0].get_xdata()) == 10  # T = 0 (ε = 0) is left off the log axes
    with pytest.raises(ValueError, match="same length"):
        plot_epsilon_curve([1, 2], [0.1])
