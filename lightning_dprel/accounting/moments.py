"""The moments accountant as DP-GCN (Igamberdiev & Habernal 2022, Appendix E) and Abadi et al. (2016) ran it.

ε = min over integer λ = 1 … ``max_lambda`` of (T·log E[exp(λ·privacy loss)] + log(1/δ)) / λ, the moment being the
Poisson-subsampled Gaussian's at rate q (add/remove, sensitivity C): in RDP terms α = λ + 1 and
ε = min_α T·ρ(α) + log(1/δ)/(α − 1) over integer α — the classic conversion, without Balle et al.'s improvement.
This module reproduces published numbers; the library's own ε comes from :class:`~lightning_dprel.accounting.Accountant`.
"""

from __future__ import annotations

import math

import numpy as np

from lightning_dprel.core.checks import check_int, check_probability, positive_finite
from lightning_dprel.accounting.analysis.substitution import poisson_gaussian_rdp
from lightning_dprel.accounting.conversion import check_delta

__all__ = ["moments_accountant_epsilon"]


def moments_accountant_epsilon(sampling_rate: float, noise_multiplier: float, steps: int, delta: float, *, max_lambda: int = 255) -> tuple[float, int]:
    """(ε, best λ) of ``steps`` Poisson-subsampled Gaussian steps, moments accountant with integer λ ≤ ``max_lambda``."""
    check_probability("sampling_rate", sampling_rate, one=True)
    positive_finite("noise_multiplier", noise_multiplier)
    check_int("steps", steps, 1)
    delta = check_delta(delta)
    alphas = np.arange(2, int(max_lambda) + 2, dtype=float)
    eps = steps * poisson_gaussian_rdp(float(sampling_rate), float(noise_multiplier), alphas) + math.log(1.0 / delta) / (alphas - 1.0)
    best = int(np.argmin(eps))
    return float(eps[best]), int(alphas[best] - 1)
