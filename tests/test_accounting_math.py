"""The mathematics of the coupled-sampling bound: exact forms, quadrature, the ℓ-expectation, the 1-D reduction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from lightning_dprel.accounting import DEFAULT_ORDERS, freq_corrected_profile, paper_profile, standard_profile
from lightning_dprel.accounting.analysis import (
    binomial_plan,
    coupled_rdp,
    eq3_rdp,
    log_a,
    log_psi_forward_exact,
    log_psi_quadrature,
    mixture_log_weights,
)
from lightning_dprel.accounting.analysis.binomial import log_chernoff_tail

mpmath = pytest.importorskip("mpmath")

PROFILES = {"paper": paper_profile, "corrected": freq_corrected_profile, "standard": standard_profile}


def test_default_orders_cover_dp_accounting_grid():
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    assert set(np.round(DEFAULT_RDP_ORDERS, 10)) <= set(np.round(DEFAULT_ORDERS, 10))
    assert DEFAULT_ORDERS.min() == pytest.approx(1.1) and DEFAULT_ORDERS.max() == 1024
    assert 64 in DEFAULT_ORDERS


def test_profiles_match_the_spec():
    K, k = 5, 4
    corr = freq_corrected_profile(K, k)
    assert corr[0, 0] == 0 and corr[5, 0] == pytest.approx(6.75)  # the spec's counterexample: 0.5 + 25/4
    assert corr[0, 1] == pytest.approx(1.25) and corr[2, 1] == pytest.approx(0.5 + 0.75 + 2 * 5 / 4)
    std = standard_profile(K, k)
    assert std[3, 1] == 5 and std[0, 0] == 0
    pap = paper_profile(K, k)
    assert pap[0, 0] == 0 and np.all(pap.reshape(-1)[1:] == 1)
    for prof in (corr, std, pap):  # every mean on the 1/4 grid: Theorem C.1's polynomial form applies
        assert np.allclose(4 * prof, np.round(4 * prof))
    assert np.all(corr >= pap)  # corrected ≥ paper everywhere


@pytest.mark.parametrize("name", list(PROFILES))
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("alpha", [2, 3, 4, 8])
def test_exact_forward_matches_quadrature(name, sigma, alpha):
    K, k, gamma = 3, 2, 0.05
    prof = PROFILES[name](K, k)
    p = np.array([0.0, 0.01, 0.3, 1.0])
    log_w = mixture_log_weights(K, gamma, p)
    quad = log_psi_quadrature(log_w, prof.reshape(-1) / sigma, np.array([float(alpha)]), direction="forward")[:, 0]
    exact = np.array([log_psi_forward_exact(row, prof.reshape(-1), sigma, alpha) for row in log_w])
    np.testing.assert_allclose(quad, exact, rtol=1e-8, atol=0)


def _mp_log_psi(weights, means, alpha, direction):
    """Brute-force log Ψ_α with mpmath (30 digits): mixture Σ w N(μ, 1) vs N(0, 1)."""
    mpmath.mp.dps = 30
    w = [mpmath.mpf(x) for x in weights]
    mu = [mpmath.mpf(x) for x in means]
    a = mpmath.mpf(alpha)

    def ratio(u):
        return sum(wi * mpmath.exp(u * mi - mi * mi / 2) for wi, mi in zip(w, mu))

    lam = a if direction == "forward" else 1 - a
    f = lambda u: mpmath.npdf(u) * ratio(u) ** lam  # noqa: E731
    top = float(alpha) * max(means) + 14 if direction == "forward" else 14
    bottom = -14 if direction == "forward" else -(float(alpha) - 1) * max(means) - 14
    pts = list(np.linspace(bottom, top, 12))
    return float(mpmath.log(mpmath.quad(f, pts)))


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("alpha", [1.5, 4.5])
def test_quadrature_matches_mpmath(direction, alpha):
    sigma = 0.7
    prof = freq_corrected_profile(2, 1)  # means 0, 1.25, 1, 1.75, 1.5, 2.25 (× 1/σ)
    log_w = mixture_log_weights(2, 0.2, np.array([0.3]))
    nu = prof.reshape(-1) / sigma
    ours = log_psi_quadrature(log_w, nu, np.array([alpha]), direction=direction)[0, 0]
    ref = _mp_log_psi(np.exp(log_w[0]), nu, alpha, direction)
    assert ours == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_quadrature_converged_under_halving(direction):
    for sigma in (0.3, 1.0, 20.0):
        prof = freq_corrected_profile(5, 4).reshape(-1)
        log_w = mixture_log_weights(5, 1e-3, np.array([0.0, 1e-3, 0.5, 1.0]))
        a = log_psi_quadrature(log_w, prof / sigma, DEFAULT_ORDERS, direction=direction)
        b = log_psi_quadrature(log_w, prof / sigma, DEFAULT_ORDERS, direction=direction, step_scale=0.5)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-13)


def test_sampled_gaussian_closed_form_matches_quadrature_and_edges():
    q = np.array([1e-4, 0.01, 0.3, 0.9])
    for sigma in (0.5, 2.0):
        for alpha in (1.3, 2.0, 5.5, 11.0):
            closed = log_a(q, sigma, alpha)
            with np.errstate(divide="ignore"):
                log_w = np.stack([np.log1p(-q), np.log(q)], axis=1)
            quad = log_psi_quadrature(log_w, np.array([0.0, 1 / sigma]), np.array([alpha]), direction="forward")
            np.testing.assert_allclose(closed, quad[:, 0], rtol=1e-7, atol=1e-12)
    assert log_a(0.0, 1.0, 3.0) == 0.0
    assert log_a(1.0, 2.0, 3.0) == pytest.approx(3 * 2 / (2 * 4))


SPEC = dict(num_nodes=20_000, num_edges=50_000, max_degree=4, sampling_rate=2e-3, neg_per_pos=3)


def test_eq3_closed_form_equals_mixture_with_paper_profile():
    for sigma in (0.6, 2.0):
        eq3 = eq3_rdp(noise_multiplier=sigma, orders=DEFAULT_ORDERS, **SPEC)
        mix = coupled_rdp(paper_profile(4, 3), noise_multiplier=sigma, orders=DEFAULT_ORDERS, **SPEC)
        np.testing.assert_allclose(mix, eq3, rtol=1e-7, atol=1e-14)


def test_reverse_direction_never_exceeds_forward_for_sampled_gaussian():
    # Mironov et al. 2019: for (1−q)N(0,σ²) + qN(1,σ²) the forward direction dominates.
    q = np.array([1e-3, 0.05, 0.5])
    log_w = np.stack([np.log1p(-q), np.log(q)], axis=1)
    nu = np.array([0.0, 1.0 / 0.8])
    fwd = log_psi_quadrature(log_w, nu, DEFAULT_ORDERS, direction="forward")
    rev = log_psi_quadrature(log_w, nu, DEFAULT_ORDERS, direction="reverse")
    assert np.all(rev <= fwd + 1e-12)


def _exact_expectation(m, gamma, n, k, f):
    ell = np.arange(m + 1)
    pmf = stats.binom.pmf(ell, m, gamma)
    return float(np.sum(pmf * f(np.minimum(1.0, ell * k / n))))


@pytest.mark.parametrize(
    "m,gamma,n,k,slack", [(2000, 0.05, 5000, 3, 1e-3), (10_000, 0.3, 40_000, 2, 1e-3), (300, 0.01, 100, 4, 5e-2)]
)
def test_binomial_plan_is_a_tight_upper_bound(m, gamma, n, k, slack):
    coarse = binomial_plan(m, gamma, n, k, max_exact=16, n_buckets=12)  # force chords and tails
    default = binomial_plan(m, gamma, n, k)
    for f in (lambda p: np.exp(40 * p), lambda p: 1 + 3 * p**2, lambda p: (1 + 50 * p) ** 3):
        exact = _exact_expectation(m, gamma, n, k, f)
        for plan in (coarse, default):
            bound = float(np.exp(plan.log_expectation(np.log(f(plan.points)))))
            assert bound >= exact * (1 - 1e-12)
        assert bound <= exact * (1 + slack)


def test_binomial_plan_never_drops_mass_and_scales_to_1e9():
    plan = binomial_plan(10**9, 0.01, 10**9, 4)
    total = float(np.exp(plan.log_expectation(np.zeros(plan.points.size))))
    assert 1.0 <= total < 1.0 + 1e-9
    assert plan.points.size < 200 and plan.points.max() == 1.0  # tail charged up to p = 1
    # Chernoff tail bounds dominate the exact tails
    a = np.array([120, 150, 300])
    exact = stats.binom.logsf(a - 1, 10_000, 0.01)
    assert np.all(log_chernoff_tail(a, 10_000, 0.01, upper=True) >= exact)


def test_stable_for_m_1e9_and_sigma_range():
    for sigma in (0.3, 20.0):
        rdp = coupled_rdp(
            freq_corrected_profile(3, 2), num_nodes=10**9, num_edges=10**9, max_degree=3, sampling_rate=1e-4,
            neg_per_pos=2, noise_multiplier=sigma, orders=DEFAULT_ORDERS,
        )
        assert np.all(np.isfinite(rdp)) and np.all(rdp >= 0)
        assert np.all(np.diff(rdp * (DEFAULT_ORDERS - 1)) >= -1e-9)  # (α−1)ε(α) non-decreasing in α


def _psi_2d(w, mus, alpha, direction):
    """Ψ_α of Σ w N(μ_c, I) vs N(0, I) in the plane by a tensor trapezoid rule."""
    reach = np.max(np.linalg.norm(mus, axis=1)) * alpha
    g = np.linspace(-12 - reach, 12 + reach, 451)
    h = g[1] - g[0]
    x, y = np.meshgrid(g, g, indexing="ij")
    u = np.stack([x, y], -1)
    log_r = special.logsumexp(np.log(w) + u @ mus.T - 0.5 * (mus**2).sum(1), axis=-1)
    lam = alpha if direction == "forward" else 1 - alpha
    return special.logsumexp(lam * log_r - 0.5 * (x * x + y * y)) + 2 * math.log(h) - math.log(2 * math.pi)


def test_one_dimensional_reduction_is_the_worst_case():
    # Means at random points of the plane at distance ≤ Δ_c never beat all means on one ray at distance Δ_c.
    rng = np.random.default_rng(7)
    for _ in range(12):
        delta = np.concatenate([[0.0], rng.choice([0.5, 0.75, 1.0, 1.25, 1.75, 2.0], 2)])
        w = rng.dirichlet(np.ones(3))
        sigma = float(rng.choice([0.7, 1.0, 1.5]))
        alpha = float(rng.choice([1.5, 2.0, 3.0, 4.5]))
        ang = rng.uniform(0, 2 * np.pi, 3)
        rad = delta * rng.uniform(0.3, 1.0, 3)
        mus = np.stack([rad * np.cos(ang), rad * np.sin(ang)], 1) / sigma
        for direction in ("forward", "reverse"):
            plane = _psi_2d(w, mus, alpha, direction)
            ray = log_psi_quadrature(np.log(w)[None], delta / sigma, np.array([alpha]), direction=direction)[0, 0]
            assert plane <= ray + 1e-9


@pytest.mark.parametrize("name", ["corrected", "standard"])
def test_log_moment_is_convex_in_the_order(name):
    # log Ψ_α is convex in α (Hölder), and so is (α−1)ε(α) after the ℓ-expectation and the max of the two
    # directions: a consistency check between the integer-order and fractional-order quadratures.
    rdp = coupled_rdp(PROFILES[name](4, 3), noise_multiplier=0.8, orders=DEFAULT_ORDERS, **SPEC)
    orders = DEFAULT_ORDERS[DEFAULT_ORDERS <= 64]
    g = (rdp[: orders.size]) * (orders - 1)
    slopes = np.diff(g) / np.diff(orders)
    assert np.all(np.diff(slopes) >= -1e-9 * np.maximum(1.0, np.abs(slopes[1:])))
