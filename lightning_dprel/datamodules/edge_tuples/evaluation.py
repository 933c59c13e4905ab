"""Relation-prediction queries (Section 5.2): one graph's ranking queries → RankingBatch, sliced per DDP rank."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from lightning_dprel.datamodules.edge_tuples.rows import gather_rows, one_thread, slice_rows
from lightning_dprel.datamodules.edge_tuples.batch import RankingBatch
from lightning_dprel.core.randomness import check_source
from lightning_dprel.datamodules.edge_tuples.sampling import sample_without_replacement

__all__ = ["EvalSet", "eval_queries", "ranking_batch", "RankingStream"]


@dataclass
class EvalSet:
    """One evaluation graph's cached node inputs and its ranking queries (targets, optional candidates)."""

    num_nodes: int
    inputs: dict[str, Tensor]
    query: Tensor
    target: Tensor
    cands: Tensor | None


def eval_queries(
    edges: Tensor, num_nodes: int, inputs: dict[str, Tensor], *, generator: torch.Generator,
    max_queries: int | None, candidates: int | None,
) -> EvalSet:
    """Rank v among the candidates for each relation (u, v): a subset of ``max_queries`` relations, and
    either all nodes (``candidates=None``) or v plus ``candidates`` nodes drawn without replacement.

    ``generator`` is PUBLIC (seeded from the datamodule's ``seed``): evaluation is outside the guarantee."""
    if max_queries is not None and edges.shape[1] > max_queries:
        keep = sample_without_replacement(edges.shape[1], max_queries, generator=generator)
        edges = edges[:, torch.sort(keep).values]
    cands = None
    if candidates is not None:
        cands = sample_eval_candidates(edges[0], edges[1], num_nodes, candidates, generator=generator)
    return EvalSet(num_nodes, inputs, edges[0], edges[1], cands)


def ranking_batch(ev: EvalSet, rows: Tensor) -> RankingBatch:
    """Queries ``rows`` of ``ev`` as one RankingBatch (global ids mapped to indices into ``node_ids``)."""
    query, target = ev.query[rows], ev.target[rows]
    if ev.cands is None:
        node_ids = torch.arange(ev.num_nodes)
        return RankingBatch(
            node_ids=node_ids,
            node_inputs=gather_rows(ev.inputs, node_ids, trim=True),
            query=query,
            target=target,
            candidates=None,
            meta={"exclude_query": True},  # the module must not rank u itself
        )
    node_ids, inverse = torch.unique(torch.cat([query[:, None], ev.cands[rows]], dim=1), return_inverse=True)
    return RankingBatch(
        node_ids=node_ids,
        node_inputs=gather_rows(ev.inputs, node_ids, trim=True),
        query=inverse[:, 0],
        target=inverse[:, 1],
        candidates=inverse[:, 1:],
        meta={"exclude_query": False},
    )


class RankingStream(IterableDataset):
    """Rank ``rank``'s contiguous block of queries in batches of ``batch_size``; every rank gets as many batches."""

    def __init__(self, ev: EvalSet, batch_size: int, world: Callable[[], tuple[int, int]]) -> None:
        self.ev, self.batch_size, self.world = ev, batch_size, world

    def _rows(self) -> list[Tensor]:
        rank, world = self.world()
        num_q = self.ev.query.numel()
        per_rank = math.ceil(num_q / world)
        num_batches = max(1, math.ceil(per_rank / self.batch_size))
        return list(torch.tensor_split(slice_rows(num_q, rank, world), num_batches))

    def __len__(self) -> int:
        return len(self._rows())

    def __iter__(self) -> Iterator[RankingBatch]:
        for rows in self._rows():
            with one_thread():
                batch = ranking_batch(self.ev, rows)
            yield batch


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
