"""Releases that are not optimizer steps: a Gaussian release of a statistic whose sensitivity the caller states for a
unit (Mironov 2017, Prop. 7: α/(2σ²) per release; its PLD the pair (N(1, σ²), N(0, σ²)); the unit is the event's,
checked by the ledger)."""

from __future__ import annotations

import numpy as np

from lightning_dprel.accounting.pld import gaussian_pld
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import SamplingSpec

__all__: list[str] = []


def _gaussian(sampling: SamplingSpec | None, sigma: float, orders: np.ndarray) -> np.ndarray:
    return np.asarray(orders, dtype=float) / (2.0 * sigma * sigma)


def _gaussian_pld(sampling: SamplingSpec | None, sigma: float, interval: float):
    return gaussian_pld(sigma, interval)


register_mechanism(
    "gaussian", _gaussian, coupled=False, privacy_unit=None, needs_sampling=False, label="Gaussian release",
    pld=_gaussian_pld,
    description="Gaussian mechanism on a statistic of sensitivity ≤ C for the event's unit, noise σ·C: α/(2σ²)",
)
