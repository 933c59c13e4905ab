"""Banded correlated noise under cyclic Poisson (b-min-sep) sampling, registered on import as ``banded_poisson_gaussian``.

Unit ``example`` (one row, add/remove). The rows are split into b partitions by their index (row i in partition i mod
b, public and data-independent); step t Poisson-samples partition t mod b at rate p, so a row takes part only in steps
b apart. With b-banded noise w = C⁻¹z (``core/correlated_noise.py``, z scaled by ‖c‖ so σ is the reduced multiplier)
the whole run is as private as DP-SGD at rate p and σ composed k = ⌈T/b⌉ times (the most steps one partition is
sampled in): the per-step curve is the Poisson Gaussian's, composed ⌈n/b⌉ times over a run of n steps
(``compositions``). With b = 1 it is ``poisson_gaussian`` exactly.

References:
    Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu. (Amplified) Banded Matrix Factorization: A unified
    approach to private training. NeurIPS 2023 (arXiv 2306.08153), Section 4 (the amplification theorem for b-banded
    strategies under b-min-sep sampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_dprel.accounting.mechanisms.per_example import (
    per_example_poisson_gaussian,
    per_example_poisson_gaussian_pld,
)
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.checks import check_int
from lightning_dprel.core.specs import EXAMPLE, SamplingDetail, SamplingSpec, register_sampling_detail

__all__ = ["BANDED_MECHANISM", "CyclicPoisson", "check_cyclic_sampling", "banded_compositions"]

#: The registered name (``core/correlated_noise.BandedNoise`` draws noise only for steps accounted with it).
BANDED_MECHANISM = "banded_poisson_gaussian"


@register_sampling_detail
@dataclass(frozen=True)
class CyclicPoisson(SamplingDetail):
    """Cyclic Poisson (b-min-sep) sampling: ``partitions`` b; the record's ``population`` is the largest partition
    (⌈N/b⌉ rows), ``sampling_rate`` p the rate within the partition a step samples."""

    partitions: int

    def check(self, spec: SamplingSpec) -> None:
        check_int("partitions", self.partitions, 1)


def check_cyclic_sampling(sampling: SamplingSpec, bands: int | None = None) -> CyclicPoisson:
    """The sampling's :class:`CyclicPoisson` detail, else a ``ValueError`` naming the sampler and what to use; with
    ``bands``, its partitions must equal the noise's bands."""
    detail = sampling.detail
    if not isinstance(detail, CyclicPoisson):
        found = "plain Poisson over all units" if detail is None else type(detail).__name__
        raise ValueError(
            f"Banded correlated noise ({BANDED_MECHANISM}) is proven only under cyclic Poisson (b-min-sep) "
            f"sampling of one example per unit, got {found} sampling (privacy unit {sampling.privacy_unit!r}): with it "
            "a unit can take part in steps closer than b apart, where the noise is correlated. Use "
            "DPDataLoader(dataset, batch_size=B, partitions=b) with noise='banded', bands=b, or independent noise."
        )
    if bands is not None and detail.partitions != bands:
        raise ValueError(
            f"The sampler has {detail.partitions} partitions but the noise has {bands} bands; the amplification "
            f"needs them equal (each unit ≥ b steps apart). Use DPDataLoader(..., partitions={bands}) or bands="
            f"{detail.partitions}."
        )
    return detail


def banded_compositions(sampling: SamplingSpec, steps: int) -> int:
    """k = ⌈n/b⌉: the most steps of a run of n that one partition is sampled in."""
    return math.ceil(steps / check_cyclic_sampling(sampling).partitions)


register_mechanism(
    BANDED_MECHANISM,
    per_example_poisson_gaussian,
    coupled=False,
    privacy_unit=EXAMPLE,
    label="banded MF, cyclic Poisson",
    clipping=("standard",),
    pld=per_example_poisson_gaussian_pld,
    check_sampling=check_cyclic_sampling,
    compositions=banded_compositions,
    description="b-banded correlated noise under cyclic Poisson sampling: DP-SGD at rate p, σ, composed ⌈T/b⌉ times "
    "(Choquette-Choo et al. 2023, Section 4)",
)
