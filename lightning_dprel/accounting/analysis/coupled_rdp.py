"""Theorem C.1 with a sensitivity profile: RDP of the coupled sampling of Algorithm 3 (pure functions).

Per step, with ℓ ∼ Bin(m, γ) sampled positives and p = min(1, ℓk/n), the privacy loss of removing one
entity is bounded by the Gaussian mixture

    M_p = Σ_{i=0..K} Σ_{j∈{0,1}} ω_{i,j}(p) · N(Δ(i,j)/C, σ²),
    ω_{i,0} = C(K,i) γ^i (1−γ)^{K−i} (1−p),   ω_{i,1} = C(K,i) γ^i (1−γ)^{K−i} p,

against N(0, σ²), in both directions (Theorem C.1 of the paper, for any profile Δ with Δ(0,0) = 0):

    ε(α) = 1/(α−1) · log max{ E_ℓ Ψ_α(M_p ‖ N(0,σ²)),  E_ℓ Ψ_α(N(0,σ²) ‖ M_p) }.

We integrate in u = x/σ (so u ∼ N(0,1) under the null and component c has mean ν_c = Δ_c/(Cσ)):
Ψ_fwd = ∫ φ(u) R(u)^α du and Ψ_rev = ∫ φ(u) R(u)^{1−α} du with the likelihood ratio
R(u) = Σ_c ω_c exp(u ν_c − ν_c²/2).

Numerics (trapezoidal rule on uniform grids, everything in log space):

* forward, integer α: φ·R^α is a positive combination of unit-variance Gaussians centred in
  [α ν_min, α ν_max] (the polynomial form of Theorem C.1). On the grid [−12, α ν_max + 12] with step
  h = 3/4 the trapezoidal sum of each Gaussian is exact up to a relative 2Σ_k e^{−2π²k²/h²} < 2·10^{−15}
  (Poisson summation) and truncation loses < 2Q(12) < 4·10^{−33}: exact to double precision.
  :func:`log_psi_forward_exact` evaluates the polynomial itself (tests compare the two).
* forward, fractional α: the same window with step h = min(1/4, 1/(ν_max − ν_min)). The integrand is
  analytic in the strip |Im u| < π/(ν_max − ν_min) (R has no zero there), so the trapezoidal error
  decays like exp(−2π²/(h·(ν_max − ν_min))) ≤ e^{−19.7} relative to the part of the integrand that
  varies on the 1/ν scale; tests check against mpmath and against halving h.
* reverse: log(φ R^{1−α}) is concave with second derivative ≤ −1 (log R is convex), so it has one
  mode u*, found by bisection (to ±1/4), and the integrand beyond u* ± 12 is below e^{−72} of its peak.
  The window u* ± 12¼ with step h = min(1/10, 1/(2(ν_max − ν_min))) is used per (p, α); same error
  analysis as the fractional forward direction.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from lightning_dprel.accounting.analysis.binomial import binomial_plan

__all__ = [
    "mixture_log_weights",
    "log_psi_quadrature",
    "log_psi_forward_exact",
    "coupled_rdp",
]

_L = 12.0
_H_INT = 0.75
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Fast log-sum-exp along ``axis`` (no array-API dispatch); −inf rows stay −inf."""
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore", divide="ignore"):
        return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def mixture_log_weights(max_degree: int, gamma: float, p: np.ndarray) -> np.ndarray:
    """log ω_{i,j}(p) of Theorem C.1, shape (P, 2(K+1)), component c = 2i + j."""
    p = np.clip(np.asarray(p, dtype=float).reshape(-1), 0.0, 1.0)
    i = np.arange(max_degree + 1, dtype=float)
    log_b = (
        special.gammaln(max_degree + 1) - special.gammaln(i + 1) - special.gammaln(max_degree - i + 1)
        + special.xlogy(i, gamma) + special.xlog1py(max_degree - i, -gamma)
    )
    with np.errstate(divide="ignore"):
        log_1mp, log_p = np.log1p(-p), np.log(p)
    out = np.empty((p.size, 2 * (max_degree + 1)))
    out[:, 0::2] = log_b[None, :] + log_1mp[:, None]
    out[:, 1::2] = log_b[None, :] + log_p[:, None]
    return out


def _merge(log_w: np.ndarray, nu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge components with equal means and drop those with zero weight everywhere."""
    uniq = np.unique(nu)
    merged = np.stack([special.logsumexp(log_w[:, nu == v], axis=1) for v in uniq], axis=1)
    keep = np.any(np.isfinite(merged), axis=0)
    return merged[:, keep], uniq[keep]


def _log_ratio(u: np.ndarray, log_w: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """log R(u) = log Σ_c ω_c exp(u ν_c − ν_c²/2) for a grid ``u`` (G,) and weights (P, C): shape (P, G)."""
    terms = log_w[:, :, None] + (u[None, None, :] * nu[None, :, None] - 0.5 * nu[None, :, None] ** 2)
    top = terms.max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore"):
        return top + np.log(np.exp(terms - top[:, None, :]).sum(axis=1))


def _forward(log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, h: float) -> np.ndarray:
    nu_max = float(nu.max())
    top = math.ceil(float(orders.max())) * nu_max + _L
    u = np.arange(-_L, top + h, h)
    out = np.empty((log_w.shape[0], orders.size))
    ends = np.searchsorted(u, np.ceil(orders) * nu_max + _L, side="right")
    chunk = max(1, 2_000_000 // max(1, u.size * nu.size))
    for r0 in range(0, log_w.shape[0], chunk):  # bound the memory of the (P, C, G) temporaries
        log_r = _log_ratio(u, log_w[r0 : r0 + chunk], nu)
        log_phi = -0.5 * u * u - _LOG_SQRT_2PI + math.log(h)
        for a_idx, alpha in enumerate(orders):
            n_pts = int(ends[a_idx])
            out[r0 : r0 + chunk, a_idx] = _lse(alpha * log_r[:, :n_pts] + log_phi[:n_pts], axis=1)
    return out


def _reverse_modes(log_w: np.ndarray, nu: np.ndarray, lam: np.ndarray, tol: float) -> np.ndarray:
    """Mode of g(u) = λ log R(u) − u²/2 (λ = 1−α < 0) per (p, α), to ±tol, by bisection on g'."""
    nu_min, nu_max = float(nu.min()), float(nu.max())
    lo = np.broadcast_to(lam * nu_max - 1.0, (log_w.shape[0], lam.size)).copy()
    hi = np.broadcast_to(lam * nu_min + 1.0, lo.shape).copy()
    n_iter = max(1, math.ceil(math.log2(max(2.0, float(np.max(hi - lo)) / tol))))
    w3 = log_w[:, None, :]
    for _ in range(n_iter):  # g'(u) = −u + λ·E_post[ν] is strictly decreasing
        mid = 0.5 * (lo + hi)
        post_mean = np.sum(special.softmax(w3 + mid[..., None] * nu, axis=-1) * nu, axis=-1)
        pos = (-mid + lam * post_mean) > 0.0
        lo = np.where(pos, mid, lo)
        hi = np.where(pos, hi, mid)
    return 0.5 * (lo + hi)


def _reverse(log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, h: float) -> np.ndarray:
    lam = 1.0 - orders
    modes = _reverse_modes(log_w, nu, lam, tol=0.25)
    half = math.ceil((_L + 0.25) / h)
    offsets = np.arange(-half, half + 1)
    out = np.empty((log_w.shape[0], orders.size))
    for r in range(log_w.shape[0]):  # a window of ±(12 + 1/4) around each mode, on the grid hℤ
        start = math.floor(modes[r].min() / h) - half
        stop = math.ceil(modes[r].max() / h) + half
        centre = np.round(modes[r] / h).astype(np.int64)[:, None]
        if stop - start + 1 <= offsets.size * orders.size:  # modes close together: one shared grid
            u = np.arange(start, stop + 1) * h
            log_r = _log_ratio(u, log_w[r : r + 1], nu)[0]
            idx = centre - start + offsets  # (A, W)
            uu, lr = u[idx], log_r[idx]
        else:  # modes far apart (tiny σ, large α): evaluate each window directly, memory O(A·W)
            uu = (centre + offsets) * h
            lr = _log_ratio(uu.reshape(-1), log_w[r : r + 1], nu)[0].reshape(uu.shape)
        out[r] = _lse(lam[:, None] * lr - 0.5 * uu * uu, axis=1)
    return out - _LOG_SQRT_2PI + math.log(h)


def log_psi_quadrature(
    log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, *, direction: str, step_scale: float = 1.0
) -> np.ndarray:
    """log Ψ_α of the mixture R against N(0,1) by the trapezoidal rule (see the module docstring).

    Args:
        log_w: (P, C) log mixture weights (each row sums to 1).
        nu: (C,) component means in noise-std units (Δ/(Cσ)), ≥ 0.
        orders: (A,) Rényi orders > 1.
        direction: ``"forward"`` for Ψ_α(M‖N) or ``"reverse"`` for Ψ_α(N‖M).
        step_scale: multiply every grid step by this factor (tests use 1/2 to check convergence).

    Returns:
        (P, A) array of log Ψ_α.
    """
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    orders = np.asarray(orders, dtype=float).reshape(-1)
    log_w, nu = _merge(log_w, np.asarray(nu, dtype=float).reshape(-1))
    span = float(nu.max() - nu.min())
    if span == 0.0:  # a single shifted Gaussian: Ψ_α = exp(α(α−1)ν²/2) in both directions
        val = orders * (orders - 1.0) * 0.5 * float(nu[0]) ** 2
        return np.broadcast_to(val, (log_w.shape[0], orders.size)).copy()
    out = np.empty((log_w.shape[0], orders.size))
    if direction == "forward":
        integer = orders == np.round(orders)
        if np.any(integer):
            out[:, integer] = _forward(log_w, nu, orders[integer], _H_INT * step_scale)
        if np.any(~integer):
            h = min(0.25, 1.0 / span) * step_scale
            out[:, ~integer] = _forward(log_w, nu, orders[~integer], h)
    elif direction == "reverse":
        h = min(0.1, 0.5 / span) * step_scale
        out[:] = _reverse(log_w, nu, orders, h)
    else:
        raise ValueError(f"`direction` must be 'forward' or 'reverse', got {direction!r}.")
    return out


def log_psi_forward_exact(log_w: np.ndarray, delta: np.ndarray, sigma: float, alpha: int) -> float:
    """Theorem C.1's exact forward term for integer α: log Ψ_α(Σ_c w_c N(Δ_c, σ²) ‖ N(0, σ²)).

    With means on the grid Δ_c = s_c/4 (every profile of this package) and z = e^{x/(4σ²)}, the likelihood
    ratio is the polynomial Σ_c w_c e^{−Δ_c²/(2σ²)} z^{s_c}; its α-th power is expanded in log space
    (log-sum-exp convolutions, all coefficients positive) and E_{N(0,σ²)}[z^s] = exp(s²/(32σ²)).

    Args:
        log_w: (C,) log weights. delta: (C,) means, multiples of 1/4. sigma: σ > 0. alpha: integer ≥ 2.
    """
    log_w = np.asarray(log_w, dtype=float).reshape(-1)
    delta = np.asarray(delta, dtype=float).reshape(-1)
    s = np.round(4.0 * delta).astype(int)
    if not np.allclose(s, 4.0 * delta, atol=1e-12, rtol=0.0) or np.any(s < 0):
        raise ValueError(f"`delta` must be non-negative multiples of 1/4, got {delta.tolist()}.")
    keep = np.isfinite(log_w)
    log_c, s = log_w[keep] - delta[keep] ** 2 / (2.0 * sigma**2), s[keep]
    poly = np.array([0.0])  # log-coefficients of the running power, exponent 0..deg
    for _ in range(int(alpha)):
        new = np.full(poly.size + s.max(), -np.inf)
        for lc, sc in zip(log_c, s):
            new[sc : sc + poly.size] = np.logaddexp(new[sc : sc + poly.size], poly + lc)
        poly = new
    expo = np.arange(poly.size, dtype=float)
    return float(special.logsumexp(poly + expo**2 / (32.0 * sigma**2)))


def coupled_rdp(
    profile: np.ndarray, *, num_nodes: int, num_edges: int, max_degree: int, sampling_rate: float,
    neg_per_pos: int, noise_multiplier: float, orders: np.ndarray,
) -> np.ndarray:
    """Per-step RDP ε(α) of the coupled sampling with sensitivity profile Δ(i, j)/C (Theorem C.1 generalised).

    Args:
        profile: (K+1, 2) array of Δ(i, j)/C with profile[0, 0] = 0.
        num_nodes, num_edges, max_degree, sampling_rate, neg_per_pos: n, m, K, γ, k of Algorithm 3.
        noise_multiplier: σ > 0.
        orders: (A,) orders > 1.

    Returns:
        (A,) upper bounds on the per-step RDP, maximum of the forward and reverse directions.
    """
    profile = np.asarray(profile, dtype=float)
    plan = binomial_plan(num_edges, sampling_rate, num_nodes, neg_per_pos)
    log_w = mixture_log_weights(max_degree, sampling_rate, plan.points)
    nu = profile.reshape(-1) / noise_multiplier
    orders = np.asarray(orders, dtype=float)
    fwd = plan.log_expectation(log_psi_quadrature(log_w, nu, orders, direction="forward"))
    rev = plan.log_expectation(log_psi_quadrature(log_w, nu, orders, direction="reverse"))
    return np.maximum(np.maximum(fwd, rev), 0.0) / (orders - 1.0)
