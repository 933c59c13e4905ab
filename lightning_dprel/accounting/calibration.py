"""Calibration: the noise multiplier for a privacy budget, and the step budget for a noise multiplier.

Both search the ε the :class:`~lightning_dprel.accounting.Accountant` reports — the smaller of the PLD bound (where
the mechanism has a proven dominating pair) and the RDP bound, or RDP alone with ``accountant="rdp"`` — so they
inherit its upper-bound guarantee: the returned σ (resp. T) never overshoots the target ε.
"""

from __future__ import annotations

import math

from lightning_dprel.core.checks import check_probability, positive_finite
from lightning_dprel.accounting.accountant import Accountant
from lightning_dprel.accounting.conversion import check_delta
from lightning_dprel.accounting.mechanisms import check_noise_multiplier, check_step_count
from lightning_dprel.accounting.orders import as_orders
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["noise_multiplier_for", "max_steps_for", "epsilon_for"]

SIGMA_MIN = 0.1
SIGMA_MAX = 1e4


def _check_target(target_epsilon: float) -> float:
    return positive_finite("target_epsilon", target_epsilon, "e.g. target_epsilon=4.0")


def epsilon_for(
    *, delta: float, steps: int, sampling: SamplingSpec, noise_multiplier: float,
    mechanism: str, orders: object = None, accountant: str = "pld",
) -> tuple[float, str]:
    """(ε, the bound that gave it: "pld" or "rdp") after ``steps`` identical steps."""
    acc = Accountant(mechanism, orders=orders, accountant=accountant)
    acc.step(sampling, check_noise_multiplier(noise_multiplier), check_step_count("steps", steps))
    bounds = acc.epsilon_bounds(check_delta(delta))
    return bounds["epsilon"], bounds["bound"]


def _spent_accountant(spent: "Accountant | None", mechanism: str, orders: object, accountant: str) -> Accountant:
    if spent is None:
        return Accountant(mechanism, orders=orders, accountant=accountant)
    if not isinstance(spent, Accountant) or spent.mechanism != mechanism:
        raise ValueError(
            f"`spent` must be an Accountant of mechanism {mechanism!r} holding what was already spent (e.g. "
            f"ledger.accountant()), got {spent!r}."
        )
    return spent


def noise_multiplier_for(
    target_epsilon: float, *, delta: float, steps: int, sampling: SamplingSpec | None,
    mechanism: str, tol: float = 0.01, orders: object = None, spent: "Accountant | None" = None,
    accountant: str = "pld",
) -> float:
    """The smallest σ (to ``tol``) whose ε after ``steps`` steps is ≤ ``target_epsilon``.

    ``spent`` (an :class:`Accountant` of the same mechanism holding what was already spent, e.g.
    ``ledger.accountant()``) is composed first, so a model that has trained before gets the σ for what is left of its
    budget; its own ``accountant`` kind is used then.

    Bracketing in log σ, then a secant (Illinois) search on log ε(log σ) safeguarded by bisection; ε is
    non-increasing in σ. The returned σ always satisfies ε(σ) ≤ target, and ε(σ) ≥ (1 − tol)·target unless σ hits the
    search floor 0.1 (then every σ ≥ 0.1 meets the target) or the bracket shrinks below 1e-9 relative.

    Args:
        target_epsilon: ε* > 0. delta: δ ∈ (0, 1). steps: T ≥ 1. sampling: the datamodule's SamplingSpec.
        mechanism: registered mechanism name. tol: relative ε tolerance in (0, 1). orders: Rényi orders.
        spent: optional Accountant of what was already spent. accountant: "pld" (default) or "rdp".

    Raises:
        ValueError: on bad input, or if even σ = 10⁴ cannot meet the target.
    """
    target = _check_target(target_epsilon)
    delta = check_delta(delta)
    steps = check_step_count("steps", steps)
    check_probability("tol", tol)
    acc = _spent_accountant(spent, mechanism, as_orders(orders) if spent is None else None, accountant)

    def eps_rdp(sigma: float) -> float:
        return acc.epsilon_after(sampling, sigma, delta, steps, bound="rdp")

    # RDP first (microseconds per σ); the reported bound min(PLD, RDP) is never above it, so its σ brackets the tight
    # search from above, which then costs a few PLD builds (seconds each for a mixture) instead of a dozen.
    sigma = _search(eps_rdp, target, tol, steps, start=1.0)
    if not acc.has_pld_for(sampling, sigma):
        return sigma

    def eps(sigma: float) -> float:
        return acc.epsilon_after(sampling, sigma, delta, steps)

    return _search(eps, target, tol, steps, start=sigma, known_hi=True)


def _search(eps, target: float, tol: float, steps: int, *, start: float, known_hi: bool = False) -> float:
    """The smallest σ (to ``tol``) with eps(σ) ≤ target: bracket from ``start`` (×2, or ÷1.15 from a ``known_hi``),
    then a safeguarded Illinois search in log σ."""
    factor = 1.15 if known_hi else 2.0
    sigma = start
    e = eps(sigma)
    if e <= target:
        hi, e_hi = sigma, e
        while True:
            lo = hi / factor
            if lo < SIGMA_MIN:
                if eps(SIGMA_MIN) <= target:
                    return SIGMA_MIN
                lo = SIGMA_MIN
            e_lo = eps(lo)
            if e_lo > target:
                break
            hi, e_hi = lo, e_lo
    else:
        lo, e_lo = sigma, e
        while True:
            hi = lo * 2.0
            if hi > SIGMA_MAX:
                raise ValueError(
                    f"`target_epsilon`={target} is not reachable with noise_multiplier <= {SIGMA_MAX:g} after "
                    f"{steps} steps; raise the target or lower the steps / sampling rate."
                )
            e_hi = eps(hi)
            if e_hi <= target:
                break
            lo, e_lo = hi, e_hi
    # Illinois regula falsi on f(x) = log ε(e^x) − log target, safeguarded: a step that does not halve the
    # bracket is followed by a bisection (ε(σ) can bend sharply where the best order switches).
    x_lo, x_hi = math.log(lo), math.log(hi)
    ft = math.log(target * (1.0 - 0.5 * tol))  # aim at the middle of the accepted window [(1−tol)·ε*, ε*]
    f_lo = math.log(e_lo) - ft
    f_hi = (math.log(e_hi) - ft) if e_hi > 0 else -1e3
    side, bisect_next = 0, False
    for _ in range(200):
        if e_hi >= (1.0 - tol) * target or (x_hi - x_lo) < 1e-9:
            break
        width = x_hi - x_lo
        x = 0.5 * (x_lo + x_hi)
        if not bisect_next and f_hi != f_lo:
            x_sec = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            if x_lo < x_sec < x_hi:
                x = x_sec
        e_x = eps(math.exp(x))
        f_x = (math.log(e_x) - ft) if e_x > 0 else -1e3
        if e_x <= target:
            x_hi, f_hi, e_hi = x, f_x, e_x
            if side == 1:
                f_lo /= 2.0
            side = 1
        else:
            x_lo, f_lo = x, f_x
            if side == -1:
                f_hi /= 2.0
            side = -1
        bisect_next = (not bisect_next) and (x_hi - x_lo) > 0.5 * width
    return math.exp(x_hi)


def max_steps_for(
    target_epsilon: float, *, delta: float, noise_multiplier: float, sampling: SamplingSpec,
    mechanism: str, orders: object = None, max_steps: int = 2**62, accountant: str = "pld",
) -> int:
    """The largest T with ε(T steps) ≤ ``target_epsilon`` (0 if even one step exceeds it).

    Doubling then bisection over T (:meth:`Accountant.steps_within`), on each bound.
    """
    target = _check_target(target_epsilon)
    acc = Accountant(mechanism, orders=orders, accountant=accountant)
    return acc.steps_within(target, check_delta(delta), sampling, check_noise_multiplier(noise_multiplier),
                            max_steps=max_steps)
