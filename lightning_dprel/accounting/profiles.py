"""Sensitivity profiles Δ(i, j)/C of the coupled-sampling mechanism (spec: "FREQ-CLIP's sensitivity").

i ∈ {0..K} is the number of the removed entity's positive tuples in the batch, j ∈ {0, 1} whether it also
fills a negative slot. Every profile has Δ(0, 0) = 0 and values on the grid 1/4·ℕ (so Theorem C.1's exact
polynomial form applies). Returned as a (K+1, 2) float array in units of the clip norm C.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["paper_profile", "freq_corrected_profile", "standard_profile", "PROFILES"]


def _grid(max_degree: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(max_degree + 1, dtype=float)[:, None]
    j = np.arange(2, dtype=float)[None, :]
    return i, j


def paper_profile(max_degree: int, neg_per_pos: int) -> np.ndarray:
    """Δ ≡ C (Proposition 4.1 as published): the mixture is (1−Γ)N(0,σ²) + Γ N(1,σ²), i.e. the paper's Eq. 3."""
    out = np.ones((max_degree + 1, 2))
    out[0, 0] = 0.0
    return out


def freq_corrected_profile(max_degree: int, neg_per_pos: int) -> np.ndarray:
    """Δ_freq(i, j) = C(1/2 + 3j/4 + i(1+k)/4) for (i, j) ≠ (0, 0): FREQ-CLIP's sensitivity that holds."""
    i, j = _grid(max_degree)
    out = 0.5 + 0.75 * j + i * (1.0 + neg_per_pos) / 4.0
    out[0, 0] = 0.0
    return out


def standard_profile(max_degree: int, neg_per_pos: int) -> np.ndarray:
    """Δ_std(i, j) = C(i + 2j): standard per-tuple clipping (Eq. 2; Theorem C.1)."""
    i, j = _grid(max_degree)
    return i + 2.0 * j


#: Profile name → function (max_degree, neg_per_pos) → (K+1, 2) array.
PROFILES: dict[str, Callable[[int, int], np.ndarray]] = {
    "freq_paper": paper_profile,
    "freq_corrected": freq_corrected_profile,
    "standard": standard_profile,
}
