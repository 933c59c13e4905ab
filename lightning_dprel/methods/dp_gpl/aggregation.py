"""Confident-GNMax (Papernot et al. 2018, Alg. 1; DP-GPL Alg. 2, step 4): noisy-threshold, then noisy-argmax votes.

A query j with vote counts c_j is answered iff max_m c_{j,m} + N(0, σ₁²) ≥ T; an answered query gets the label
argmax_m (c_{j,m} + N(0, σ₂²)). Both noises come from a :class:`~lightning_dprel.core.randomness.KeyedStream`, so a run
never replays them. What one labelled private node can change (it reaches exactly one teacher): one vote, so the max
count moves by ≤ 1 (threshold: α/(2σ₁²) per query) and the histogram by ≤ √2 in ℓ₂ (GNMax: α/σ₂² per answered query).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int, positive_finite
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.randomness import KeyedStream, check_stream

__all__ = ["vote_histogram", "Answers", "confident_gnmax", "gnmax", "pate_releases"]


def vote_histogram(votes: Tensor, num_classes: int) -> Tensor:
    """Counts [Q, C] of the teachers' votes ``votes`` [N, Q] (class ids in [0, C)); Alg. 2, step 3."""
    if votes.dim() != 2 or votes.dtype.is_floating_point:
        raise ValueError(f"`votes` must be an integer tensor [teachers, queries], got {tuple(votes.shape)} {votes.dtype}.")
    if votes.numel() and (int(votes.min()) < 0 or int(votes.max()) >= num_classes):
        raise ValueError(f"`votes` holds classes outside [0, {num_classes}).")
    q = votes.shape[1]
    counts = torch.zeros(q, num_classes, dtype=torch.float64)
    counts.scatter_add_(1, votes.t().long(), torch.ones(q, votes.shape[0], dtype=torch.float64))
    return counts


@dataclass(frozen=True)
class Answers:
    """The released part of an aggregation: which queries were answered and their noisy labels (−1: unanswered)."""

    answered: Tensor
    labels: Tensor

    @property
    def num_answered(self) -> int:
        return int(self.answered.sum())


def confident_gnmax(counts: Tensor, *, threshold: float, sigma_threshold: float, sigma_vote: float,
                    stream: KeyedStream, max_answers: int | None = None) -> Answers:
    """Confident-GNMax on vote counts [Q, C] (Papernot et al. 2018, Alg. 1), noise from ``stream`` (never replayed);
    with ``max_answers`` = A, queries are taken in order and answering stops after A answers (the budget filter)."""
    if counts.dim() != 2 or counts.shape[1] < 2:
        raise ValueError(f"`counts` must be [queries, classes ≥ 2], got {tuple(counts.shape)}.")
    positive_finite("sigma_threshold (σ₁, the threshold noise)", sigma_threshold)
    positive_finite("sigma_vote (σ₂, the vote noise)", sigma_vote)
    check_stream(stream)
    q, c = counts.shape
    counts = counts.to(torch.float64)
    gate = counts.max(dim=1).values + stream.normal(q, float(sigma_threshold), dtype=torch.float64)
    answered = gate >= float(threshold)
    if max_answers is not None:
        answered &= answered.cumsum(0) <= int(max_answers)
    noisy = counts + stream.normal(q * c, float(sigma_vote), dtype=torch.float64).view(q, c)
    labels = torch.where(answered, noisy.argmax(dim=1), torch.full((q,), -1, dtype=torch.long))
    return Answers(answered, labels)


def gnmax(counts: Tensor, *, sigma_vote: float, stream: KeyedStream) -> Answers:
    """GNMax on vote counts [Q, C] (Papernot et al. 2018, Sec. 4.1): every query answered with argmax_m (c_m + N(0, σ²))."""
    if counts.dim() != 2 or counts.shape[1] < 2:
        raise ValueError(f"`counts` must be [queries, classes ≥ 2], got {tuple(counts.shape)}.")
    positive_finite("sigma_vote (σ₂, the vote noise)", sigma_vote)
    check_stream(stream)
    q, c = counts.shape
    noisy = counts.to(torch.float64) + stream.normal(q * c, float(sigma_vote), dtype=torch.float64).view(q, c)
    return Answers(torch.ones(q, dtype=torch.bool), noisy.argmax(dim=1))


def pate_releases(*, sigma_threshold: float | None, sigma_vote: float, queries: int, answer_slots: int | None = None,
                  unit: str = "labelled_node") -> tuple[GaussianRelease, ...]:
    """The data-independent charge of ``queries`` Confident-GNMax queries: Gaussian releases of sensitivity C = 1
    (the max count, σ₁) on every query and C = √2 (the histogram, σ₂ → multiplier σ₂/√2) on every answer slot: all
    ``queries`` by default; ``answer_slots`` = A fixed before the run when answering stops after A answers. A filter over
    Gaussian mechanisms, whose costs α·ρ are fixed in advance and sum to at most ρ_B, is ρ_B-zCDP (Feldman & Zrnic 2021,
    RDP filter at every order), so the A slots are charged whether or not they are used. ``sigma_threshold=None``:
    :func:`gnmax` (no threshold), only the vote releases."""
    slots = int(queries) if answer_slots is None else min(int(answer_slots), int(queries))
    check_int("answer_slots", slots, 1)
    vote = GaussianRelease(float(sigma_vote) / 2.0**0.5, unit, slots)
    return (vote,) if sigma_threshold is None else (GaussianRelease(float(sigma_threshold), unit, int(queries)), vote)
