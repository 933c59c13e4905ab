"""The coupled edge-tuple family's batch records (the relational method's and AdvSGM's), datamodule → module (one way).

References:
    Huang et al., Algorithm 2 (NEG-SAMPLE-WOR), Algorithm 1 (max-freq), Algorithm 3 (training loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from lightning_dprel.core.batch import PrivateBatch

__all__ = ["TupleBatch", "RankingBatch", "tuple_inputs"]


@dataclass
class TupleBatch(PrivateBatch):
    """One rank's slice of a coupled training batch of edge tuples (``expected_batch_size`` and ``step``, keyword-only,
    come from :class:`~lightning_dprel.core.batch.PrivateBatch`).

    Tuple i is (e_i⁺, e_{i,1}⁻, …, e_{i,k}⁻) with e_i⁺ = (u_i, v_i) and e_{i,j}⁻ = (w_{i,j}, z_{i,j}),
    where w_{i,j} is a uniformly random end of e_i⁺ and z_{i,j} a negative node.

    Attributes:
        pos: ``[B, 2]`` global node ids (u_i, v_i) of the positive edges.
        neg: ``[B, k]`` global node ids z_{i,j} of the negative nodes.
        neg_anchor: ``[B, k]`` in {0, 1}: w_{i,j} = pos[i, neg_anchor[i, j]].
        max_freq: ``[B]`` Algorithm 1's max-freq(T_i), counted over the *global* batch (all ranks).
        node_ids: ``[U]`` unique global ids of the nodes of this slice.
        tuple_nodes: ``[B, 2 + k]`` indices into ``node_ids``: columns (u, v, z_1, …, z_k).
        node_inputs: per unique node, aligned with ``node_ids``: ``{"input_ids", "attention_mask"}``
            (tokenised text) or ``{"x"}`` (dense features).
        global_size: |E⁺| of the global batch (all ranks).
    """

    pos: Tensor
    neg: Tensor
    neg_anchor: Tensor
    max_freq: Tensor
    node_ids: Tensor
    tuple_nodes: Tensor
    node_inputs: dict[str, Tensor]
    global_size: int

    @property
    def size(self) -> int:
        """Number of tuples in this slice (may be 0: an empty Poisson sample is a real step)."""
        return int(self.pos.shape[0])

    @property
    def neg_per_pos(self) -> int:
        return int(self.neg.shape[1])


@dataclass
class RankingBatch:
    """Relation-prediction queries for PREC@1 / MRR (Section 5.2).

    For query q with relation (u_q, v_q), the candidates are ``candidates[q]`` (indices into
    ``node_ids``), or every node of ``node_ids`` when ``candidates`` is None; the target is v_q.

    Attributes:
        node_ids: ``[U]`` global ids of all nodes needed by these queries.
        node_inputs: per node, aligned with ``node_ids`` (as in :class:`TupleBatch`).
        query: ``[Q]`` indices into ``node_ids`` of u_q.
        target: ``[Q]`` indices into ``node_ids`` of v_q.
        candidates: ``[Q, C]`` indices into ``node_ids`` (the target included), or None for all nodes.
    """

    node_ids: Tensor
    node_inputs: dict[str, Tensor]
    query: Tensor
    target: Tensor
    candidates: Tensor | None = None
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.query.shape[0])


def tuple_inputs(batch: TupleBatch) -> dict[str, Tensor]:
    """Gather each tuple's node inputs: ``node_inputs[key][tuple_nodes]`` → ``[B, 2 + k, ...]``."""
    if batch.tuple_nodes.dim() != 2 or batch.tuple_nodes.shape[1] != 2 + batch.neg_per_pos:
        raise ValueError(
            f"`tuple_nodes` must have shape [B, 2 + k] = [{batch.size}, {2 + batch.neg_per_pos}], "
            f"got {tuple(batch.tuple_nodes.shape)}."
        )
    idx = batch.tuple_nodes.long()
    return {key: value[idx] for key, value in batch.node_inputs.items()}
