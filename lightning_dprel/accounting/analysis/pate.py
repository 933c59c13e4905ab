"""RDP of Confident-GNMax (Papernot et al. 2018, "Scalable Private Learning with PATE"; DP-GPL Alg. 2, step 4).

Data-independent: the threshold step releases the max count (sensitivity 1) with N(0, σ₁²), α/(2σ₁²) per query;
GNMax releases the histogram (ℓ₂ sensitivity √2) with N(0, σ₂²), α/σ₂² per answered query (Prop. 8).
Data-dependent (``accounting: paper``): Thm 6 with the conditions of Prop. 10, the analysis of tensorflow/privacy
``research/pate_2018/core.py``, vectorised over queries and orders. A data-dependent value is a function of the
private votes: it must not be released without a smooth-sensitivity mechanism (PATE 2018, Sec. 4.2).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import optimize, special, stats

from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.orders import as_orders

__all__ = [
    "rdp_threshold_independent",
    "rdp_gnmax_independent",
    "pate_independent_rdp",
    "log_q_gnmax",
    "rdp_gnmax_data_dependent",
    "log_pr_answered",
    "rdp_threshold_data_dependent",
    "pate_data_dependent_rdp",
    "epsilon_from_rdp",
    "rho_for_epsilon",
    "sigma_for_epsilon",
]


def _sigma(name: str, sigma: float) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)) or not 0 < sigma < math.inf:
        raise ValueError(f"`{name}` must be a finite noise scale > 0, got {sigma!r}.")
    return float(sigma)


def _count(name: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"`{name}` must be an int >= 0, got {n!r}.")
    return int(n)


def _counts(counts: object, *, two_d: bool = False) -> np.ndarray:
    c = np.asarray(counts, dtype=float)
    if c.ndim != 2 and (two_d or c.ndim != 1):
        raise ValueError(f"`counts` must be 2-D [queries, classes]{'' if two_d else ' (or one histogram [classes])'}, "
                         f"got shape {c.shape}.")
    if c.shape[-1] < 2 or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError(f"`counts` must hold finite vote counts >= 0 over >= 2 classes, got shape {c.shape}.")
    return c


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 − eˣ) for x ≤ 0 (−inf at 0), stable on both sides of −1."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x < -1.0, np.log1p(-np.exp(np.minimum(x, -1.0))), np.log(-np.expm1(np.minimum(x, 0.0))))


# --- data-independent --------------------------------------------------------------------------------------
def rdp_threshold_independent(sigma1: float, orders: object = None) -> np.ndarray:
    """Threshold step (max count, sensitivity 1): α/(2σ₁²) (Prop. 8 at stability 1; pate_2018 core.py)."""
    return as_orders(orders) / (2.0 * _sigma("sigma1", sigma1) ** 2)


def rdp_gnmax_independent(sigma2: float, orders: object = None) -> np.ndarray:
    """GNMax (histogram, ℓ₂ sensitivity √2): α/σ₂² (Prop. 8; ``rdp_data_independent_gaussian``)."""
    return as_orders(orders) / _sigma("sigma2", sigma2) ** 2


def pate_independent_rdp(sigma1: float, sigma2: float, queries: int, orders: object = None,
                         answered: int | None = None) -> np.ndarray:
    """Confident-GNMax, ``queries`` asked, ``answered`` (default all) answered: Q·α/(2σ₁²) + A·α/σ₂² (Prop. 8)."""
    q = _count("queries", queries)
    a = q if answered is None else _count("answered", answered)
    if a > q:
        raise ValueError(f"`answered` ({a}) cannot exceed `queries` ({q}).")
    return q * rdp_threshold_independent(sigma1, orders) + a * rdp_gnmax_independent(sigma2, orders)


# --- data-dependent (PATE 2018) ------------------------------------------------------------------------------
def log_q_gnmax(counts: object, sigma2: float) -> np.ndarray:
    """Upper bound on log Pr[GNMax ≠ argmax] per histogram: union bound, capped at log(1 − 1/C) (Prop. 7)."""
    c = _counts(counts)
    s = _sigma("sigma2", sigma2)
    top = np.argmax(c, axis=-1)
    terms = stats.norm.logsf(c.max(axis=-1, keepdims=True) - c, scale=math.sqrt(2.0) * s)
    np.put_along_axis(terms, top[..., None], -np.inf, axis=-1)  # the argmax itself is not an error
    return np.minimum(special.logsumexp(terms, axis=-1), math.log1p(-1.0 / c.shape[-1]))


def rdp_gnmax_data_dependent(logq: object, sigma2: float, orders: object = None) -> np.ndarray:
    """GNMax RDP given log q (Thm 6, higher orders of Prop. 10; ``rdp_gaussian``); α/σ₂² where it does not apply.

    ``logq`` of shape (...) gives RDP of shape (..., A).
    """
    lq = np.asarray(logq, dtype=float)[..., None]
    if np.any(np.isnan(lq)) or np.any(lq > 0):
        raise ValueError("`logq` must be log-probabilities <= 0.")
    a = as_orders(orders)
    var = _sigma("sigma2", sigma2) ** 2
    ind = np.broadcast_to(a / var, lq.shape[:-1] + a.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = np.sqrt(var * -lq)
        mu1 = mu2 + 1.0
        hi1, hi2 = mu1 / var, mu2 / var
        ok = (mu2 > 1.0) & np.isfinite(lq)
        # q must lie where the bound increases in q and A is positive (Prop. 10)
        cond = ok & (lq <= (mu2 - 1.0) * hi2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0))))
        cond &= -lq > hi2
        use = cond & (mu1 > a)
        lq_s = np.where(cond, lq, -1.0)  # safe values where the bound is not used
        hi2_s, mu2_s = np.where(cond, hi2, 0.5), np.where(cond, mu2, 2.0)
        log1q = _log1mexp(lq_s)
        log_a = (a - 1.0) * (log1q - _log1mexp((lq_s + hi2_s) * (1.0 - 1.0 / mu2_s)))
        log_b = (a - 1.0) * (np.where(cond, hi1, 0.0) - lq_s / np.where(cond, mu1 - 1.0, 1.0))
        dep = np.logaddexp(log1q + log_a, lq_s + log_b) / (a - 1.0)
    out = np.where(use, np.minimum(ind, dep), ind)
    return np.where(np.isneginf(lq), 0.0, out)  # a fixed output is 0-RDP


def log_pr_answered(threshold: float, sigma1: float, counts: object) -> np.ndarray:
    """log Pr[round(max count) + N(0, σ₁²) ≥ T] per histogram (Alg. 1, step 1)."""
    c = _counts(counts)
    if not np.isfinite(threshold):
        raise ValueError(f"`threshold` must be finite, got {threshold!r}.")
    return stats.norm.logsf(float(threshold) - np.round(c.max(axis=-1)), scale=_sigma("sigma1", sigma1))


def rdp_threshold_data_dependent(log_pr: object, sigma1: float, orders: object = None) -> np.ndarray:
    """Threshold-step RDP: Thm 6 at q = min(p, 1 − p), noise √2·σ₁ for stability 1 (``compute_rdp_threshold``)."""
    lp = np.asarray(log_pr, dtype=float)
    if np.any(np.isnan(lp)) or np.any(lp > 0):
        raise ValueError("`log_pr` must be log-probabilities <= 0.")
    return rdp_gnmax_data_dependent(np.minimum(lp, _log1mexp(lp)), math.sqrt(2.0) * _sigma("sigma1", sigma1), orders)


def pate_data_dependent_rdp(counts: object, threshold: float, sigma1: float, sigma2: float, orders: object = None,
                            answered: object = None) -> np.ndarray:
    """Data-dependent RDP of Confident-GNMax on counts [Q, C]: the threshold cost on every query plus the GNMax cost
    on the answered ones (``answered`` mask [Q]; default all), summed as in ``ICLR2018/rdp_cumulative.py``. Private."""
    c = _counts(counts, two_d=True)
    mask = np.ones(c.shape[0], bool) if answered is None else np.asarray(answered)
    if mask.shape != (c.shape[0],) or mask.dtype != bool:
        raise ValueError(f"`answered` must be a boolean mask of shape ({c.shape[0]},), got {mask.dtype} {mask.shape}.")
    thr = rdp_threshold_data_dependent(log_pr_answered(threshold, sigma1, c), sigma1, orders)
    gnmax = rdp_gnmax_data_dependent(log_q_gnmax(c[mask], sigma2), sigma2, orders)
    return thr.sum(axis=0) + gnmax.sum(axis=0)


# --- conversion and sizing -----------------------------------------------------------------------------------
def epsilon_from_rdp(rdp: object, orders: object, delta: float) -> float:
    """ε at δ of an RDP curve by the library's conversion (Balle et al. 2020, Thm 21; :func:`rdp_to_epsilon`)."""
    return rdp_to_epsilon(as_orders(orders), np.asarray(rdp, dtype=float), delta)[0]


def rho_for_epsilon(epsilon: float, delta: float, orders: object = None) -> float:
    """ρ with ε(α·ρ, δ) = ``epsilon``: the budget of any composition of Gaussian releases (RDP α·Σ 1/(2σ_i²)·C_i²)."""
    if not (0.0 < float(epsilon) < math.inf):
        raise ValueError(f"`epsilon` must be finite and > 0, got {epsilon!r}.")
    a = as_orders(orders)

    def gap(log_rho: float) -> float:
        return epsilon_from_rdp(a * math.exp(log_rho), a, delta) - float(epsilon)

    lo, hi = -5.0, 1.0
    while gap(hi) <= 0:
        lo, hi = hi, hi + 2.0
    while gap(lo) > 0:
        lo, hi = lo - 2.0, lo
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-12, rtol=1e-12))


def rho_for_releases(epsilon: float, delta: float, releases: "Callable[[float], Sequence[tuple[float, int]]]", *,
                     accountant: str = "pld", rtol: float = 1e-7) -> float:
    """The largest ρ (to ``rtol``) whose Gaussian releases ``releases(ρ)`` — (σ, count) pairs of sensitivity-1 releases
    — spend ≤ ``epsilon`` at ``delta`` by the :class:`~lightning_dprel.accounting.Accountant`'s reported bound (the
    smaller of PLD and RDP). :func:`rho_for_epsilon` (RDP) is the start: the tight bound can only allow more."""
    from lightning_dprel.accounting.accountant import Accountant

    def eps(rho: float) -> float:
        acc = Accountant("gaussian", accountant=accountant)
        for sigma, count in releases(rho):
            acc.step(None, sigma, int(count), mechanism="gaussian")
        return acc.get_epsilon(delta)

    lo = rho_for_epsilon(epsilon, delta)
    if accountant == "rdp" or eps(lo) > epsilon:  # RDP's ρ already is the answer (or rounding put it a hair above)
        return lo
    hi = lo * 1.25
    while eps(hi) <= epsilon:
        lo, hi = hi, hi * 1.25
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) <= epsilon else (lo, mid)
    return lo


def sigma_for_epsilon(epsilon: float, delta: float, queries: int, orders: object = None) -> float:
    """σ = σ₁ = σ₂ with ε(Q·3α/(2σ²), δ) = ``epsilon``: every query answered, data-independent (Prop. 8)."""
    if _count("queries", queries) < 1:
        raise ValueError("`queries` must be >= 1.")
    return math.sqrt(1.5 * int(queries) / rho_for_epsilon(epsilon, delta, orders))
