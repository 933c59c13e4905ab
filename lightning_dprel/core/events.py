"""Privacy events: what a run released, as data the ledger composes (after dp-accounting's ``dp_event.py``).

* :class:`StepRecord` — one noised sum of clipped per-example gradients, as a DP optimizer drew it (Alg. 3, l. 4-6).
* :class:`SampledGaussianStep` — every noised sum released on one sample: n releases with multipliers σ_r on the
  same Poisson sample are one sampled Gaussian release on the concatenated sum with
  σ_eff = (Σ_r σ_r⁻²)^(-1/2) (each release r has sensitivity C_r·f and noise σ_r·C_r; scaled by 1/(σ_r C_r) the
  concatenation has sensitivity f·(Σ σ_r⁻²)^(1/2) and unit noise). Charging them as independent steps under-states ε.
* :class:`GaussianRelease` — a statistic of sensitivity ≤ C for a stated unit, released with N(0, σ²C²) and no
  sampling (Mironov 2017, Prop. 7: α/(2σ²) per release).

Compatibility rule (as ``dp_event.py``): fields are never removed and never change meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_dprel.core.checks import check_int
from lightning_dprel.core.specs import NoiseSpec, privacy_unit

__all__ = ["StepRecord", "SampledGaussianStep", "GaussianRelease", "effective_noise_multiplier"]


@dataclass(frozen=True)
class StepRecord:
    """One noised release of a DP optimizer step (Algorithm 3, lines 4-6).

    Attributes:
        mechanism: the accountant mechanism of the module's clipping and accounting (``"none"``: baseline).
        noise_multiplier: σ; the noise drawn had std ``noise_std`` = σ·C (0 when σ = 0).
        clip_norm: C. clipping: a registered clipping mode (``"standard"``, ``"none"``, a method's).
        noise_std: the standard deviation the Gaussian was drawn with.
        expected_batch_size: the b the clipped, noised sum was divided by.
    """

    mechanism: str
    noise_multiplier: float
    clip_norm: float
    clipping: str
    noise_std: float
    expected_batch_size: float

    @classmethod
    def from_spec(cls, spec: NoiseSpec, expected_batch_size: float) -> "StepRecord":
        """The record of a step that drew N(0, (σC)²I) per ``spec`` (for modules with their own optimizer)."""
        std = spec.noise_multiplier * spec.clip_norm if spec.noise_multiplier > 0.0 else 0.0
        return cls(spec.mechanism, spec.noise_multiplier, spec.clip_norm, spec.clipping, std, float(expected_batch_size))

    @property
    def is_private(self) -> bool:
        return self.mechanism != "none" and self.noise_multiplier > 0.0

    def check(self) -> None:
        """Refuse a record whose noise std is not σ·C (the accountant would charge a σ the noise did not have)."""
        drawn = self.noise_multiplier * self.clip_norm if self.noise_multiplier > 0.0 else 0.0
        if not math.isclose(self.noise_std, drawn, rel_tol=1e-12, abs_tol=0.0):
            raise RuntimeError(
                f"Step record: noise drawn with std {self.noise_std} but σ·C = {drawn}; the accountant would charge "
                "a σ the noise did not have."
            )


def effective_noise_multiplier(sigmas: "tuple[float, ...] | list[float]") -> float:
    """σ_eff = (Σ σ_r⁻²)^(-1/2) of several Gaussian releases of one sample (0 if any release had no noise).

    >>> round(effective_noise_multiplier([1.0, 1.0]), 6)  # two releases at σ = 1: one at σ/√2
    0.707107
    >>> effective_noise_multiplier([2.0, 0.0])  # an un-noised release voids the step
    0.0
    """
    if not sigmas or any(s <= 0.0 for s in sigmas):
        return 0.0
    return 1.0 / math.sqrt(sum(1.0 / (s * s) for s in sigmas))


@dataclass(frozen=True)
class SampledGaussianStep:
    """Every noised release made on one sample: one sampled Gaussian release with σ_eff (see the module docstring)."""

    records: tuple[StepRecord, ...]

    def __post_init__(self) -> None:
        if not self.records:
            raise ValueError("A SampledGaussianStep needs at least one StepRecord.")
        private = [r for r in self.records if r.is_private]
        names = {(r.mechanism, r.clipping) for r in private}
        if len(names) > 1:
            raise ValueError(
                f"Releases on one sample with different mechanisms {sorted(names)} cannot be charged as one sampled "
                "Gaussian release (their sensitivity profiles differ); use one clipping and accounting per sample."
            )
        sizes = {r.expected_batch_size for r in self.records}
        if len(sizes) > 1:
            raise ValueError(f"Releases on one sample divided by different expected batch sizes {sorted(sizes)}.")

    @property
    def is_private(self) -> bool:
        return all(r.is_private for r in self.records)

    @property
    def mechanism(self) -> str:
        return self.records[0].mechanism if self.is_private else "none"

    @property
    def noise_multiplier(self) -> float:
        return effective_noise_multiplier([r.noise_multiplier for r in self.records])

    @property
    def releases(self) -> int:
        return len(self.records)


@dataclass(frozen=True)
class GaussianRelease:
    """``count`` releases of a statistic of sensitivity ≤ C for ``unit``, each with N(0, σ²C²) and no sampling."""

    noise_multiplier: float
    unit: str
    count: int = 1

    def __post_init__(self) -> None:
        privacy_unit(self.unit)
        if not (float(self.noise_multiplier) > 0.0) or math.isinf(self.noise_multiplier):
            raise ValueError(f"A GaussianRelease needs σ > 0 and finite, got {self.noise_multiplier}.")
        check_int("count", self.count, 1)

    mechanism = "gaussian"
