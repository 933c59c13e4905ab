"""ε over time as data: the (ε, δ) guarantee after each number of identical steps, and a plot of it.

:func:`epsilon_curve` evaluates the mechanism's per-step RDP once (cached) and composes it linearly, so a
curve of thousands of points costs about one accountant evaluation (plus one PLD composition per point where the
mechanism has a proven dominating pair); every value equals what an :class:`~lightning_dprel.accounting.Accountant`
reports after that many ``step`` calls. :func:`plot_epsilon_curve`
draws any such curve (this one, or the per-step ε a privacy ledger logged); matplotlib is imported only there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lightning_dprel.accounting.accountant import check_accountant
from lightning_dprel.accounting.conversion import check_delta, conversion_constants
from lightning_dprel.accounting.pld import discretization_for, pld_epsilon, self_composed
from lightning_dprel.accounting.mechanisms import (
    _lookup,
    _orders_key,
    check_noise_multiplier,
    step_pld,
)
from lightning_dprel.accounting.orders import as_orders
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["epsilon_curve", "plot_epsilon_curve"]


def _steps_array(steps: Iterable[int]) -> np.ndarray:
    values = list(steps) if not isinstance(steps, np.ndarray) else steps.reshape(-1).tolist()
    bad = [t for t in values if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0]
    if bad:
        raise ValueError(f"`steps` must be ints >= 0 (numbers of steps), got {bad[:5]}.")
    return np.asarray(values, dtype=np.int64)


def epsilon_curve(
    mechanism: str, sampling: SamplingSpec, noise_multiplier: float, delta: float, steps: Iterable[int], *,
    orders: object = None, return_orders: bool = False, accountant: str = "pld",
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """ε after each T in ``steps`` identical steps: RDP composed linearly, then the paper's Theorem D.1, or, with
    ``accountant="pld"`` and a mechanism with a proven dominating pair, the smaller of that and the PLD bound.

    Args:
        mechanism: a registered mechanism name (e.g. ``"freq_corrected"``).
        sampling: the datamodule's SamplingSpec. noise_multiplier: σ > 0. delta: δ ∈ (0, 1).
        steps: numbers of steps T ≥ 0 (any order; T = 0 gives ε = 0).
        orders: Rényi orders (default :data:`~lightning_dprel.accounting.DEFAULT_ORDERS`).
        return_orders: also return the best order α per T (of the RDP bound).
        accountant: "pld" (default; one PLD composition per T, ~0.01–0.1 s each) or "rdp" (microseconds per T).

    Returns:
        ε per T as a float array (and the best orders if ``return_orders``). Equal to
        ``Accountant(mechanism, orders=orders, accountant=accountant)`` after T identical steps (bit for bit on RDP).

    Example::

        eps = epsilon_curve("freq_corrected", dm.sampling_spec, 1.0, 1e-5, range(0, 1001, 100))
    """
    ts = _steps_array(steps)
    grid = as_orders(orders)
    delta = check_delta(delta)
    rdp = _lookup(mechanism, sampling, check_noise_multiplier(noise_multiplier), _orders_key(grid))
    c1, c2 = conversion_constants(grid)
    total = ts[:, None] * rdp[None, :]  # what the accountant composes: 0 + count·rdp
    eps = total + c1[None, :] - math.log(delta) * c2[None, :]
    eps[total < -math.log1p(-delta * delta)] = 0.0  # the conversion's KL shortcut (same rule as the accountant)
    best = np.argmin(eps, axis=1) if eps.size else np.zeros(0, dtype=int)
    values = np.maximum(0.0, eps[np.arange(ts.size), best]) if ts.size else np.zeros(0)
    width = discretization_for(1.0 if sampling is None else sampling.sampling_rate)
    one = step_pld(mechanism, sampling, noise_multiplier, width) if check_accountant(accountant) == "pld" else None
    if one is not None:
        pld = np.array([0.0 if t == 0 else pld_epsilon(self_composed(one, int(t)), delta) for t in ts])
        values = np.minimum(values, pld)
    if return_orders:
        return values, grid[best]
    return values


def plot_epsilon_curve(
    steps: Sequence[int], epsilons: Sequence[float], *, ax: Any = None, label: str | None = None,
    delta: float | None = None, target_epsilon: float | None = None, path: str | None = None, log: bool = True,
) -> Any:
    """Draw ε against the number of steps and return the matplotlib ``Axes`` (matplotlib imported here only).

    Args:
        steps, epsilons: the curve, e.g. ``steps`` and ``epsilon_curve(...)``, or a ledger's logged values.
        ax: an Axes to draw on (default: a new figure).
        label: legend label. delta: shown on the y axis label. target_epsilon: drawn as a dashed line.
        path: save the figure there (PNG, PDF, …; the Agg backend is used when no Axes is given).
        log: log-log axes (points with T = 0 or ε = 0 are not drawn on them).
    """
    steps = np.asarray(steps, dtype=float).reshape(-1)
    epsilons = np.asarray(epsilons, dtype=float).reshape(-1)
    if steps.shape != epsilons.shape:
        raise ValueError(f"`steps` and `epsilons` must have the same length, got {steps.size} and {epsilons.size}.")
    if ax is None:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6.4, 4.2))
    shown = (steps > 0) & (epsilons > 0) if log else np.ones(steps.shape, dtype=bool)
    ax.plot(steps[shown], epsilons[shown], label=label)
    if target_epsilon is not None:
        ax.axhline(target_epsilon, linestyle="--", color="grey", linewidth=1, label=f"target ε = {target_epsilon:g}")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("steps T")
    ax.set_ylabel("ε" if delta is None else f"ε (δ = {delta:.2g})")
    ax.grid(True, which="both", alpha=0.3)
    if label is not None or target_epsilon is not None:
        ax.legend(fontsize=8)
    if path is not None:
        fig = ax.figure
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return ax
