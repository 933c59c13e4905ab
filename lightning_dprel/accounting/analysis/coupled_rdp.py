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

Large K (head and tail). The quadrature costs grow like K²·α_max (K components on a grid reaching α·ν_max),
so only the rows i ≤ I = min(K, ``head_rows``) (default :data:`HEAD_ROWS`) go through it; the rows i > I
(the "tail", total binomial mass τ = P(Bin(K, γ) > I)) are bounded in closed form. Write
R = R_H + (1−p)·R_{T,0} + p·R_{T,1} with R_H the head rows (weights not renormalised) and
R_{T,j} = Σ_{i>I} b_i L_{ij}, b_i = C(K,i)γ^i(1−γ)^{K−i}, L_c(u) = exp(uν_c − ν_c²/2). Then, in L^α(N(0,1)):

* forward, by Minkowski: ‖R‖_α ≤ ‖R_H‖_α + (1−p)‖R_{T,0}‖_α + p‖R_{T,1}‖_α, and for each j both
  ‖R_{T,j}‖_α ≤ Σ_{i>I} b_i ‖L_{ij}‖_α = Σ_{i>I} b_i e^{(α−1)ν_{ij}²/2}   (Minkowski again), and
  ‖R_{T,j}‖_α^α ≤ τ^{α−1} Σ_{i>I} b_i e^{α(α−1)ν_{ij}²/2}                (Jensen, t ↦ t^α convex),
  since E_N[L_c^α] = e^{α(α−1)ν_c²/2} exactly; the smaller of the two is used. Ψ_fwd = ‖R‖_α^α.
* reverse: R ≥ R_H pointwise and t ↦ t^{1−α} is decreasing, so Ψ_rev = E_N[R^{1−α}] ≤ E_N[R_H^{1−α}].

Both are exact when I = K (no tail), and both stay convex in p (a norm of an affine function of p plus an
affine function, raised to the power α; resp. a convex decreasing function of an affine one), which the
binomial plan requires. The tail sums cost O(min(K − I, 4096) + 256·log(K/4096)) per order: beyond 4096
tail rows, rows are grouped in buckets [a, b] with b ≤ a(1 + 1/256), each charged
(b − a + 1)·max_{i∈[a,b]} b_i · max_{i∈[a,b]} e^{cν_i²} (the pmf is unimodal, so its maximum on a bucket is
at the mode or an end) — again an upper bound. Neither step needs the profile to be monotone in i.

How tight: for K ≤ I it is the full quadrature. Above, the bound is never below the full
quadrature (up to its own ~1e-11 accuracy) and loses only at orders where head and tail are comparable
(there Minkowski costs up to a factor 2^α in Ψ). Measured at K ∈ {40, 48} over 22 settings each
(γ ∈ [10⁻³, 0.2], σ ∈ [1, 15], k ∈ {0, 1, 4}, both profiles, δ = 10⁻⁵): from T = 100 steps on, ε is within
4·10⁻⁴ of the full quadrature (median 0); for T ≤ 10 steps, where orders 2-5 set ε, up to 8 % above (median
< 10⁻⁶). When the tail dominates (huge K), one component dominates it, and per-component Minkowski is tight
there: at K = 10⁶ the RDP is within 10⁻³ of the single-component lower bound (tests check both).

Both directions use the structure ω(p) = (1−p)·b ⊕ p·b: log R_p = log((1−p)R_0 + p R_1), with the basis
ratios R_0, R_1 computed once per grid instead of once per binomial point p (same values to rounding).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from lightning_dprel.accounting.analysis.binomial import binomial_plan

__all__ = [
    "HEAD_ROWS",
    "log_binomial_pmf",
    "log_tail_norms",
    "mixture_log_weights",
    "log_psi_quadrature",
    "log_psi_forward_exact",
    "coupled_rdp",
]

#: Rows i ≤ HEAD_ROWS of the mixture are integrated numerically; the rows above are bounded in closed form.
HEAD_ROWS = 32
_TAIL_EXACT = 4096  # tail rows summed one by one before bucketing
_TAIL_RATIO = 1.0 / 256.0  # relative width of the tail buckets beyond them

_L = 12.0
_H_INT = 0.75
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Fast log-sum-exp along ``axis`` (no array-API dispatch); −inf rows stay −inf."""
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore", divide="ignore"):
        return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def log_binomial_pmf(max_degree: int, gamma: float, i: np.ndarray) -> np.ndarray:
    """log C(K, i) γ^i (1−γ)^{K−i} for integer ``i`` in [0, K] (−inf where the mass is 0)."""
    i = np.asarray(i, dtype=float)
    return (
        special.gammaln(max_degree + 1) - special.gammaln(i + 1) - special.gammaln(max_degree - i + 1)
        + special.xlogy(i, gamma) + special.xlog1py(max_degree - i, -gamma)
    )


def mixture_log_weights(max_degree: int, gamma: float, p: np.ndarray) -> np.ndarray:
    """log ω_{i,j}(p) of Theorem C.1, shape (P, 2(K+1)), component c = 2i + j."""
    p = np.clip(np.asarray(p, dtype=float).reshape(-1), 0.0, 1.0)
    log_b = log_binomial_pmf(max_degree, gamma, np.arange(max_degree + 1, dtype=float))
    with np.errstate(divide="ignore"):
        log_1mp, log_p = np.log1p(-p), np.log(p)
    out = np.empty((p.size, 2 * (max_degree + 1)))
    out[:, 0::2] = log_b[None, :] + log_1mp[:, None]
    out[:, 1::2] = log_b[None, :] + log_p[:, None]
    return out


def _tail_rows(nu: np.ndarray, max_degree: int, gamma: float, head: int) -> tuple[np.ndarray, np.ndarray]:
    """(log mass bound, max ν² per j) of the tail rows i > ``head``: one entry per row, then per bucket.

    Every row i ∈ (head, K] is covered exactly once; an entry's log mass is ≥ log Σ_{i in it} b_i and its
    ν² ≥ ν_{ij}² for every row in it (see the module docstring), so sums over entries bound the tail sums.
    """
    stop = min(max_degree, head + _TAIL_EXACT)
    rows = np.arange(head + 1, stop + 1)
    log_mass = log_binomial_pmf(max_degree, gamma, rows)
    nu2 = nu[head + 1 : stop + 1] ** 2
    if stop < max_degree:
        edges = [stop + 1]
        while edges[-1] <= max_degree:
            edges.append(max(edges[-1] + 1, math.ceil(edges[-1] * (1.0 + _TAIL_RATIO))))
        a = np.array(edges[:-1], dtype=np.int64)
        b = np.minimum(np.array(edges[1:], dtype=np.int64), max_degree + 1) - 1
        mode = min(max_degree, math.floor((max_degree + 1) * gamma))  # the pmf increases up to it, then decreases
        peak = np.clip(mode, a, b)
        log_mass = np.concatenate([log_mass, np.log((b - a + 1).astype(float)) + log_binomial_pmf(max_degree, gamma, peak)])
        nu2 = np.concatenate([nu2, np.maximum.reduceat(nu[stop + 1 :] ** 2, a - (stop + 1), axis=0)])
    return log_mass, nu2


def log_tail_norms(
    nu: np.ndarray, max_degree: int, gamma: float, head: int, orders: np.ndarray
) -> np.ndarray:
    """Upper bounds on log ‖R_{T,j}‖_α in L^α(N(0,1)), shape (A, 2) (−inf when head ≥ K).

    Args:
        nu: (K+1, 2) component means ν_{ij} (profile / σ).
        max_degree: K. gamma: γ. head: I, the last row integrated numerically.
        orders: (A,) orders > 1.
    """
    orders = np.asarray(orders, dtype=float).reshape(-1)
    out = np.full((orders.size, 2), -np.inf)
    if head >= max_degree:
        return out
    log_mass, nu2 = _tail_rows(np.asarray(nu, dtype=float), max_degree, gamma, head)
    log_tau = min(0.0, float(special.logsumexp(log_mass)))
    am1 = orders - 1.0
    for j in range(2):
        # Minkowski: Σ b_i e^{(α−1)ν²/2};  Jensen: (τ^{α−1} Σ b_i e^{α(α−1)ν²/2})^{1/α}.
        mink = _lse(log_mass[None, :] + 0.5 * am1[:, None] * nu2[None, :, j], axis=1)
        jens = (am1 * log_tau + _lse(log_mass[None, :] + 0.5 * (orders * am1)[:, None] * nu2[None, :, j], axis=1)) / orders
        out[:, j] = np.minimum(mink, jens)
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


def _chunked_log_ratio(u: np.ndarray, log_w: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """:func:`_log_ratio` in slices of the grid, bounding the memory of the (rows, C, G) temporaries."""
    out = np.empty((log_w.shape[0], u.size))
    step = max(1, 2_000_000 // max(1, log_w.shape[0] * nu.size))
    for g0 in range(0, u.size, step):
        out[:, g0 : g0 + step] = _log_ratio(u[g0 : g0 + step], log_w, nu)
    return out


def _forward(
    log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, h: float, log_coef: np.ndarray | None = None
) -> np.ndarray:
    nu_max = float(nu.max())
    top = math.ceil(float(orders.max())) * nu_max + _L
    u = np.arange(-_L, top + h, h)
    rows = log_w.shape[0] if log_coef is None else log_coef.shape[0]
    out = np.empty((rows, orders.size))
    ends = np.searchsorted(u, np.ceil(orders) * nu_max + _L, side="right")
    log_phi = -0.5 * u * u - _LOG_SQRT_2PI + math.log(h)
    # With a basis, log R_p = log Σ_r coef_{p,r} R_r: the (r, C, G) work is done once, not once per p.
    basis_lr = None if log_coef is None else _chunked_log_ratio(u, log_w, nu)
    chunk = max(1, 2_000_000 // max(1, u.size * (nu.size if log_coef is None else log_coef.shape[1])))
    for r0 in range(0, rows, chunk):  # bound the memory of the (P, C, G) temporaries
        if basis_lr is None:
            log_r = _log_ratio(u, log_w[r0 : r0 + chunk], nu)
        else:
            log_r = _lse(log_coef[r0 : r0 + chunk, :, None] + basis_lr[None, :, :], axis=1)
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


_SHARED_GRID_MAX = 1 << 21  # reverse direction: largest grid of basis ratios shared by every p


def _reverse(
    log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, h: float, log_coef: np.ndarray | None = None
) -> np.ndarray:
    lam = 1.0 - orders
    full = log_w if log_coef is None else _lse(log_coef[:, :, None] + log_w[None, :, :], axis=1)
    modes = _reverse_modes(full, nu, lam, tol=0.25)
    half = math.ceil((_L + 0.25) / h)
    offsets = np.arange(-half, half + 1)
    out = np.empty((full.shape[0], orders.size))
    starts = np.floor(modes.min(axis=1) / h).astype(np.int64) - half
    stops = np.ceil(modes.max(axis=1) / h).astype(np.int64) + half
    g0 = int(starts.min())
    shared = None
    if log_coef is not None and int(stops.max()) - g0 + 1 <= _SHARED_GRID_MAX:
        # Basis ratios on one grid covering every p's windows; each p then combines its two coefficients.
        shared = _chunked_log_ratio(np.arange(g0, int(stops.max()) + 1) * h, log_w, nu)
    for r in range(full.shape[0]):  # a window of ±(12 + 1/4) around each mode, on the grid hℤ
        start, stop = int(starts[r]), int(stops[r])
        centre = np.round(modes[r] / h).astype(np.int64)[:, None]
        if shared is not None and stop - start + 1 <= offsets.size * orders.size:
            u = np.arange(start, stop + 1) * h
            log_r = _lse(log_coef[r][:, None] + shared[:, start - g0 : stop - g0 + 1], axis=0)
            idx = centre - start + offsets  # (A, W)
            uu, lr = u[idx], log_r[idx]
        elif stop - start + 1 <= offsets.size * orders.size:  # modes close together: one shared grid
            u = np.arange(start, stop + 1) * h
            log_r = _log_ratio(u, full[r : r + 1], nu)[0]
            idx = centre - start + offsets  # (A, W)
            uu, lr = u[idx], log_r[idx]
        else:  # modes far apart (tiny σ, large α): evaluate each window directly, memory O(A·W)
            uu = (centre + offsets) * h
            lr = _log_ratio(uu.reshape(-1), full[r : r + 1], nu)[0].reshape(uu.shape)
        out[r] = _lse(lam[:, None] * lr - 0.5 * uu * uu, axis=1)
    return out - _LOG_SQRT_2PI + math.log(h)


def log_psi_quadrature(
    log_w: np.ndarray, nu: np.ndarray, orders: np.ndarray, *, direction: str, step_scale: float = 1.0,
    log_coef: np.ndarray | None = None,
) -> np.ndarray:
    """log Ψ_α of the mixture R against N(0,1) by the trapezoidal rule (see the module docstring).

    Args:
        log_w: (P, C) log mixture weights (each row sums to 1).
        nu: (C,) component means in noise-std units (Δ/(Cσ)), ≥ 0.
        orders: (A,) Rényi orders > 1.
        direction: ``"forward"`` for Ψ_α(M‖N) or ``"reverse"`` for Ψ_α(N‖M).
        step_scale: multiply every grid step by this factor (tests use 1/2 to check convergence).
        log_coef: optional (P, r) log coefficients; then ``log_w`` is an (r, C) basis and row p's mixture is
            Σ_r e^{log_coef[p, r]} · basis_r (same result; the mixture ratios cost r/P of the work).

    Returns:
        (P, A) array of log Ψ_α.
    """
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    orders = np.asarray(orders, dtype=float).reshape(-1)
    log_w, nu = _merge(log_w, np.asarray(nu, dtype=float).reshape(-1))
    if log_coef is not None:
        log_coef = np.atleast_2d(np.asarray(log_coef, dtype=float))
        if log_coef.shape[1] != log_w.shape[0]:
            raise ValueError(f"`log_coef` must have one column per basis row ({log_w.shape[0]}), got {log_coef.shape}.")
    rows = log_w.shape[0] if log_coef is None else log_coef.shape[0]
    span = float(nu.max() - nu.min())
    if span == 0.0:  # a single shifted Gaussian: Ψ_α = exp(α(α−1)ν²/2) in both directions
        val = orders * (orders - 1.0) * 0.5 * float(nu[0]) ** 2
        return np.broadcast_to(val, (rows, orders.size)).copy()
    out = np.empty((rows, orders.size))
    if direction == "forward":
        integer = orders == np.round(orders)
        if np.any(integer):
            out[:, integer] = _forward(log_w, nu, orders[integer], _H_INT * step_scale, log_coef)
        if np.any(~integer):
            h = min(0.25, 1.0 / span) * step_scale
            out[:, ~integer] = _forward(log_w, nu, orders[~integer], h, log_coef)
    elif direction == "reverse":
        h = min(0.1, 0.5 / span) * step_scale
        out[:] = _reverse(log_w, nu, orders, h, log_coef)
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
    neg_per_pos: int, noise_multiplier: float, orders: np.ndarray, head_rows: int | None = None,
) -> np.ndarray:
    """Per-step RDP ε(α) of the coupled sampling with sensitivity profile Δ(i, j)/C (Theorem C.1 generalised).

    Args:
        profile: (K+1, 2) array of Δ(i, j)/C with profile[0, 0] = 0.
        num_nodes, num_edges, max_degree, sampling_rate, neg_per_pos: n, m, K, γ, k of Algorithm 3.
        noise_multiplier: σ > 0.
        orders: (A,) orders > 1.
        head_rows: rows i ≤ head_rows are integrated numerically, the rest bounded in closed form
            (default :data:`HEAD_ROWS`; ``max_degree`` gives the full quadrature). See the module docstring.

    Returns:
        (A,) upper bounds on the per-step RDP, maximum of the forward and reverse directions.
    """
    profile = np.asarray(profile, dtype=float)
    if profile.shape != (max_degree + 1, 2):
        raise ValueError(f"`profile` must have shape (K+1, 2) = {(max_degree + 1, 2)}, got {profile.shape}.")
    head = min(max_degree, HEAD_ROWS if head_rows is None else int(head_rows))
    if head < 0:
        raise ValueError(f"`head_rows` must be >= 0, got {head_rows}.")
    plan = binomial_plan(num_edges, sampling_rate, num_nodes, neg_per_pos)
    # ω_{i,j}(p) = (1−p)·[j=0]·b_i + p·[j=1]·b_i: a basis of two mixtures and per-point coefficients.
    log_b = log_binomial_pmf(max_degree, sampling_rate, np.arange(head + 1, dtype=float))
    basis = np.full((2, 2 * (head + 1)), -np.inf)
    basis[0, 0::2], basis[1, 1::2] = log_b, log_b
    p = np.clip(plan.points, 0.0, 1.0)
    with np.errstate(divide="ignore"):
        log_coef = np.stack([np.log1p(-p), np.log(p)], axis=1)
    used = np.any(np.isfinite(log_coef), axis=0)  # p ≡ 0 (k = 0) or p ≡ 1: one basis mixture only
    nu_all = profile / noise_multiplier
    nu = nu_all[: head + 1].reshape(-1)
    orders = np.asarray(orders, dtype=float)
    log_fwd = log_psi_quadrature(basis[used], nu, orders, direction="forward", log_coef=log_coef[:, used])
    if head < max_degree:
        tail = log_tail_norms(nu_all, max_degree, sampling_rate, head, orders)  # (A, 2)
        log_t = np.logaddexp(log_coef[:, :1] + tail[None, :, 0], log_coef[:, 1:] + tail[None, :, 1])
        log_fwd = orders * np.logaddexp(log_fwd / orders, log_t)  # Minkowski: (‖R_H‖ + ‖tail‖)^α
    fwd = plan.log_expectation(log_fwd)
    rev = plan.log_expectation(
        log_psi_quadrature(basis[used], nu, orders, direction="reverse", log_coef=log_coef[:, used])
    )
    return np.maximum(np.maximum(fwd, rev), 0.0) / (orders - 1.0)
