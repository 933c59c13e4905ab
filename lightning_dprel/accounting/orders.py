"""The grid of Rényi orders α over which every mechanism reports its RDP curve.

At least as wide as dp-accounting's ``DEFAULT_RDP_ORDERS`` (fractional 1.1…10.9, integers 11…63,
then 128…1024), with 64 added. Conversion to (ε, δ) takes the best order of the grid (Balle et al.
2020; the paper's Theorem D.1), so a wider grid can only lower ε.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_ORDERS", "as_orders"]

#: Orders α > 1: 1.1, 1.2, …, 10.9, 11, 12, …, 64, 128, 256, 512, 1024 (157 orders).
DEFAULT_ORDERS: np.ndarray = np.concatenate(
    [
        np.round(1.0 + np.arange(1, 100) / 10.0, 10),
        np.arange(11, 65, dtype=float),
        np.array([128.0, 256.0, 512.0, 1024.0]),
    ]
)
DEFAULT_ORDERS.setflags(write=False)


def as_orders(orders: object = None) -> np.ndarray:
    """Validate an order grid: a non-empty 1-D array of finite floats > 1 (default :data:`DEFAULT_ORDERS`).

    Raises:
        ValueError: if an order is ≤ 1, not finite, or the grid is empty.
    """
    if orders is None:
        return DEFAULT_ORDERS
    arr = np.asarray(orders, dtype=float).reshape(-1)
    if arr.size == 0:
        raise ValueError("`orders` must hold at least one Rényi order > 1, got an empty sequence.")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 1.0):
        bad = arr[~np.isfinite(arr) | (arr <= 1.0)]
        raise ValueError(
            f"`orders` must be finite Rényi orders > 1, got {bad.tolist()}; drop them or use DEFAULT_ORDERS."
        )
    arr = arr.copy()
    arr.setflags(write=False)
    return arr
