"""Ranking evaluation (Section 5.2): the rank of each query's true target (PREC@1, MRR)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dprel.methods.relational.losses import pair_scores, score_matrix

__all__ = ["target_ranks"]


def target_ranks(
    h: Tensor,
    query: Tensor,
    target: Tensor,
    candidates: Tensor | None,
    *,
    score: str,
    temperature: float,
) -> Tensor:
    """Rank (1 = best) of each query's target among its candidates by s(u_q, ·) (Section 5.2).

    Pessimistic: ties and NaN count against the target (rank = 1 + #candidates other than it that score ≥
    the target or NaN; a NaN target score ranks last). With ``candidates=None`` every node but the query
    itself is a candidate.

    Args:
        h: ``[U, d]`` embeddings of the batch's nodes.
        query, target: ``[Q]`` indices into ``h``.
        candidates: ``[Q, C]`` indices into ``h`` containing the target, or None.

    Returns:
        ``[Q]`` long ranks.
    """
    hq = h[query]
    if candidates is None:
        scores = score_matrix(hq, h, score=score, temperature=temperature)  # [Q, U], one matmul
        is_target = torch.zeros_like(scores, dtype=torch.bool)
        is_target[torch.arange(len(query)), target] = True
        excluded = torch.zeros_like(is_target)
        excluded[torch.arange(len(query)), query] = True
        excluded &= ~is_target
    else:
        scores = pair_scores(hq.unsqueeze(1), h[candidates], score=score, temperature=temperature)  # [Q, C]
        is_target = candidates == target.unsqueeze(1)
        if not bool(is_target.any(1).all()):
            raise ValueError("Every row of `candidates` must contain its query's target (RankingBatch contract).")
        first = is_target.float().argmax(1)
        is_target = torch.zeros_like(is_target)
        is_target[torch.arange(len(query)), first] = True
        excluded = torch.zeros_like(is_target)
    target_score = scores[is_target].unsqueeze(1)
    beats = ((scores >= target_score) | scores.isnan() | target_score.isnan()) & ~is_target & ~excluded
    return 1 + beats.sum(1)


