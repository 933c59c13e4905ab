"""Ranking metrics of held-out entities over all public items: torchmetrics' retrieval metrics for reports, and the
same MAP and recall@k computed by one sort on the scores' device for checkpoint selection (tested to agree)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ranking_metrics", "fast_ranking_metrics"]


def _checked(scores: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    if scores.shape != target.shape or scores.dim() != 2:
        raise ValueError(f"`scores` and `target` must be [E, n_items] alike, got {tuple(scores.shape)} and {tuple(target.shape)}.")
    keep = target.any(1)  # entities without a relevant item are skipped
    return scores[keep], target[keep].bool()


def ranking_metrics(scores: Tensor, target: Tensor, *, top_k: int = 20) -> dict[str, float]:
    """MAP and recall@``top_k`` of ``scores`` ``[E, n_items]`` against the boolean ``target`` (torchmetrics)."""
    from torchmetrics.retrieval import RetrievalMAP, RetrievalRecall

    scores, target = _checked(scores, target)
    index = torch.arange(scores.size(0), device=scores.device)[:, None].expand_as(scores).reshape(-1)
    # shifted to >= 1 per row (order kept): torchmetrics counts a prediction <= 0 as not retrieved
    preds = (scores.double() - scores.double().amin(1, keepdim=True) + 1.0).reshape(-1)
    tgt = target.reshape(-1)
    out = {"map": RetrievalMAP()(preds, tgt, indexes=index), f"recall@{top_k}": RetrievalRecall(top_k=top_k)(preds, tgt, indexes=index)}
    return {k: float(v) for k, v in out.items()}


def fast_ranking_metrics(scores: Tensor, target: Tensor, *, top_k: int = 20) -> dict[str, float]:
    """The same MAP and recall@``top_k`` by one descending sort per row, on the scores' device."""
    scores, target = _checked(scores, target)
    hits = torch.gather(target, 1, scores.argsort(dim=1, descending=True)).to(torch.float64)
    ranks = torch.arange(1, hits.size(1) + 1, device=hits.device, dtype=torch.float64)
    relevant = hits.sum(1)
    ap = (hits.cumsum(1) / ranks * hits).sum(1) / relevant
    recall = hits[:, :top_k].sum(1) / relevant
    return {"map": float(ap.mean()), f"recall@{top_k}": float(recall.mean())}
