"""The one-dimensional dominating pairs behind the PLD accountant, checked against the real multi-dimensional mechanisms.

``docs/accounting.md`` ("Tight accounting") reduces two d-dimensional Gaussian mechanisms to a 1-D pair by a
Neyman–Pearson argument: the public-items mixture (K tuples, each Poisson-sampled with γ, ‖g_t‖ ≤ 1:
P = Σ_S γ^|S|(1−γ)^(K−|S|) N(Σ_{t∈S} g_t, σ²I) against Q = N(0, σ²I)) is dominated by
(Σ_i Bin(K, γ)(i) N(i, σ²), N(0, σ²)), and the replace-one subsampled Gaussian ((1−q)N(0) + qN(u) against
(1−q)N(0) + qN(v), ‖u‖, ‖v‖ ≤ 1) by ((1−q)N(0, σ²) + qN(1, σ²), (1−q)N(0, σ²) + qN(−1, σ²)), both directions and every
hockey-stick divergence H_{e^ε}. Here the exact H_{e^ε}(P‖Q) and H_{e^ε}(Q‖P) of the d = 2 and d = 3 mechanisms
(K ≤ 3; aligned, antipodal, orthogonal and random vectors) are integrated on a tensor grid and compared with the pair's
closed form (monotone likelihood ratio: the optimal set is a half-line) and with the δ(ε) and ε(δ) of the PLDs that
``binomial_mixture_pld`` / ``replace_one_pld`` build: never above the pair, never above the PLD, and equal to the pair
when the vectors are aligned (the pair is tight). Negative controls show the comparison catches a pair that is too small.

Integration accuracy: a Riemann sum on a uniform grid (spacing σ/12 in 2-D, σ/5 in 3-D, box the means ± 8σ) is
spectrally accurate for the smooth Gaussian densities; its error comes from the kink of (p − e^ε q)_+ on the decision
boundary, O(h²) when that boundary is parallel to a grid plane and far smaller otherwise. Every configuration is
therefore rotated by a fixed generic rotation (the divergences are rotation invariant). Measured against the closed form
(aligned vectors) the error is ≤ 3·10⁻⁷ absolute and ≤ 2.1·10⁻⁵ relative; for random vectors grid refinement
(``test_grid_integration_is_converged``) moves it by ≤ 4·10⁻⁶ absolute, ≤ 10⁻⁴ relative where δ > 10⁻³. Assertions
allow ``tol(x) = RTOL·x + ATOL`` (10⁻³ relative, 10⁻⁹ absolute), ≥ 10× those errors, so divergences below ~10⁻⁸ are
not resolved; the negative controls exceed their wrong pairs by ≥ 3.8·10⁻⁷ absolute and ≥ 1.2× (``NEG_EPS``).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from scipy import integrate
from scipy.optimize import brentq
from scipy.special import logsumexp
from scipy.stats import binom, norm, special_ortho_group

from lightning_dprel.accounting.pld import (
    VALUE_DISCRETIZATION,
    binomial_mixture_pld,
    poisson_gaussian_pld,
    replace_one_pld,
)

EPS = (0.0, 0.5, 1.0, 2.0)
NEG_EPS = (0.0, 0.5, 1.0)  # negative controls: at ε = 2, γ = 0.1, σ = 1.5 every δ is below the tolerance floor
SETTINGS = [(0.1, 0.7), (0.5, 0.7), (0.1, 1.5), (0.5, 1.5)]  # (γ or q, σ), σ in units of the clip norm C = 1
RTOL, ATOL = 1e-3, 1e-9  # integration tolerance (see the module docstring)
POINTS_PER_SIGMA = {2: 12, 3: 5}
BOX_SIGMAS = 8.0
# dp-accounting's mixture PLD takes 5–20 s per build for K ≥ 2 (its inverse privacy loss is recursive), so the PLD
# checks for K ≥ 2 run on one setting each; every setting is checked against the pair itself.
PLD_SETTINGS = {1: SETTINGS, 2: [(0.5, 1.5)], 3: [(0.1, 1.5)]}

_PHI = (1 + 5 ** 0.5) / 2
_ROTATION = {
    2: np.array([[1.0, -_PHI], [_PHI, 1.0]]) / np.hypot(1.0, _PHI),  # slope φ: no grid-parallel boundary
    3: special_ortho_group.rvs(3, random_state=12345),
}


# ---------------------------------------------------------------------------------------------------------------------
# Exact divergences of the d-dimensional mechanisms (tensor-grid integration) and of the 1-D pairs (closed form)
# ---------------------------------------------------------------------------------------------------------------------


def tol(x):
    """Allowed integration error of an exact divergence of size x."""
    return RTOL * np.asarray(x) + ATOL


def grid_hockey_sticks(p_means, p_w, q_means, q_w, sigma, eps=EPS, points_per_sigma=None):
    """[(H_{e^ε}(P‖Q), H_{e^ε}(Q‖P)) for ε in eps] for Gaussian mixtures with covariance σ²I, by a Riemann sum."""
    p_means, q_means = np.atleast_2d(p_means), np.atleast_2d(q_means)
    d = p_means.shape[1]
    h = sigma / (points_per_sigma or POINTS_PER_SIGMA[d])
    all_means = np.vstack([p_means, q_means])
    axes = []
    for k in range(d):
        lo, hi = all_means[:, k].min() - BOX_SIGMAS * sigma, all_means[:, k].max() + BOX_SIGMAS * sigma
        axes.append(lo + h * np.arange(int(np.ceil((hi - lo) / h)) + 1))

    def density(means, weights):  # each component is separable: an outer product of 1-D Gaussians
        out = 0.0
        for m, w in zip(means, weights):
            comp = w
            for k, ax in enumerate(axes):
                comp = np.multiply.outer(comp, norm.pdf(ax, loc=m[k], scale=sigma))
            out = out + comp
        return out

    p, q = density(p_means, p_w), density(q_means, q_w)
    cell = h ** d
    return np.array([(np.maximum(p - np.exp(e) * q, 0).sum() * cell, np.maximum(q - np.exp(e) * p, 0).sum() * cell)
                     for e in eps])


def hockey_stick_1d(p_means, p_w, q_means, q_w, sigma, eps):
    """H_{e^ε}(P‖Q) of 1-D Gaussian mixtures whose log-likelihood ratio is increasing: the optimal set is {x > t}."""
    p_means, p_w, q_means, q_w = map(np.asarray, (p_means, p_w, q_means, q_w))

    def llr(x):
        return logsumexp(-(x - p_means) ** 2 / (2 * sigma ** 2), b=p_w) - logsumexp(
            -(x - q_means) ** 2 / (2 * sigma ** 2), b=q_w)

    bound = 60 * sigma + 10
    if llr(bound) <= eps:  # the ratio never exceeds e^ε
        return 0.0
    assert llr(-bound) < eps, "likelihood ratio not monotone on the bracket"
    t = brentq(lambda x: llr(x) - eps, -bound, bound, xtol=1e-13)
    return float(np.sum(p_w * norm.sf((t - p_means) / sigma)) - np.exp(eps) * np.sum(q_w * norm.sf((t - q_means) / sigma)))


def both_ways_1d(p_means, p_w, q_means, q_w, sigma, eps):
    """(H(P‖Q), H(Q‖P)); the reverse is the forward of the mirrored pair (x → −x keeps the ratio increasing)."""
    fwd = hockey_stick_1d(p_means, p_w, q_means, q_w, sigma, eps)
    rev = hockey_stick_1d(-np.asarray(q_means), q_w, -np.asarray(p_means), p_w, sigma, eps)
    return fwd, rev


def public_items_pair(K, gamma, sigma, eps, sensitivity=1.0):
    """The claimed pair (Σ_i Bin(K, γ)(i) N(i·Δ, σ²), N(0, σ²)), both directions."""
    return both_ways_1d(sensitivity * np.arange(K + 1.0), binom.pmf(np.arange(K + 1), K, gamma), [0.0], [1.0], sigma, eps)


def replace_one_pair(q, sigma, eps, sensitivity=1.0):
    """The claimed pair ((1−q)N(0) + qN(Δ), (1−q)N(0) + qN(−Δ)), both directions."""
    return both_ways_1d([0.0, sensitivity], [1 - q, q], [0.0, -sensitivity], [1 - q, q], sigma, eps)


# ---------------------------------------------------------------------------------------------------------------------
# The mechanisms and their vector configurations
# ---------------------------------------------------------------------------------------------------------------------


def _random_directions(rng, n, d):
    v = rng.normal(size=(n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def tuple_gradients(config, K, d):
    """K clipped tuple gradients g_t (‖g_t‖ ≤ 1) in R^d, rotated generically (see the module docstring)."""
    e = np.eye(d)
    rng = np.random.default_rng([K, d, sum(map(ord, config))])
    if config == "aligned":  # the claimed worst case
        G = np.tile(e[0], (K, 1))
    elif config == "antipodal":
        G = np.array([(-1) ** t * e[0] for t in range(K)])
    elif config == "orthogonal":
        G = e[:K]
    elif config == "random_unit":
        G = _random_directions(rng, K, d)
    elif config == "random":
        G = _random_directions(rng, K, d) * rng.uniform(0.1, 1.0, size=(K, 1))
    else:
        raise ValueError(config)
    return G @ _ROTATION[d].T


def public_items_mixture(G, gamma):
    """Means Σ_{t∈S} g_t and weights γ^|S|(1−γ)^(K−|S|) over the sampled sets S ⊆ [K]."""
    K = len(G)
    subsets = np.array(list(itertools.product([0, 1], repeat=K)), dtype=float)
    return subsets @ G, gamma ** subsets.sum(1) * (1 - gamma) ** (K - subsets.sum(1))


@functools.lru_cache(maxsize=None)
def public_items_exact(K, config, d, gamma, sigma):
    """Exact (H(P‖Q), H(Q‖P)) per ε of the d-dimensional public-items mechanism."""
    means, weights = public_items_mixture(tuple_gradients(config, K, d), gamma)
    return grid_hockey_sticks(means, weights, np.zeros((1, d)), [1.0], sigma)


def replaced_gradients(config, d):
    """(u, v): the changed subgraph's clipped gradient before and after, ‖u‖, ‖v‖ ≤ 1, rotated generically."""
    e = np.eye(d)
    rng = np.random.default_rng([d, sum(map(ord, config)), 1])
    u, v = {
        "opposite": lambda: (e[0], -e[0]),  # the claimed worst case
        "same": lambda: (e[0], e[0]),
        "orthogonal": lambda: (e[0], e[1]),
        "one_zero": lambda: (e[0], 0 * e[0]),
        "random_unit": lambda: tuple(_random_directions(rng, 2, d)),
        "random": lambda: tuple(_random_directions(rng, 2, d) * rng.uniform(0.1, 1.0, size=(2, 1))),
    }[config]()
    R = _ROTATION[d]
    return R @ u, R @ v


@functools.lru_cache(maxsize=None)
def replace_one_exact(config, d, q, sigma):
    """Exact (H(P‖Q), H(Q‖P)) per ε of the d-dimensional replace-one subsampled Gaussian."""
    u, v = replaced_gradients(config, d)
    zero = np.zeros(d)
    return grid_hockey_sticks(np.array([zero, u]), [1 - q, q], np.array([zero, v]), [1 - q, q], sigma)


@functools.lru_cache(maxsize=None)
def mixture_pld(K, gamma, sigma):
    return binomial_mixture_pld(max_degree=K, gamma=gamma, sigma=sigma, interval=VALUE_DISCRETIZATION)


@functools.lru_cache(maxsize=None)
def replace_pld(q, sigma):
    return replace_one_pld(q, sigma, interval=VALUE_DISCRETIZATION)


PUBLIC_CASES = [(K, config, d) for d in (2, 3) for K in (1, 2, 3)
                for config in (("aligned", "random") if K == 1 else
                               ("aligned", "antipodal", "orthogonal", "random_unit", "random"))
                if not (config == "orthogonal" and K > d)]
REPLACE_CONFIGS = ("opposite", "same", "orthogonal", "one_zero", "random_unit", "random")


def _assert_pld_covers(pld, exact, label):
    """(b): the PLD's δ(ε) ≥ the exact δ(ε) (max of both directions), and its ε at that δ ≥ ε."""
    for i, eps in enumerate(EPS):
        exact_delta = float(exact[i].max())
        pld_delta = float(pld.get_delta_for_epsilon(eps))
        assert pld_delta >= exact_delta - tol(exact_delta), f"{label} ε={eps}: PLD δ {pld_delta:.6g} < exact {exact_delta:.6g}"
        certified = exact_delta - tol(exact_delta)  # a lower bound on the true δ(ε): the true ε at this δ is ≥ ε
        if eps > 0 and certified > 0:
            pld_eps = float(pld.get_epsilon_for_delta(certified))
            assert pld_eps >= eps, f"{label}: PLD ε {pld_eps:.6g} < true ε {eps} at δ={certified:.6g}"


# ---------------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,sigma", SETTINGS)
@pytest.mark.parametrize("K,config,d", PUBLIC_CASES)
def test_public_items_mixture_is_dominated_by_the_binomial_pair(K, config, d, gamma, sigma):
    """(a) exact ≤ pair both ways for every ε; (c) aligned tuple gradients attain the pair (it is tight)."""
    exact = public_items_exact(K, config, d, gamma, sigma)
    for i, eps in enumerate(EPS):
        pair = public_items_pair(K, gamma, sigma, eps)
        for way, name in enumerate(("H(P‖Q)", "H(Q‖P)")):
            assert exact[i, way] <= pair[way] + tol(pair[way]), (
                f"K={K} {config} d={d} γ={gamma} σ={sigma} ε={eps}: exact {name} {exact[i, way]:.6g} > pair {pair[way]:.6g}")
            if config == "aligned":
                assert abs(exact[i, way] - pair[way]) <= tol(pair[way]), f"aligned K={K} d={d} ε={eps} {name}"


@pytest.mark.parametrize("config", REPLACE_CONFIGS)
@pytest.mark.parametrize("q,sigma", SETTINGS)
@pytest.mark.parametrize("d", (2, 3))
def test_replace_one_subsampled_gaussian_is_dominated_by_the_plus_minus_pair(config, q, sigma, d):
    """(a) exact ≤ pair both ways for every ε; (c) u = −v (unit norm) attains the pair."""
    exact = replace_one_exact(config, d, q, sigma)
    for i, eps in enumerate(EPS):
        pair = replace_one_pair(q, sigma, eps)
        for way, name in enumerate(("H(P‖Q)", "H(Q‖P)")):
            assert exact[i, way] <= pair[way] + tol(pair[way]), (
                f"{config} d={d} q={q} σ={sigma} ε={eps}: exact {name} {exact[i, way]:.6g} > pair {pair[way]:.6g}")
            if config == "opposite":
                assert abs(exact[i, way] - pair[way]) <= tol(pair[way]), f"opposite d={d} ε={eps} {name}"
    if config == "same":
        assert np.all(exact <= ATOL)  # P = Q


@pytest.mark.parametrize("K,config,d,gamma,sigma", [
    (K, config, d, gamma, sigma) for (K, config, d) in PUBLIC_CASES for (gamma, sigma) in PLD_SETTINGS[K]
    if d == 3 or config == "aligned"
])
def test_binomial_mixture_pld_is_an_upper_bound_on_the_exact_mechanism(K, config, d, gamma, sigma):
    """(b) ``binomial_mixture_pld``'s δ(ε) and ε(δ) are never below the real mechanism's."""
    _assert_pld_covers(mixture_pld(K, gamma, sigma), public_items_exact(K, config, d, gamma, sigma),
                       f"K={K} {config} d={d} γ={gamma} σ={sigma}")


@pytest.mark.parametrize("config", ("opposite", "one_zero", "random_unit"))
@pytest.mark.parametrize("q,sigma", SETTINGS)
def test_replace_one_pld_is_an_upper_bound_on_the_exact_mechanism(config, q, sigma):
    """(b) ``replace_one_pld``'s δ(ε) and ε(δ) are never below the real mechanism's (d = 3)."""
    _assert_pld_covers(replace_pld(q, sigma), replace_one_exact(config, 3, q, sigma), f"{config} q={q} σ={sigma}")


def test_a_unit_with_fewer_tuples_is_dominated_by_the_larger_degree_pair():
    """K_u = 2 aligned tuples under the K' = 3 pair (stochastic order in K, docs' last step)."""
    for gamma, sigma in SETTINGS:
        exact = public_items_exact(2, "aligned", 2, gamma, sigma)
        for i, eps in enumerate(EPS):
            fwd, rev = public_items_pair(3, gamma, sigma, eps)
            assert exact[i, 0] <= fwd + tol(fwd) and exact[i, 1] <= rev + tol(rev)


# --- negative controls: the comparison is sensitive ------------------------------------------------------------------


@pytest.mark.parametrize("gamma,sigma", SETTINGS)
def test_negative_control_a_half_sensitivity_pair_is_below_the_exact_mechanism(gamma, sigma):
    """A pair with shift 0.5 for a unit whose one gradient has norm 1 is exceeded: the test would catch a wrong pair."""
    exact = public_items_exact(1, "aligned", 3, gamma, sigma)
    for i, eps in enumerate(NEG_EPS):
        fwd, _ = public_items_pair(1, gamma, sigma, eps, sensitivity=0.5)
        assert exact[i, 0] > fwd + 10 * tol(fwd), f"γ={gamma} σ={sigma} ε={eps}: {exact[i, 0]:.6g} vs {fwd:.6g}"


@pytest.mark.parametrize("gamma,sigma", SETTINGS)
def test_negative_control_the_one_tuple_pair_and_pld_do_not_cover_three_aligned_tuples(gamma, sigma):
    """Ignoring K (the Poisson pair, or its PLD, for a 3-tuple unit) is below the exact divergence."""
    exact = public_items_exact(3, "aligned", 3, gamma, sigma)
    too_small = poisson_gaussian_pld(gamma, sigma, VALUE_DISCRETIZATION)
    for i, eps in enumerate(NEG_EPS):
        fwd, _ = public_items_pair(1, gamma, sigma, eps)
        assert exact[i, 0] > fwd + 10 * tol(fwd)
        wrong_delta = float(too_small.get_delta_for_epsilon(eps))
        assert exact[i].max() > wrong_delta + 10 * tol(wrong_delta)


@pytest.mark.parametrize("q,sigma", SETTINGS)
def test_negative_control_the_add_remove_pair_does_not_cover_replace_one(q, sigma):
    """Replace-one with u = −v exceeds the add/remove Poisson pair ((1−q)N(0) + qN(1), N(0))."""
    exact = replace_one_exact("opposite", 2, q, sigma)
    for i, eps in enumerate(NEG_EPS):
        wrong = max(public_items_pair(1, q, sigma, eps))
        assert exact[i].max() > wrong + 10 * tol(wrong), f"q={q} σ={sigma} ε={eps}: {exact[i].max():.6g} vs {wrong:.6g}"


# --- the integrators themselves --------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,sigma", [(0.5, 0.7), (0.1, 1.5)])
@pytest.mark.parametrize("d,K", [(2, 3), (3, 3)])
def test_grid_integration_is_converged(d, K, gamma, sigma):
    """Refining the grid 1.6× moves the exact divergence of random tuple gradients well within tol (error bound)."""
    means, weights = public_items_mixture(tuple_gradients("random_unit", K, d), gamma)
    coarse = grid_hockey_sticks(means, weights, np.zeros((1, d)), [1.0], sigma)
    fine = grid_hockey_sticks(means, weights, np.zeros((1, d)), [1.0], sigma,
                              points_per_sigma=int(1.6 * POINTS_PER_SIGMA[d]))
    assert np.all(np.abs(coarse - fine) <= tol(fine) / 4), np.abs(coarse - fine) / fine


@pytest.mark.parametrize("K,gamma,sigma", [(1, 0.1, 0.7), (3, 0.5, 1.5)])
def test_closed_form_pair_matches_quadrature(K, gamma, sigma):
    """The half-line closed form of the 1-D pair equals scipy's adaptive quadrature of (p − e^ε q)_+."""
    w = binom.pmf(np.arange(K + 1), K, gamma)

    def p(x):
        return float(np.sum(w * norm.pdf(x, loc=np.arange(K + 1.0), scale=sigma)))

    def q(x):
        return float(norm.pdf(x, scale=sigma))

    for eps in EPS:
        fwd, rev = public_items_pair(K, gamma, sigma, eps)
        lim = (-12 * sigma, K + 12 * sigma)
        f_quad = integrate.quad(lambda x: max(p(x) - np.exp(eps) * q(x), 0.0), *lim, limit=400, epsabs=1e-12)[0]
        r_quad = integrate.quad(lambda x: max(q(x) - np.exp(eps) * p(x), 0.0), *lim, limit=400, epsabs=1e-12)[0]
        assert fwd == pytest.approx(f_quad, abs=1e-8) and rev == pytest.approx(r_quad, abs=1e-8)
