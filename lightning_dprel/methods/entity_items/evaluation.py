"""Ranking metrics of held-out entities over all public items (torchmetrics' retrieval metrics)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ranking_metrics"]


def ranking_metrics(scores: Tensor, target: Tensor, *, top_k: int = 20) -> dict[str, float]:
    """MAP and recall@``top_k`` of ``scores`` ``[E, n_items]`` against the boolean ``target`` (entities without a
    relevant item are skipped)."""
    from torchmetrics.retrieval import RetrievalMAP, RetrievalRecall

    if scores.shape != target.shape or scores.dim() != 2:
        raise ValueError(f"`scores` and `target` must be [E, n_items] alike, got {tuple(scores.shape)} and {tuple(target.shape)}.")
    keep = target.any(1)
    scores, target = scores[keep], target[keep]
    index = torch.arange(scores.size(0))[:, None].expand_as(scores).reshape(-1)
    preds, tgt = scores.reshape(-1), target.reshape(-1)
    out = {"map": RetrievalMAP()(preds, tgt, indexes=index), f"recall@{top_k}": RetrievalRecall(top_k=top_k)(preds, tgt, indexes=index)}
    return {k: float(v) for k, v in out.items()}
