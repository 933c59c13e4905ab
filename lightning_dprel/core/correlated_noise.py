"""Banded correlated noise: the released gradient is g_t + w_t with w = C⁻¹z (banded MF-DP-FTRL, Section 4).

C is lower-triangular Toeplitz with b bands, c_0 = 1, c_1 … c_{b−1}; w_t = z_t − Σ_{j=1}^{b−1} c_j w_{t−j}, so the
generator keeps the b − 1 previous w's. z_t is the DP optimizer's one draw of the keyed stream, scaled by ‖c‖₂ so that
σ is the multiplier of the reduced DP-SGD: each participation moves Cx by ‖c‖·C, against noise σ‖c‖·C (Theorem 4's
reduction). With b = 1 (c = (1,)) the noise is DP-SGD's exactly. The previous w's are noise: they are never written to a
checkpoint, so a run resumed mid-way is refused (:meth:`BandedNoise.load_state_dict`).

References:
    Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu. (Amplified) Banded Matrix Factorization: A unified
    approach to private training. NeurIPS 2023 (arXiv 2306.08153), Section 4 (b-min-sep sampling, amplification).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_dprel.accounting.mechanisms.banded import BANDED_MECHANISM
from lightning_dprel.core.checks import check_int

__all__ = ["BandedNoise", "check_coefficients", "prefix_sum_error", "optimal_coefficients", "refuse_resume"]


def check_coefficients(coefficients: Sequence[float]) -> tuple[float, ...]:
    """c as floats, or a ``ValueError``: finite, c_0 = 1 (C's diagonal; the reduction's column norm is ‖c‖₂)."""
    c = tuple(float(x) for x in coefficients)
    if not c:
        raise ValueError("Banded noise needs at least c_0 = 1 (one band).")
    if not all(math.isfinite(x) for x in c):
        raise ValueError(f"Banded noise coefficients must be finite, got {c}.")
    if c[0] != 1.0:
        raise ValueError(f"Banded noise needs c_0 = 1 (the strategy's diagonal), got c_0 = {c[0]}; divide c by c_0.")
    return c


def prefix_sum_error(coefficients: Sequence[float], steps: int) -> float:
    """‖A C⁻¹‖²_F · ‖c‖² for T = ``steps`` (A: lower-triangular ones): T × the squared prefix-sum RMSE per unit σC.

    C⁻¹ is Toeplitz with impulse response h (h_0 = 1, h_t = −Σ c_j h_{t−j}); entry (i, j) of A C⁻¹ is s_{i−j} = Σ_{k≤i−j}
    h_k, which occurs T − (i − j) times."""
    from scipy.signal import lfilter

    c, steps = np.asarray(check_coefficients(coefficients)), check_int("steps", steps, 1)
    impulse = np.zeros(steps)
    impulse[0] = 1.0
    s = np.cumsum(lfilter([1.0], c, impulse))
    return float(np.sum((steps - np.arange(steps)) * s * s) * np.sum(c * c))


def optimal_coefficients(steps: int, bands: int) -> tuple[float, ...]:
    """c minimising :func:`prefix_sum_error` over c_1 … c_{b−1} (public: depends on T and b only).

    Started from the band of the square-root factorisation A = C_s², c_k = binom(2k, k)/4ᵏ, refined by L-BFGS-B
    within |c_j| < 1."""
    bands, steps = check_int("bands", bands, 1), check_int("steps", steps, 1)
    if bands == 1:
        return (1.0,)
    from scipy.optimize import minimize

    def loss(x: np.ndarray) -> float:
        with np.errstate(all="ignore"):
            value = prefix_sum_error((1.0, *x), steps)
        return math.log(value) if math.isfinite(value) else 1e3  # an unstable C⁻¹: its noise grows without bound

    start = np.array([math.comb(2 * k, k) / 4.0**k for k in range(1, bands)])
    best = minimize(loss, x0=start, method="L-BFGS-B", bounds=[(-0.999, 0.999)] * (bands - 1))
    x = best.x if best.fun <= loss(start) else start
    return check_coefficients((1.0, *x))


class BandedNoise:
    """w = C⁻¹(‖c‖ z) for a b-banded Toeplitz C (the recursion above), stepped once per DP optimizer step.

    Args:
        bands: b ≥ 1; the sampler must be cyclic Poisson with b partitions (each unit ≥ b steps apart).
        coefficients: c_0 = 1, c_1 … c_{b−1} (length b); None: :func:`optimal_coefficients` for ``steps``.
        steps: T, the planned steps (only to choose optimal coefficients).
    """

    #: The mechanism its steps are accounted with (registered in ``accounting/mechanisms/banded.py``).
    mechanism = BANDED_MECHANISM

    def __init__(self, bands: int, coefficients: Sequence[float] | None = None, *, steps: int | None = None) -> None:
        self.bands = check_int("bands", bands, 1)
        if coefficients is None:
            if steps is None and self.bands > 1:
                raise ValueError("BandedNoise needs `coefficients`, or `steps` (T) to choose the optimal ones.")
            coefficients = optimal_coefficients(steps or 1, self.bands)
        self.coefficients = check_coefficients(coefficients)
        if len(self.coefficients) != self.bands:
            raise ValueError(f"BandedNoise(bands={self.bands}) needs {self.bands} coefficients, got {len(self.coefficients)}.")
        self.column_norm = math.sqrt(sum(x * x for x in self.coefficients))  # max column norm of a Toeplitz C
        self.steps = 0  # noise draws so far in this run
        self._previous: deque[Tensor] = deque(maxlen=max(self.bands - 1, 1))  # w_{t−1}, w_{t−2}, …
        self._std: float | None = None

    def correlate(self, z: Tensor, std: float, mechanism: str) -> Tensor:
        """w_t from this step's z_t ~ N(0, std²I): ‖c‖z_t − Σ_j c_j w_{t−j} (σ may not change within a run; the
        step must be accounted with :attr:`mechanism`)."""
        if mechanism != self.mechanism:
            raise RuntimeError(f"Banded noise drawn for a step accounted with {mechanism!r}; only {self.mechanism!r} "
                               "bounds it. Keep the accounting DPOptimizer.set_correlated_noise chose.")
        if not std > 0.0:
            raise ValueError("Banded noise needs σ > 0: a step without noise has no guarantee to amplify.")
        if self._std is not None and not math.isclose(std, self._std, rel_tol=1e-12):
            raise RuntimeError(f"Banded noise: σ·C changed from {self._std} to {std} within a run; the reduction assumes "
                               "one σ. Set σ (calibrate) before the first step.")
        self._std = std
        w = z * self.column_norm
        for j, prev in enumerate(self._previous, start=1):
            if j < self.bands:
                w = w - self.coefficients[j] * prev.to(w.device)
        if self.bands > 1:
            self._previous.appendleft(w)
        self.steps += 1
        return w

    def state_dict(self) -> dict[str, Any]:
        """The strategy and the steps drawn (never the previous w's: they are noise)."""
        return {"bands": self.bands, "coefficients": list(self.coefficients), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Refuse a run resumed mid-way (its previous w's are not saved, and must not be re-drawn)."""
        refuse_resume(state)
        check_coefficients(state.get("coefficients", self.coefficients))

    def __repr__(self) -> str:
        return f"BandedNoise(bands={self.bands}, coefficients={tuple(round(x, 6) for x in self.coefficients)})"


def refuse_resume(state: Mapping[str, Any] | None) -> None:
    """A ``ValueError`` for the saved state of a banded run that took steps (resuming it mid-way is refused)."""
    if state and int(state.get("steps", 0)) > 0:
            raise ValueError(
                f"Refusing to resume a banded correlated-noise run after {state['steps']} steps: its previous noise w's "
                "are not in the checkpoint (they would reveal the noise), and re-drawing them would void the guarantee. "
                "Train a banded run in one fit (a resume or a second fit is refused); start a new run from a fresh model."
            )
