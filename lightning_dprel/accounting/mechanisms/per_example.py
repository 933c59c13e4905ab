"""The per-example Poisson-subsampled Gaussian (Mironov et al. 2019), registered on import as
``poisson_gaussian`` for the core's unit ``example``: each example clipped to C, Poisson at rate γ,
add/remove (Δ = C)."""

from __future__ import annotations

import numpy as np

from lightning_dprel.accounting.analysis.sampled_gaussian import eq3_rdp
from lightning_dprel.accounting.pld import poisson_gaussian_pld
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import EXAMPLE, SamplingSpec

__all__ = [
    "EXAMPLE_PRIVACY_UNIT",
    "per_example_poisson_gaussian",
    "per_example_poisson_gaussian_pld",
]

EXAMPLE_PRIVACY_UNIT = EXAMPLE.description


def per_example_poisson_gaussian(
    sampling: SamplingSpec, sigma: float, orders: np.ndarray
) -> np.ndarray:
    """Per-step RDP of the Poisson-subsampled Gaussian at rate γ, one example per unit (Mironov et
    al. 2019)."""
    return eq3_rdp(
        orders=orders,
        num_nodes=1,
        num_edges=sampling.population,
        max_degree=1,
        sampling_rate=float(sampling.sampling_rate),
        neg_per_pos=0,
        noise_multiplier=sigma,
    )


def per_example_poisson_gaussian_pld(sampling: SamplingSpec, sigma: float, interval: float):
    """PLD of one example clipped to C, Poisson at rate γ, add/remove: ((1−γ)N(0, σ²) + γN(1, σ²),
    N(0, σ²))."""
    return poisson_gaussian_pld(float(sampling.sampling_rate), sigma, interval)


register_mechanism(
    "poisson_gaussian",
    per_example_poisson_gaussian,
    coupled=False,
    privacy_unit=EXAMPLE,
    label="per-example Poisson Gaussian",
    clipping=("standard",),  # each example clipped to C, add/remove: Δ = C
    pld=per_example_poisson_gaussian_pld,
    description="per-example Poisson-subsampled Gaussian at rate γ (Mironov et al. 2019)",
)
