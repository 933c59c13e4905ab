"""Ranking evaluation (Section 5.2): candidate sets and the rank of each query's true target (PREC@1, MRR)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_dprel.methods.relational.losses import pair_scores, score_matrix
from lightning_dprel.core.randomness import check_source
from lightning_dprel.methods.relational.sampling import sample_without_replacement

__all__ = ["target_ranks", "sample_eval_candidates"]


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


def sample_eval_candidates(
    query: Tensor, target: Tensor, num_nodes: int, num_negatives: int, *, generator: Any
) -> Tensor:
    """Candidate sets for relation prediction (Section 5.2): the target plus N distinct sampled negatives.

    For query q with relation (u_q, v_q), the N negatives are drawn uniformly without replacement from
    V \\ {u_q, v_q}; column 0 of the result is v_q.

    Args:
        query: ``[Q]`` node ids u_q.
        target: ``[Q]`` node ids v_q (≠ u_q).
        num_nodes: n of the evaluation graph; needs N ≤ n − 2.
        num_negatives: N ≥ 1.
        generator: the source of randomness.

    Returns:
        ``[Q, 1 + N]`` global node ids.
    """
    check_source(generator, "generator")
    if num_negatives < 1 or num_negatives > num_nodes - 2:
        raise ValueError(
            f"`eval_candidates` must be in [1, n - 2] = [1, {num_nodes - 2}] for a graph of {num_nodes} nodes, "
            f"got {num_negatives}; lower it or use None (rank against all nodes)."
        )
    num_q = query.numel()
    lo, hi = torch.minimum(query, target).long(), torch.maximum(query, target).long()
    draws = torch.empty(num_q, num_negatives, dtype=torch.long)
    for i in range(num_q):  # one WOR draw per query from [0, n - 2); shifted past u_q, v_q below
        draws[i] = sample_without_replacement(num_nodes - 2, num_negatives, generator=generator)
    draws = draws + (draws >= lo[:, None]).long()
    draws = draws + (draws >= hi[:, None]).long()
    return torch.cat([target.long()[:, None], draws], dim=1)
