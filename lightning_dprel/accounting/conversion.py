"""RDP → (ε, δ)-DP: Balle, Barthe, Gaboardi, Hsu, Sato (2020), Theorem 21; the paper's Theorem D.1.

ε = min_α  ε_RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1).

Same rule as dp-accounting's ``compute_epsilon`` (including its KL shortcut: when δ² ≥ 1 − e^{−ε_RDP(α)},
δ ≥ sqrt(1 − e^{−KL}) already certifies ε = 0, and its α > 1.01 guard), so the two agree on equal RDP curves.
"""

from __future__ import annotations

import math

import numpy as np

from lightning_dprel.core.checks import check_delta  # the one δ check

__all__ = ["rdp_to_epsilon", "check_delta", "conversion_constants", "epsilon_from_constants"]


def conversion_constants(orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-order constants (c1, c2) with ε(α) = rdp(α) + c1(α) − log δ · c2(α); c1 = +inf where α ≤ 1.01."""
    orders = np.asarray(orders, dtype=float)
    c2 = 1.0 / (orders - 1.0)
    c1 = np.log1p(-1.0 / orders) - np.log(orders) * c2
    c1 = np.where(orders > 1.01, c1, np.inf)
    return c1, c2


def epsilon_from_constants(
    orders: np.ndarray, c1: np.ndarray, c2: np.ndarray, rdp: np.ndarray, delta: float
) -> tuple[float, float]:
    """Fast path of :func:`rdp_to_epsilon` for pre-validated inputs (used after every training step)."""
    eps = rdp + c1 - math.log(delta) * c2
    eps[rdp < -math.log1p(-delta * delta)] = 0.0  # KL shortcut: δ ≥ sqrt(1 − e^{−ε_RDP}) certifies ε = 0
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(orders[best])


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """Convert an RDP curve to (ε, δ)-DP by Balle et al. 2020 (the paper's Theorem D.1).

    Args:
        orders: Rényi orders α > 1, shape (A,).
        rdp: ε_RDP(α) ≥ 0 at those orders (already composed over steps), shape (A,).
        delta: target δ ∈ (0, 1).

    Returns:
        (ε, best α). ε is +inf when every order is infinite.

    Raises:
        ValueError: on mismatched lengths, orders ≤ 1 or δ outside (0, 1).
    """
    delta = check_delta(delta)
    orders = np.asarray(orders, dtype=float).reshape(-1)
    rdp = np.asarray(rdp, dtype=float).reshape(-1)
    if orders.shape != rdp.shape:
        raise ValueError(f"`orders` and `rdp` must have the same length, got {orders.size} and {rdp.size}.")
    if orders.size == 0 or np.any(orders <= 1.0):
        raise ValueError(f"`orders` must be non-empty Rényi orders > 1, got {orders.tolist()[:5]}….")
    r = np.maximum(np.nan_to_num(rdp, nan=np.inf, posinf=np.inf), 0.0)
    c1, c2 = conversion_constants(orders)
    return epsilon_from_constants(orders, c1, c2, r, delta)
