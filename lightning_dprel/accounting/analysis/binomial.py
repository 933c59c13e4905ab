"""The expectation over ℓ ∼ Bin(m, γ) in Eq. 3 and Theorem C.1, computed as a rigorous upper bound.

Every per-step quantity f the accountant averages (A_α(Γ_ℓ), or Ψ_α of the coupled mixture in either
direction) depends on ℓ only through p_ℓ = min(1, ℓk/n), and is **convex in p**: the mixture is affine in
p and t ↦ t^α, t ↦ t^{1−α} are convex for α > 1. The plan below turns that into an upper bound that needs f
at a few points only:

* **central range** [ℓ_lo, ℓ_hi] (mean ± 12 sd, widened until each Chernoff tail bound is ≤ e^{−70}; its
  pmf normalised to mass 1, which over-charges by the < 2e^{−70} mass outside it): every ℓ exactly when
  the range has ≤ ``max_exact`` values; otherwise ``n_buckets`` buckets B (denser near the mean), each
  charged P(B) · chord_B(E[p | B]) — by convexity E[f(p) 1_B] ≤ P(B) · chord_B(E[p | B]), with P(B) and
  E[p | B] summed exactly from the pmf;
* **tails**: buckets of geometrically growing width up to ℓ = m, each charged the Chernoff bound
  P(ℓ ≥ a) ≤ exp(−m·KL(a/m ‖ γ)) (resp. ≤ a for the lower tail) times the supremum of f on the bucket,
  which for a convex f is its value at one of the bucket's end points. p is clipped at 1 (ℓk > n cannot
  be sampled without replacement, and p ≤ 1 keeps the mixture weights a distribution).

No probability mass is dropped: the weights sum to ≥ 1, so the result is ≥ the exact expectation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["BinomialPlan", "binomial_plan", "bisect_int", "log_chernoff_tail"]

_Z = 12.0  # central range: mean ± 12 sd
_MAX_EXACT = 48
_N_BUCKETS = 32
_SINH_C = 2.5


@dataclass(frozen=True)
class BinomialPlan:
    """Where to evaluate f (``points``, values of p) and how to combine log f into log of an upper bound on E_ℓ f.

    Attributes:
        points: sorted p values, shape (P,).
        lin_idx, lin_logc: (J, 2) point indices and log coefficients; term j contributes
            c_j0·f(points[i_j0]) + c_j1·f(points[i_j1]) (exact points and bucket chords).
        sup_idx, sup_logmass: (S, 2) and (S,); term s contributes mass_s · max(f(points[i_s0]), f(points[i_s1])).
    """

    points: np.ndarray
    lin_idx: np.ndarray
    lin_logc: np.ndarray
    sup_idx: np.ndarray
    sup_logmass: np.ndarray

    def log_expectation(self, log_f: np.ndarray) -> np.ndarray:
        """Upper bound on log E_ℓ f(p_ℓ) given ``log_f`` of shape (P, …) evaluated at ``points``."""
        log_f = np.asarray(log_f, dtype=float)
        parts = []
        if len(self.lin_idx):
            ext = (self.lin_logc.reshape(self.lin_logc.shape + (1,) * (log_f.ndim - 1)))
            lin = np.logaddexp(ext[:, 0] + log_f[self.lin_idx[:, 0]], ext[:, 1] + log_f[self.lin_idx[:, 1]])
            parts.append(lin)
        if len(self.sup_idx):
            ext = self.sup_logmass.reshape(self.sup_logmass.shape + (1,) * (log_f.ndim - 1))
            sup = ext + np.maximum(log_f[self.sup_idx[:, 0]], log_f[self.sup_idx[:, 1]])
            parts.append(sup)
        return special.logsumexp(np.concatenate(parts, axis=0), axis=0)


def _kl(x: np.ndarray, gamma: float) -> np.ndarray:
    """KL(Bernoulli(x) ‖ Bernoulli(γ)), stable at x ∈ {0, 1}."""
    return (
        special.xlogy(x, x) - x * math.log(gamma) + special.xlog1py(1.0 - x, -x) - (1.0 - x) * math.log1p(-gamma)
        if gamma < 1.0
        else -np.log(x)
    )


def log_chernoff_tail(a: np.ndarray, m: int, gamma: float, *, upper: bool) -> np.ndarray:
    """Chernoff bound on log P(ℓ ≥ a) (``upper``) or log P(ℓ ≤ a) for ℓ ∼ Bin(m, γ); 0 where it is vacuous."""
    a = np.asarray(a, dtype=float)
    x = np.clip(a / m, 0.0, 1.0)
    mean = m * gamma
    inside = (a >= mean) if upper else (a <= mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(inside, -m * _kl(x, gamma), 0.0)
    return np.minimum(np.nan_to_num(out, nan=0.0, neginf=-np.inf), 0.0)


_TAIL_LOG = -70.0


def _tail_edge(m: int, gamma: float, start: int, *, upper: bool) -> int:
    """Smallest a ≥ start (``upper``; largest a ≤ start otherwise) with Chernoff log-tail ≤ −70, clipped to [0, m]."""
    limit = m if upper else 0

    def small(a: int) -> bool:
        if a == limit:
            return True
        tail_at = a + 1 if upper else a - 1  # the bucket just outside the central range
        return float(log_chernoff_tail(tail_at, m, gamma, upper=upper)) <= _TAIL_LOG

    if small(start):
        return start
    good, step = start, 1
    while True:  # exponential search, then bisection on integers
        cand = min(m, good + step) if upper else max(0, good - step)
        if small(cand):
            break
        good, step = cand, step * 2
    return bisect_int(small, good=cand, bad=good)


def bisect_int(pred, *, good: int, bad: int) -> int:
    """The integer next to the boundary on ``good``'s side, for a predicate monotone between ``good`` (true)
    and ``bad`` (false); ``good`` may lie on either side of ``bad``."""
    while abs(good - bad) > 1:
        mid = (good + bad) // 2
        if pred(mid):
            good = mid
        else:
            bad = mid
    return good


def _central_logpmf(lo: int, hi: int, m: int, gamma: float) -> np.ndarray:
    """log P(ℓ) on [lo, hi], normalised to total mass 1 (≥ the true mass of the range).

    Built from the ratios P(ℓ+1)/P(ℓ) = (m−ℓ)γ / ((ℓ+1)(1−γ)), each exact to a few ulps, so the shape keeps
    ~1e-12 relative accuracy even for m = 10⁹ (``scipy.stats.binom.logpmf`` loses ~1e-6 there). The range
    holds all but < 2e^{−70} of the mass, so normalising to 1 can only over-charge.
    """
    ell = np.arange(lo, hi, dtype=float)
    ratio = (m - ell) * gamma / ((ell + 1.0) * (1.0 - gamma))
    log_rel = np.concatenate([[0.0], np.cumsum(np.log(ratio))])
    top = float(log_rel.max())
    log_norm = top + math.log(math.fsum(np.exp(log_rel - top)))  # correctly rounded sum
    return log_rel - log_norm + _ROUNDING


_ROUNDING = 1e-13  # log-mass margin (~450 ulp): the normalised central masses sum to ≥ 1 despite rounding


def binomial_plan(
    m: int, gamma: float, n: int, k: int, *, max_exact: int = _MAX_EXACT, n_buckets: int = _N_BUCKETS
) -> BinomialPlan:
    """Build the upper-bound plan for E_{ℓ∼Bin(m,γ)} f(min(1, ℓk/n)) (see the module docstring).

    Args:
        m: number of capped edges (trials), ≥ 1.
        gamma: Poisson rate γ ∈ (0, 1].
        n: number of nodes, ≥ 1.
        k: negatives per positive, ≥ 0. With k = 0, p ≡ 0 and the expectation is f(0) exactly.
        max_exact: evaluate every ℓ of the central range when it has at most this many values.
        n_buckets: number of chord buckets otherwise.
    """
    if k == 0:
        zero = np.zeros((1, 2), dtype=int)
        return BinomialPlan(np.zeros(1), zero, np.array([[0.0, -np.inf]]), np.zeros((0, 2), int), np.zeros(0))

    def p_of(ell: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, np.asarray(ell, dtype=float) * k / n)

    if gamma >= 1.0:  # ℓ = m surely
        return BinomialPlan(p_of([m]), np.zeros((1, 2), int), np.array([[0.0, -np.inf]]), np.zeros((0, 2), int),
                            np.zeros(0))
    mean, sd = m * gamma, math.sqrt(m * gamma * (1.0 - gamma))
    lo = max(0, math.floor(mean - _Z * sd))
    hi = min(m, math.ceil(mean + _Z * sd))
    # Widen until the Chernoff tail bounds are below e^-70 (for small means 12 sd is not enough).
    hi = _tail_edge(m, gamma, hi, upper=True)
    lo = _tail_edge(m, gamma, lo, upper=False)
    ell = np.arange(lo, hi + 1)
    logpmf = _central_logpmf(lo, hi, m, gamma)
    lin_pairs: list[tuple[float, float]] = []
    lin_logc: list[tuple[float, float]] = []
    sup_pairs: list[tuple[float, float]] = []
    sup_logmass: list[float] = []

    if len(ell) <= max_exact:
        for e, lp in zip(ell, logpmf):
            pe = float(p_of(e))
            lin_pairs.append((pe, pe))
            lin_logc.append((float(lp), -np.inf))
    else:
        shift = logpmf.max()
        w = np.exp(logpmf - shift)
        # Bucket edges denser near the mean (sinh spacing in sd units): ~0.3 sd wide at the centre, ~2 sd at ±12 sd.
        t = np.linspace(-1.0, 1.0, n_buckets + 1)
        z = _Z * np.sinh(_SINH_C * t) / math.sinh(_SINH_C)
        edges = np.clip(np.round(mean + 0.5 + z * sd), lo, hi + 1)
        edges[0], edges[-1] = lo, hi + 1
        edges = np.unique(edges.astype(np.int64))
        for a, b in zip(edges[:-1], edges[1:]):
            sl = slice(a - lo, b - lo)
            mass = w[sl].sum()
            if mass <= 0.0:
                # Underflow relative to the mode: charge the bucket as a tail bucket (sup, exact log-mass bound).
                sup_pairs.append((float(p_of(a)), float(p_of(b))))
                sup_logmass.append(float(special.logsumexp(logpmf[sl])))
                continue
            pbar = float(np.dot(w[sl], p_of(ell[sl])) / mass)
            pa, pb = float(p_of(a)), float(p_of(b))
            t = 0.0 if pb <= pa else min(1.0, max(0.0, (pbar - pa) / (pb - pa)))
            log_mass = math.log(mass) + shift
            with np.errstate(divide="ignore"):
                lin_pairs.append((pa, pb))
                lin_logc.append((log_mass + math.log1p(-t) if t < 1.0 else -np.inf,
                                 log_mass + math.log(t) if t > 0.0 else -np.inf))

    # Upper tail: ℓ ∈ (hi, m], geometric buckets starting at one sd; final bucket where p = 1.
    if hi < m:
        step = max(1.0, sd)
        cap = min(m, math.ceil(n / k)) if k > 0 else m
        edges_u = [hi + 1]
        j = 1
        while edges_u[-1] < m:
            nxt = hi + 1 + int(step * (2**j - 1))
            if edges_u[-1] < cap <= nxt:
                nxt = cap
            edges_u.append(min(m, nxt))
            j += 1
        edges_u = np.unique(np.array(edges_u, dtype=np.int64))
        for idx, a in enumerate(edges_u):
            b = edges_u[idx + 1] if idx + 1 < len(edges_u) else m
            sup_pairs.append((float(p_of(a)), float(p_of(b))))
            sup_logmass.append(float(log_chernoff_tail(a, m, gamma, upper=True)))
    # Lower tail: ℓ ∈ [0, lo).
    if lo > 0:
        sup_pairs.append((0.0, float(p_of(lo))))
        sup_logmass.append(float(log_chernoff_tail(lo - 1, m, gamma, upper=False)))

    all_p = [p for pair in lin_pairs + sup_pairs for p in pair]
    points = np.unique(np.array(all_p, dtype=float))
    index = {p: i for i, p in enumerate(points)}
    lin_idx = np.array([[index[a], index[b]] for a, b in lin_pairs], dtype=int).reshape(-1, 2)
    sup_idx = np.array([[index[a], index[b]] for a, b in sup_pairs], dtype=int).reshape(-1, 2)
    return BinomialPlan(
        points,
        lin_idx,
        np.array(lin_logc, dtype=float).reshape(-1, 2),
        sup_idx,
        np.array(sup_logmass, dtype=float),
    )
