"""Coupled relational sampling as pure tensor functions (Algorithms 1-3 of Huang et al.).

Every random function takes an explicit ``torch.Generator``; the datamodule wires them together.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["max_freq"]


def max_freq(pos: Tensor, neg: Tensor) -> Tensor:
    """Algorithm 1's max-freq(T_i): the max over the tuple's nodes of the number of tuples they occur in.

    A node is counted once per tuple even if it fills two roles there (a negative may equal an end of
    its own positive). Vectorised over the whole logical batch.

    Args:
        pos: ``[B, 2]`` positive edges (global node ids).
        neg: ``[B, k]`` negative nodes (global node ids).

    Returns:
        ``[B]`` long tensor, each entry ≥ 1 (empty when B = 0).
    """
    if pos.dim() != 2 or pos.shape[1] != 2:
        raise ValueError(f"`pos` must have shape [B, 2], got {tuple(pos.shape)}.")
    if neg.dim() != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"`neg` must have shape [B, k] with B = {pos.shape[0]}, got {tuple(neg.shape)}.")
    nodes = torch.cat([pos, neg], dim=1).long()
    if nodes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=pos.device)
    nodes, _ = torch.sort(nodes, dim=1)
    first = torch.ones_like(nodes, dtype=torch.bool)
    first[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
    uniq, inverse = torch.unique(nodes, return_inverse=True)
    freq = torch.zeros(uniq.numel(), dtype=torch.long, device=pos.device)
    freq.scatter_add_(0, inverse[first], torch.ones_like(inverse[first]))
    return freq[inverse].max(dim=1).values
