"""Privacy-loss distributions (PLD): tight (ε, δ) for the mechanisms with a proven dominating pair (dp-accounting).

A mechanism registered with ``pld=`` gives the PLD of one step: a dominating pair, discretised pessimistically with
connect-the-dots (Doroshenko et al. 2022), built by dp-accounting's ``privacy_loss_distribution``. Composition is
dp-accounting's FFT composition (Koskela et al. 2020); the result is an upper bound on the true privacy curve, like
the RDP bound, and usually 5–20 % below it. The pairs and why they dominate: ``docs/accounting.md`` ("Tight
accounting"). Mechanisms without ``pld=`` (the coupled negative-slot mixtures, the paper reproductions) keep RDP.
dp-accounting is imported on first use (with scipy.signal and scipy.stats it costs ≈ 1 s of start-up), so an RDP-only
process such as the accounting CLI with ``--clipping freq`` never loads it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np

from lightning_dprel.core.specs import SamplingSpec

__all__ = [
    "PLD", "PldFunction", "VALUE_DISCRETIZATION", "MIN_DISCRETIZATION", "discretization_for", "MAX_MIXTURE_COMPONENTS", "identity_pld", "gaussian_pld",
    "poisson_gaussian_pld", "replace_one_pld", "binomial_mixture_pld", "mixture_gaussian_pld", "self_composed", "pld_epsilon",
]

#: dp-accounting's ``PrivacyLossDistribution`` (not imported here: see the module docstring).
PLD = Any


@lru_cache(maxsize=None)
def _dp() -> SimpleNamespace:
    """dp-accounting's PLD modules (and scipy's fft, special), imported on first use."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution, privacy_loss_mechanism
    from dp_accounting.privacy_accountant import NeighboringRelation
    from scipy import fft, special

    return SimpleNamespace(pld=privacy_loss_distribution, pmf=pld_pmf, plm=privacy_loss_mechanism,
                           relation=NeighboringRelation, fft=fft, special=special, mixture=_mixture_loss_class(privacy_loss_mechanism),
                           gaussian=_gaussian_loss_class(privacy_loss_mechanism))
#: (SamplingSpec or None, σ, discretisation interval) → PLD of one step, or None where no pair is proven for it.
PldFunction = Callable[[Optional[SamplingSpec], float, float], Optional[PLD]]

#: Widest privacy-loss grid. Pessimistic rounding keeps every width an upper bound; each composed step may round its
#: loss up by one width, so the grid follows the per-step loss: :func:`discretization_for` gives min(10⁻³, q/10).
VALUE_DISCRETIZATION = 1e-3
#: Finest grid :func:`discretization_for` chooses (finer grids cost time and memory ∝ 1/width).
MIN_DISCRETIZATION = 1e-5


def discretization_for(sampling_rate: float) -> float:
    """The grid width for steps sampled at rate q: min(10⁻³, q/10), at least 10⁻⁵ (q = 1 for a release).

    At q = 10⁻³ (σ = 1, 10⁴ steps, δ = 10⁻⁶) a 10⁻³ grid reports ε = 0.58 where the exact value is 0.555; q/10 gives
    0.555 (tests/test_pld_accounting.py)."""
    return float(min(VALUE_DISCRETIZATION, max(MIN_DISCRETIZATION, float(sampling_rate) / 10.0)))

#: Largest binomial mixture (K' + 1 components) given a PLD; above it the mechanism keeps RDP (build time ∝ components).
MAX_MIXTURE_COMPONENTS = 65


def identity_pld(interval: float = VALUE_DISCRETIZATION) -> PLD:
    """The PLD of releasing nothing (the unit of composition)."""
    return _dp().pld.identity(value_discretization_interval=interval)


def gaussian_pld(sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Gaussian release of a statistic of sensitivity C with noise σC: the pair (N(1, σ²), N(0, σ²)), both ways."""
    return poisson_gaussian_pld(1.0, sigma, interval)


def poisson_gaussian_pld(q: float, sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Poisson-subsampled Gaussian, add/remove: ((1−q)N(0, σ²) + qN(1, σ²), N(0, σ²)) and its reverse.

    dp-accounting's ``from_gaussian_mechanism`` (connect-the-dots, pessimistic, its defaults), with the inverse
    privacy loss of every grid point computed at once (≤ 1e-12 from dp-accounting's, tests/test_pld_accounting.py)."""
    dp = _dp()

    def one(adjacency: Any) -> Any:
        loss = dp.gaussian(float(sigma), sensitivity=1.0, pessimistic_estimate=True, sampling_prob=float(q),
                           adjacency_type=adjacency)
        return dp.pld._create_pld_pmf_from_monotone_privacy_loss(loss, pessimistic_estimate=True,
                                                                 value_discretization_interval=interval, use_connect_dots=True)

    remove = one(dp.plm.AdjacencyType.REMOVE)
    if float(q) == 1.0:
        return dp.pld.PrivacyLossDistribution(remove)
    return dp.pld.PrivacyLossDistribution(remove, one(dp.plm.AdjacencyType.ADD))


def replace_one_pld(q: float, sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Poisson-subsampled Gaussian, replace-one: ((1−q)N(0, σ²) + qN(1, σ²), (1−q)N(0, σ²) + qN(−1, σ²))."""
    return _dp().pld.from_gaussian_mechanism(sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=interval,
                                        neighboring_relation=_dp().relation.REPLACE_ONE)


def binomial_mixture_pld(max_degree: int, gamma: float, sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD | None:
    """The unit's i ~ Bin(K', γ) sampled tuples, each clipped to C: (Σ_i Bin(i) N(i, σ²), N(0, σ²)) and its reverse.

    K' = 1 is the Poisson-subsampled Gaussian. None above :data:`MAX_MIXTURE_COMPONENTS` components (RDP is kept).
    """
    if max_degree == 1:
        return poisson_gaussian_pld(gamma, sigma, interval)
    if max_degree + 1 > MAX_MIXTURE_COMPONENTS:
        return None
    from scipy.stats import binom

    probs = [float(w) for w in binom.pmf(range(max_degree + 1), max_degree, gamma)]
    probs[-1] = max(probs[-1], 1.0 - sum(probs[:-1]))  # rounding's residual on the largest shift (never dropped)
    return mixture_gaussian_pld(sigma, [float(i) for i in range(max_degree + 1)], probs, interval)


def _gaussian_loss_class(plm: Any) -> type:
    """dp-accounting's (subsampled) Gaussian privacy loss with ``get_delta_for_epsilon`` over an array computed at once:
    its per-ε inverse (``_inverse_privacy_loss_add``/``_remove``, ``common.log_a_times_exp_b_plus_c``) vectorised."""

    class GaussianLoss(plm.GaussianPrivacyLoss):
        def get_delta_for_epsilon(self, epsilon):
            if np.ndim(epsilon) == 0 or self.adjacency_type == plm.AdjacencyType.REPLACE:
                return super().get_delta_for_epsilon(epsilon)
            epsilons = np.asarray(epsilon, dtype=float)
            deltas = np.zeros_like(epsilons)
            q, add = self.sampling_prob, self.adjacency_type == plm.AdjacencyType.ADD
            if q == 1.0:
                inverse = np.full(epsilons.shape, True)
            elif add:
                inverse = epsilons < -math.log1p(-q)
            else:
                inverse = epsilons > math.log1p(-q)
                deltas[~inverse] = -np.expm1(epsilons[~inverse])
            eps = epsilons[inverse]
            x = self._inverse_losses(eps, add)
            deltas[inverse] = self.mu_upper_cdf(x) - np.exp(eps + self.mu_lower_log_cdf(x))
            return np.clip(deltas, 0, 1)

        def _inverse_losses(self, eps: np.ndarray, add: bool) -> np.ndarray:
            q, sens, var = self.sampling_prob, self.sensitivity, self._standard_deviation ** 2
            loss = -eps if add else eps  # the loss without subsampling: ±log((exp(±ε) − 1)/q + 1)
            edge = np.zeros(eps.shape, dtype=bool)
            if q != 1.0:
                a, c = 1 / q, 1 - 1 / q
                limit = -math.log(1 - q) if add else math.log(1 - q)
                edge = np.abs(eps - limit) <= 1e-9 * np.maximum(np.abs(eps), abs(limit))  # math.isclose
                d = loss + np.log(a)
                with np.errstate(invalid="ignore", divide="ignore"):
                    loss = np.where(loss == 0, np.log(a + c), d + np.log1p(-np.exp(np.log(-c) - d)))
                loss = -loss if add else loss
            x = -0.5 * sens - loss * var / sens
            if add:
                x = sens + x
            x[edge] = -math.inf if add else math.inf
            return x

    return GaussianLoss


def _mixture_loss_class(plm: Any) -> type:
    """dp-accounting's mixture-of-Gaussians privacy loss with its inverse found by one vectorised bisection: the same
    midpoints and answers as dp-accounting's recursive one, which evaluates the loss once per node in Python."""

    class MixtureLoss(plm.MixtureGaussianPrivacyLoss):
        def _inverse_privacy_losses_with_range(self, privacy_losses, bounds, precision=1e-6):
            losses = np.asarray(privacy_losses, dtype=float)
            lo, hi = np.full(losses.shape, float(bounds[0])), np.full(losses.shape, float(bounds[1]))
            active = np.flatnonzero(hi - lo > precision)
            consts, sens, add = self._precompute_privacy_loss_constants, self.sensitivities, self.adjacency_type == plm.AdjacencyType.ADD
            while active.size:
                mid = (lo[active] + hi[active]) / 2
                x_loss = sens[None, :] * mid[:, None] / (self._variance)
                loss = -np.logaddexp.reduce(consts + x_loss, axis=1) if add else np.logaddexp.reduce(consts - x_loss, axis=1)
                below = losses[active] < loss  # the inverse lies right of mid
                lo[active[below]], hi[active[~below]] = mid[below], mid[~below]
                active = active[hi[active] - lo[active] > precision]
            return np.floor(hi / precision) * precision

    return MixtureLoss


def mixture_gaussian_pld(sigma: float, sensitivities: list[float], probs: list[float], interval: float) -> PLD:
    """dp-accounting's ``from_mixture_gaussian_mechanism`` (connect-the-dots, pessimistic), with the vectorised inverse."""
    dp = _dp()

    def one(adjacency: Any) -> Any:
        loss = dp.mixture(sigma, sensitivities, probs, pessimistic_estimate=True, adjacency_type=adjacency)
        return dp.pld._create_pld_pmf_from_monotone_privacy_loss(loss, pessimistic_estimate=True,
                                                                 value_discretization_interval=interval, use_connect_dots=True)

    return dp.pld.PrivacyLossDistribution(one(dp.plm.AdjacencyType.REMOVE), one(dp.plm.AdjacencyType.ADD))


#: dp-accounting's ``self_compose`` tail truncation (its default), and the Chernoff orders of its truncation bounds.
_TAIL_MASS = 1e-15
_CHERNOFF_ORDERS = np.concatenate((np.arange(-20, 0), np.arange(1, 21)))
_MOMENTS: dict[int, tuple] = {}  # id(pmf) → (pmf, orders, log-MGFs): computed once per step pmf, not per count


def self_composed(pld: PLD, count: int) -> PLD:
    """``count``-fold composition of ``pld``: dp-accounting's FFT self-composition (Koskela et al. 2020), the same
    arithmetic, with the Chernoff moments of its truncation bounds computed once per step PLD instead of per count."""
    count = int(count)
    if count == 1:
        return pld
    remove, make = _self_composed_pmf(pld._pmf_remove, count), _dp().pld.PrivacyLossDistribution
    return make(remove) if pld._symmetric else make(remove, _self_composed_pmf(pld._pmf_add, count))


def _log_mgfs(pmf: Any) -> tuple[np.ndarray, np.ndarray]:
    hit = _MOMENTS.get(id(pmf))
    if hit is None or hit[0] is not pmf:
        n = len(pmf._probs)
        orders = _CHERNOFF_ORDERS / n
        log_mgfs = [_logsumexp(np.arange(n) * order, pmf._probs) for order in orders]
        hit = (pmf, orders, log_mgfs)
        if len(_MOMENTS) >= 256:
            _MOMENTS.pop(next(iter(_MOMENTS)))
        _MOMENTS[id(pmf)] = hit
    return hit[1], hit[2]


def _logsumexp(a: np.ndarray, b: np.ndarray) -> float:
    """``scipy.special.logsumexp(a, b=b)`` for 1-d real ``a`` and ``b`` ≥ 0: scipy's steps in numpy, without its
    array-API dispatch (a quarter of a millisecond per call; the same result, tests/test_pld_accounting.py)."""
    a = np.where(b == 0, -np.inf, a)
    a_max = np.max(a)
    top = a == a_max
    a[top] = -np.inf
    m = np.sum(b * top.astype(a.dtype), dtype=a.dtype)
    s = np.sum(b * np.exp(a - a_max), dtype=a.dtype)
    s = s if s == 0 else s / m
    s = -s - 2 if s < -1 else s
    return np.log1p(s) + np.log(abs(m)) + a_max


def _self_composed_pmf(pmf: Any, count: int) -> Any:
    """``DensePLDPmf.self_compose(count)`` (dp-accounting's ``common.self_convolve``) with cached moments."""
    dp = _dp()
    if not isinstance(pmf, dp.pmf.DensePLDPmf):
        return pmf.self_compose(count)
    probs = pmf._probs
    lower, upper = 0, (len(probs) - 1) * count
    for order, log_mgf in zip(*_log_mgfs(pmf)):
        bound = (count * log_mgf + math.log(2 / _TAIL_MASS)) / order
        if math.isfinite(bound):
            upper, lower = (min(upper, math.ceil(bound)), lower) if order > 0 else (upper, max(lower, math.floor(bound)))
    size = upper - lower + 1
    conv = np.real(dp.fft.ifft(dp.fft.fft(probs, dp.fft.next_fast_len(max(size, len(probs)))) ** count))
    infinity = _TAIL_MASS - math.expm1(count * math.log1p(-pmf._infinity_mass))
    return dp.pmf.DensePLDPmf(pmf._discretization, pmf._lower_loss * count + lower, np.array(np.roll(conv, -lower)[:size]),
                            infinity, pmf._pessimistic_estimate)


def pld_epsilon(pld: PLD, delta: float) -> float:
    """ε at δ of a composed PLD: dp-accounting's ``get_epsilon_for_delta`` (``inf`` if δ is below its ∞-mass), its
    scan down the losses done by cumulative sums (numpy's exp may differ from Python's in the last bit: ≤ 1e-12
    relative to dp-accounting's value, tests/test_pld_accounting.py)."""
    eps = _pmf_epsilon(pld._pmf_remove, delta)
    return eps if pld._symmetric else max(eps, _pmf_epsilon(pld._pmf_add, delta))


def _pmf_epsilon(pmf: Any, delta: float) -> float:
    """``PLDPmf.get_epsilon_for_delta`` (pld_pmf._get_epsilon_for_delta's loop) vectorised for a dense pmf."""
    if not isinstance(pmf, _dp().pmf.DensePLDPmf):
        return float(pmf.get_epsilon_for_delta(delta))
    infinity, probs, width = pmf._infinity_mass, np.flip(pmf._probs), pmf._discretization
    if infinity > delta:
        return math.inf
    mass_upper, mass_lower, loss = infinity, 0.0, (pmf._lower_loss + len(probs) - 1) * width
    start, size = 0, 4096  # from the largest loss down, in growing chunks: the scan usually stops early
    while start < len(probs):
        chunk = probs[start:start + size]
        steps = np.full(len(chunk), -width)
        steps[0] = loss
        losses = np.cumsum(steps)  # the loop's losses: one width less each
        upper = np.cumsum(np.concatenate(([mass_upper], chunk)))  # mass at losses above each, before it is added
        lower = np.cumsum(np.concatenate(([mass_lower], np.exp(-losses) * chunk)))
        with np.errstate(divide="ignore", invalid="ignore"):
            stop = (upper[:-1] > delta) & (lower[:-1] > 0) & (np.log((upper[:-1] - delta) / lower[:-1]) >= losses)
        huge = (upper[1:] >= delta) & (lower[1:] == 0)  # exp(−loss) underflowed: ε is that loss
        first = int(np.argmax(stop)) if stop.any() else len(chunk)
        if huge[:first].any():
            return float(max(0.0, losses[int(np.argmax(huge[:first]))]))
        mass_upper, mass_lower = upper[first], lower[first]
        if first < len(chunk):
            break
        loss, start, size = losses[-1] - width, start + len(chunk), 4 * size
    return 0.0 if mass_upper <= mass_lower + delta else float(math.log((mass_upper - delta) / mass_lower))
