"""Property tests: monotonicity of ε in the sampling and noise parameters, and the ordering of the bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_dprel.datamodules.edge_tuples.accounting import MECHANISMS
from lightning_dprel.accounting import (
    freq_corrected_profile,
    paper_profile,
    per_step_rdp,
    rdp_to_epsilon,
    standard_profile,
)
from lightning_dprel.demos.specs import make_spec

ORDERS = np.array([1.25, 1.5, 2.0, 3.0, 4.5, 8.0, 16.0, 32.0, 64.0])  # small grid: fast property checks
COUPLED = ("freq_corrected", "freq_paper", "standard")
PROFILE_OF = {"freq_corrected": freq_corrected_profile, "freq_paper": paper_profile, "standard": standard_profile}
REL = 1e-6  # numerical slack of the monotonicity checks


def _eps(mech, spec, sigma, steps=1000, delta=1e-6):
    return rdp_to_epsilon(ORDERS, steps * per_step_rdp(mech, spec, sigma, ORDERS), delta)[0]


settings_ = settings(max_examples=25, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])
params = st.fixed_dictionaries(
    {
        "n": st.integers(2_000, 100_000),
        "m": st.integers(1_000, 100_000),
        "K": st.integers(1, 5),
        "gamma": st.floats(1e-4, 1e-2),
        "k": st.integers(0, 4),
        "sigma": st.floats(0.5, 4.0),
        "mech": st.sampled_from(COUPLED),
    }
)


def _feasible(p, k=None, gamma=None):
    return (k if k is not None else p["k"]) * (gamma if gamma is not None else p["gamma"]) * p["m"] <= p["n"]


@settings_
@given(params, st.integers(1, 10_000), st.integers(1, 10_000))
def test_epsilon_non_decreasing_in_steps(p, t1, t2):
    if not _feasible(p):
        return
    spec = make_spec(p["n"], p["m"], p["K"], p["gamma"], p["k"])
    lo, hi = sorted((t1, t2))
    assert _eps(p["mech"], spec, p["sigma"], lo) <= _eps(p["mech"], spec, p["sigma"], hi) * (1 + REL) + 1e-12


@settings_
@given(params, st.floats(1.01, 3.0))
def test_epsilon_non_increasing_in_sigma(p, factor):
    if not _feasible(p):
        return
    spec = make_spec(p["n"], p["m"], p["K"], p["gamma"], p["k"])
    assert _eps(p["mech"], spec, p["sigma"] * factor) <= _eps(p["mech"], spec, p["sigma"]) * (1 + REL) + 1e-12


@settings_
@given(params, st.floats(1.01, 4.0))
def test_epsilon_non_decreasing_in_gamma(p, factor):
    g2 = min(1.0, p["gamma"] * factor)
    if not _feasible(p, gamma=g2):
        return
    a = _eps(p["mech"], make_spec(p["n"], p["m"], p["K"], p["gamma"], p["k"]), p["sigma"])
    b = _eps(p["mech"], make_spec(p["n"], p["m"], p["K"], g2, p["k"]), p["sigma"])
    assert a <= b * (1 + REL) + 1e-12


@settings_
@given(params)
def test_epsilon_non_decreasing_in_max_degree_and_negatives(p):
    if not _feasible(p, k=p["k"] + 1):
        return
    base = _eps(p["mech"], make_spec(p["n"], p["m"], p["K"], p["gamma"], p["k"]), p["sigma"])
    more_k = _eps(p["mech"], make_spec(p["n"], p["m"], p["K"], p["gamma"], p["k"] + 1), p["sigma"])
    more_deg = _eps(p["mech"], make_spec(p["n"], p["m"], p["K"] + 1, p["gamma"], p["k"]), p["sigma"])
    assert base <= more_k * (1 + REL) + 1e-12
    assert base <= more_deg * (1 + REL) + 1e-12


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("n,m,K,gamma,k", [(10**6, 5 * 10**6, 5, 1e-5, 4), (20_000, 50_000, 3, 2e-3, 2)])
def test_bounds_are_ordered(sigma, n, m, K, gamma, k):
    spec = make_spec(n, m, K, gamma, k)
    rdp = {mech: per_step_rdp(mech, spec, sigma, ORDERS) for mech in MECHANISMS}
    naive = ORDERS / (2 * sigma**2)
    np.testing.assert_allclose(rdp["naive"], naive)
    # Eq. 3 ≤ the naive bound α/(2σ²)
    assert np.all(rdp["freq_paper"] <= naive * (1 + 1e-12))
    # each profile ≤ its unamplified counterpart α·max Δ²/(2σ²C²)
    for mech in COUPLED:
        dmax = PROFILE_OF[mech](K, k).max()
        assert np.all(rdp[mech] <= ORDERS * dmax**2 / (2 * sigma**2) * (1 + 1e-9))
    # corrected FREQ-CLIP ≥ the paper's Eq. 3 (its profile is larger everywhere), per order and in ε
    assert np.all(rdp["freq_corrected"] >= rdp["freq_paper"] * (1 - 1e-9))
    for steps in (1, 1000):
        e_corr = rdp_to_epsilon(ORDERS, steps * rdp["freq_corrected"], 1 / m)[0]
        e_paper = rdp_to_epsilon(ORDERS, steps * rdp["freq_paper"], 1 / m)[0]
        assert e_corr >= e_paper
