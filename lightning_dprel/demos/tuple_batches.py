"""Build TupleBatch / RankingBatch directly from tensors (no datamodule needed), for tests and examples.

``max_freq`` is computed over the *global* batch with :func:`lightning_dprel.datamodules.edge_tuples.sampling.max_freq` before a
rank takes its slice, as the datamodule contract requires.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dprel.datamodules.edge_tuples.batch import RankingBatch, TupleBatch
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

__all__ = ["build_tuple_batch", "sample_coupled", "ranking_batch", "tokenize_nodes", "entity_removal_pair"]


def build_tuple_batch(
    pos: Tensor,
    neg: Tensor,
    neg_anchor: Tensor,
    node_inputs: dict[str, Tensor],
    *,
    expected_batch_size: float,
    rank: int = 0,
    world_size: int = 1,
    step: int = 0,
) -> TupleBatch:
    """One rank's contiguous slice of the global batch (pos [B,2], neg [B,k], anchors [B,k])."""
    freq = max_freq(pos, neg)
    parts = torch.tensor_split(torch.arange(pos.shape[0]), world_size)
    idx = parts[rank]
    p, n, a, f = pos[idx], neg[idx], neg_anchor[idx], freq[idx]
    nodes = torch.cat([p, n], dim=1)
    node_ids = torch.unique(nodes)
    tuple_nodes = torch.searchsorted(node_ids, nodes.reshape(-1)).reshape(nodes.shape) if nodes.numel() else nodes.long()
    return TupleBatch(
        pos=p,
        neg=n,
        neg_anchor=a,
        max_freq=f,
        node_ids=node_ids,
        tuple_nodes=tuple_nodes,
        node_inputs={key: value[node_ids] for key, value in node_inputs.items()},
        expected_batch_size=float(expected_batch_size),
        global_size=int(pos.shape[0]),
        step=step,
    )


def sample_coupled(edge_index: Tensor, num_nodes: int, *, rate: float, k: int, generator: torch.Generator):
    """Poisson positives at ``rate`` + k negatives per positive drawn without replacement (Algorithm 2)."""
    keep = torch.rand(edge_index.shape[1], generator=generator) < rate
    pos = edge_index[:, keep].t().contiguous()
    size = pos.shape[0]
    assert size * k <= num_nodes, "test batch too large for NEG-SAMPLE-WOR"
    neg = torch.randperm(num_nodes, generator=generator)[: size * k].reshape(size, k)
    anchor = torch.randint(0, 2, (size, k), generator=generator)
    return pos, neg, anchor


def ranking_batch(edges: Tensor, node_inputs: dict[str, Tensor], num_nodes: int) -> RankingBatch:
    """Rank each edge's target (edges [Q, 2]) among all nodes."""
    return RankingBatch(
        node_ids=torch.arange(num_nodes),
        node_inputs=node_inputs,
        query=edges[:, 0].clone(),
        target=edges[:, 1].clone(),
        candidates=None,
    )


def tokenize_nodes(path: str, texts: list[str], max_length: int = 12) -> dict[str, Tensor]:
    """Tokenise node texts with the tokenizer stored at ``path`` (padding to ``max_length``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def entity_removal_pair(k: int) -> tuple[tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
    """Entity-level neighbours (B, B') of 8 tuples: node 0 has 2 positive tuples and one negative slot (tuple 5, which is
    tuple 3 of B'); B' drops its positives and gives the slot to a fresh node 59 (i = 2, j = 1). Each is (pos, neg, anchor)."""
    u, z = 0, 59
    pos = torch.tensor([[u, 1], [u, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14]])
    neg = torch.arange(20, 20 + 8 * k).reshape(8, k)
    neg[5, 1] = u
    anchor = torch.randint(0, 2, (8, k), generator=torch.Generator().manual_seed(3))
    neg2 = neg[2:].clone()
    neg2[3, 1] = z
    return (pos, neg, anchor), (pos[2:], neg2, anchor[2:])
