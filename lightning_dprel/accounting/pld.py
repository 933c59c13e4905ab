"""Privacy-loss distributions (PLD): tight (ε, δ) for the mechanisms with a proven dominating pair (dp-accounting).

A mechanism registered with ``pld=`` gives the PLD of one step: a dominating pair, discretised pessimistically with
connect-the-dots (Doroshenko et al. 2022), built by dp-accounting's ``privacy_loss_distribution``. Composition is
dp-accounting's FFT composition (Koskela et al. 2020); the result is an upper bound on the true privacy curve, like
the RDP bound, and usually 5–20 % below it. The pairs and why they dominate: ``docs/accounting.md`` ("Tight
accounting"). Mechanisms without ``pld=`` (the coupled negative-slot mixtures, the paper reproductions) keep RDP.
"""

from __future__ import annotations

from typing import Callable, Optional

from dp_accounting.pld import privacy_loss_distribution as _pld
from dp_accounting.privacy_accountant import NeighboringRelation

from lightning_dprel.core.specs import SamplingSpec

__all__ = [
    "PLD", "PldFunction", "VALUE_DISCRETIZATION", "MIN_DISCRETIZATION", "discretization_for", "MAX_MIXTURE_COMPONENTS", "identity_pld", "gaussian_pld",
    "poisson_gaussian_pld", "replace_one_pld", "binomial_mixture_pld", "pld_epsilon",
]

PLD = _pld.PrivacyLossDistribution
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
    return _pld.identity(value_discretization_interval=interval)


def gaussian_pld(sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Gaussian release of a statistic of sensitivity C with noise σC: the pair (N(1, σ²), N(0, σ²)), both ways."""
    return _pld.from_gaussian_mechanism(sigma, sensitivity=1.0, value_discretization_interval=interval)


def poisson_gaussian_pld(q: float, sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Poisson-subsampled Gaussian, add/remove: ((1−q)N(0, σ²) + qN(1, σ²), N(0, σ²)) and its reverse."""
    return _pld.from_gaussian_mechanism(sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=interval)


def replace_one_pld(q: float, sigma: float, interval: float = VALUE_DISCRETIZATION) -> PLD:
    """Poisson-subsampled Gaussian, replace-one: ((1−q)N(0, σ²) + qN(1, σ²), (1−q)N(0, σ²) + qN(−1, σ²))."""
    return _pld.from_gaussian_mechanism(sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=interval,
                                        neighboring_relation=NeighboringRelation.REPLACE_ONE)


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
    return _pld.from_mixture_gaussian_mechanism(
        standard_deviation=sigma, sensitivities=[float(i) for i in range(max_degree + 1)], sampling_probs=probs,
        value_discretization_interval=interval,
    )


def self_composed(pld: PLD, count: int) -> PLD:
    """``count``-fold composition of ``pld`` (dp-accounting's FFT self-composition)."""
    return pld if int(count) == 1 else pld.self_compose(int(count))


def pld_epsilon(pld: PLD, delta: float) -> float:
    """ε at δ of a composed PLD (dp-accounting's ``get_epsilon_for_delta``; ``inf`` if δ is below its ∞-mass)."""
    return float(pld.get_epsilon_for_delta(delta))
