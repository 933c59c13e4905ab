"""Eq. 3 of the paper: the sampled-Gaussian moment A_α(q) and the adaptive-clipping bound built on it.

A_α(q) = Ψ_α((1−q)·N(0,σ²) + q·N(1,σ²) ‖ N(0,σ²)) is the quantity of Mironov, Talwar, Zhang (2019),
"Rényi Differential Privacy of the Sampled Gaussian Mechanism" (arXiv:1908.10530, Section 3.3): a finite
binomial sum for integer α and a convergent two-sided series with Gaussian tails for fractional α.
Vectorised over q; computed in log space.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from lightning_dprel.accounting.analysis.binomial import binomial_plan
from lightning_dprel.accounting.analysis.coupled_rdp import log_psi_quadrature

__all__ = ["log_a", "log_a_orders", "eq3_gamma", "eq3_rdp"]

# Stop the fractional series once both new terms are below e^-30 (as Opacus and dp-accounting do). Beyond
# i > α+1 the terms alternate in sign and shrink, so each omitted tail is at most its first term; we add
# 2·e^-30 to A_α (≥ 1) to keep an upper bound.
_SERIES_STOP = -30.0
_SERIES_MAX_TERMS = 100_000


def _log_a_int(q: np.ndarray, sigma: float, alpha: int) -> np.ndarray:
    """log A_α(q) for integer α: log Σ_i C(α,i) (1−q)^{α−i} q^i exp((i²−i)/(2σ²))  (Mironov et al. 2019, Eq. 3.3)."""
    i = np.arange(alpha + 1, dtype=float)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
    qq = q[:, None]
    terms = (
        log_binom
        + special.xlogy(i, qq)
        + special.xlog1py(alpha - i, -qq)
        + (i * i - i) / (2.0 * sigma * sigma)
    )
    return special.logsumexp(terms, axis=1)


def _log_a_frac(q: np.ndarray, sigma: float, alpha: np.ndarray) -> np.ndarray:
    """log A_α(q) for fractional orders by the two-sided generalized-binomial series (Mironov et al. 2019, Sec. 3.3).

    The integral over x splits at z0 = σ² log(1/q − 1) + 1/2, where q·e^{(2x−1)/(2σ²)} = 1 − q; on each side
    the binomial series in the smaller ratio converges, and every term integrates to a Gaussian tail.
    Vectorised over q (P,) and α (A,): returns (P, A).
    """
    log_q, log_1mq = np.log(q)[:, None], np.log1p(-q)[:, None]
    z0 = sigma * sigma * (log_1mq - log_q) + 0.5
    alpha = np.asarray(alpha, dtype=float)[None, :]
    shape = (q.size, alpha.size)
    pos0, neg0, pos1, neg1 = (np.full(shape, -np.inf) for _ in range(4))
    active = np.ones(alpha.size, dtype=bool)
    two_s2 = 2.0 * sigma * sigma
    i = 0
    while np.any(active):
        coef = special.binom(alpha, i)  # (1, A)
        with np.errstate(divide="ignore"):
            log_coef = np.log(np.abs(coef))
        j = alpha - i
        log_s0 = log_coef + i * log_q + j * log_1mq + special.log_ndtr((z0 - i) / sigma) + (i * i - i) / two_s2
        log_s1 = log_coef + j * log_q + i * log_1mq + special.log_ndtr((j - z0) / sigma) + (j * j - j) / two_s2
        log_s0 = np.where(active, log_s0, -np.inf)
        log_s1 = np.where(active, log_s1, -np.inf)
        positive = coef > 0
        pos0 = np.where(positive, np.logaddexp(pos0, log_s0), pos0)
        pos1 = np.where(positive, np.logaddexp(pos1, log_s1), pos1)
        neg0 = np.where(positive, neg0, np.logaddexp(neg0, log_s0))
        neg1 = np.where(positive, neg1, np.logaddexp(neg1, log_s1))
        i += 1
        done = (i > alpha[0] + 1) & np.all(np.maximum(log_s0, log_s1) < _SERIES_STOP, axis=0)
        active &= ~(done | (coef[0] == 0.0))
        if i > _SERIES_MAX_TERMS:  # pragma: no cover - guarded by the stop rule for σ ≥ 0.1
            raise RuntimeError(f"The sampled-Gaussian series did not converge for sigma={sigma}.")
    with np.errstate(invalid="ignore"):
        a0 = pos0 + np.log(-np.expm1(np.minimum(neg0 - pos0, 0.0)))
        a1 = pos1 + np.log(-np.expm1(np.minimum(neg1 - pos1, 0.0)))
    return np.logaddexp(np.logaddexp(a0, a1), math.log(2.0) + _SERIES_STOP)


def log_a_orders(q: np.ndarray, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log A_α(q) for every q (P,) and order (A,): shape (P, A). See :func:`log_a`."""
    q = np.asarray(q, dtype=float).reshape(-1)
    orders = np.asarray(orders, dtype=float).reshape(-1)
    out = np.empty((q.size, orders.size))
    zero, one = q <= 0.0, q >= 1.0
    mid = ~(zero | one)
    out[zero] = 0.0
    out[one] = orders * (orders - 1.0) / (2.0 * sigma * sigma)
    if np.any(mid):
        integer = orders == np.round(orders)
        for a_idx in np.flatnonzero(integer):
            out[mid, a_idx] = _log_a_int(q[mid], sigma, int(orders[a_idx]))
        if np.any(~integer):
            out[np.ix_(mid, ~integer)] = _log_a_frac(q[mid], sigma, orders[~integer])
    return np.maximum(out, 0.0)


def log_a(q: np.ndarray | float, sigma: float, alpha: float) -> np.ndarray:
    """log A_α(q) of the sampled Gaussian (Mironov et al. 2019), vectorised over q ∈ [0, 1].

    Args:
        q: sampling probabilities in [0, 1] (array or scalar).
        sigma: noise multiplier σ > 0.
        alpha: Rényi order α > 1.

    Returns:
        log A_α(q), same shape as ``q``; ≥ 0. A_α(0) = 1 and A_α(1) = e^{α(α−1)/(2σ²)}.
    """
    q = np.asarray(q, dtype=float)
    return log_a_orders(q.reshape(-1), sigma, np.array([alpha]))[:, 0].reshape(q.shape)


def eq3_gamma(p: np.ndarray, gamma: float, max_degree: int) -> np.ndarray:
    """Γ_ℓ = 1 − (1−γ)^K (1 − p_ℓ) with p_ℓ = ℓk/n (the paper's Eq. 3), computed without cancellation."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return -np.expm1(max_degree * math.log1p(-gamma) + np.log1p(-p)) if gamma < 1.0 else np.ones_like(p)


def eq3_rdp(
    *, num_nodes: int, num_edges: int, max_degree: int, sampling_rate: float, neg_per_pos: int,
    noise_multiplier: float, orders: np.ndarray,
) -> np.ndarray:
    """Per-step RDP of the paper's Eq. 3: ε(α) = 1/(α−1) · log E_{ℓ∼Bin(m,γ)} A_α(Γ_ℓ).

    The expectation over ℓ is an upper bound (see :func:`binomial_plan`); A_α(Γ) is convex in Γ, and Γ is
    affine in p = ℓk/n, so the bucket chords and tail suprema of the plan apply. Integer orders use the
    closed binomial sum; fractional orders the trapezoidal rule of :func:`log_psi_quadrature`.
    """
    plan = binomial_plan(num_edges, sampling_rate, num_nodes, neg_per_pos)
    gam = eq3_gamma(plan.points, sampling_rate, max_degree)
    orders = np.asarray(orders, dtype=float)
    integer = orders == np.round(orders)
    log_f = np.empty((gam.size, orders.size))
    log_f[:, integer] = log_a_orders(gam, noise_multiplier, orders[integer])
    if np.any(~integer):
        # Fractional α: the series converges slowly for Γ near 1 (tail buckets), so integrate instead; the
        # trapezoidal rule on this two-component mixture agrees with the series to ~1e-8 (tests).
        with np.errstate(divide="ignore"):
            log_w = np.stack([np.log1p(-gam), np.log(gam)], axis=1)
        log_f[:, ~integer] = log_psi_quadrature(
            log_w, np.array([0.0, 1.0 / noise_multiplier]), orders[~integer], direction="forward"
        )
    return np.maximum(plan.log_expectation(log_f), 0.0) / (np.asarray(orders) - 1.0)
