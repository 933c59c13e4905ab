"""The DP popularity baseline: a noised item-count histogram (Gaussian mechanism), charged to a ledger.

Each training entity adds 1 to each of its ≤ K kept items (distinct), so adding or removing it moves the count vector
by at most √K in ℓ2: N(0, σ²K) per count is one Gaussian release of sensitivity √K (Mironov 2017, Prop. 7).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dprel.accounting.calibration import noise_multiplier_for
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["dp_item_popularity", "gaussian_sigma_for"]


def gaussian_sigma_for(epsilon: float, delta: float) -> float:
    """The σ of one Gaussian release (α/(2σ²)) that spends ε at δ: the library's calibration, mechanism ``gaussian``."""
    return noise_multiplier_for(epsilon, delta=delta, steps=1, sampling=None, mechanism="gaussian", tol=0.001)


def dp_item_popularity(dm, epsilon: float, delta: float, *, ledger=None, seed: int | None = None) -> tuple[Tensor, object]:
    """Noised counts ``[n_items]`` of the training entities' kept items, and the ledger charged for them.

    ``dm`` is a set-up :class:`~lightning_dprel.methods.entity_items.datamodule.EntityItemDataModule`; the release is
    recorded on it (``dm.record_release``), so every model that trains on ``dm`` (an item prior made from these counts)
    is charged for it once; ``ledger`` (a :class:`~lightning_dprel.core.ledger.PrivacyLedger`, new if None) is charged
    the same release (by the same id: a model's ledger passed here is not charged twice).
    """
    from lightning_dprel.core.ledger import PrivacyLedger

    sigma = gaussian_sigma_for(float(epsilon), float(delta))
    counts = torch.bincount(dm.train_pairs[1], minlength=len(dm.item_ids)).double()
    stream = KeyedStream.secret("dp_popularity") if seed is None else KeyedStream.seeded(seed, "dp_popularity")
    noise = stream.normal(counts.numel(), std=sigma * math.sqrt(dm.max_relations), dtype=torch.float64)
    event = GaussianRelease(sigma, dm.privacy_unit)
    ledger = PrivacyLedger() if ledger is None else ledger
    ledger.charge_once(event, dm.record_release(event))
    return (counts + noise).float(), ledger
