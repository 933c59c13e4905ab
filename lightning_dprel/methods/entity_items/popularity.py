"""The DP popularity baseline: a noised item-count histogram (Gaussian mechanism), charged to a ledger.

Each training entity adds 1 to each of its ≤ K kept items (distinct), so adding or removing it moves the count vector
by at most √K in ℓ2: N(0, σ²K) per count is one Gaussian release of sensitivity √K (Mironov 2017, Prop. 7).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["dp_item_popularity", "gaussian_sigma_for"]


def gaussian_sigma_for(epsilon: float, delta: float) -> float:
    """The smallest σ (to 0.1 %) whose single Gaussian release (α/(2σ²)) is (ε, δ)-DP by the ledger's conversion."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or not 0 < delta < 1:
        raise ValueError(f"Need ε > 0 finite and δ in (0, 1), got ε={epsilon}, δ={delta}.")
    lo, hi = 1e-3, 1e4
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        eps = rdp_to_epsilon(DEFAULT_ORDERS, DEFAULT_ORDERS / (2 * mid * mid), delta)[0]
        lo, hi = (mid, hi) if eps > epsilon else (lo, mid)
    return hi


def dp_item_popularity(dm, epsilon: float, delta: float, *, ledger=None, seed: int | None = None) -> tuple[Tensor, object]:
    """Noised counts ``[n_items]`` of the training entities' kept items, and the ledger charged for them.

    ``dm`` is a set-up :class:`~lightning_dprel.methods.entity_items.datamodule.EntityItemDataModule`; ``ledger`` (a
    :class:`~lightning_dprel.core.ledger.PrivacyLedger`, new if None) is charged one Gaussian release for its unit.
    """
    from lightning_dprel.core.ledger import PrivacyLedger

    sigma = gaussian_sigma_for(float(epsilon), float(delta))
    counts = torch.bincount(dm.train_pairs[1], minlength=len(dm.item_ids)).double()
    stream = KeyedStream.secret("dp_popularity") if seed is None else KeyedStream.seeded(seed, "dp_popularity")
    noise = stream.normal(counts.numel(), std=sigma * math.sqrt(dm.max_relations), dtype=torch.float64)
    ledger = PrivacyLedger() if ledger is None else ledger
    ledger.charge(GaussianRelease(sigma, dm.privacy_unit))
    return (counts + noise).float(), ledger
