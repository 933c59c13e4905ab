"""DP-GCN's batch records, flowing datamodule → module (one way): sampled subgraph examples and evaluation graphs.

References:
    Igamberdiev, Habernal 2022, Section 4 (random graph splits).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["SubgraphBatch", "NodeEvalBatch"]


@dataclass
class SubgraphBatch:
    """One step of DP-GCN: the sampled subgraph examples (Igamberdiev & Habernal 2022, random graph splits).

    Example j is ``(x, edge_index, y, loss_mask)`` with ``edge_index`` local to its ``x``: in the provable mode its
    subgraph alone (edges to other subgraphs masked); in the paper-faithful full-graph mode the whole training graph
    with ``loss_mask`` on the subgraph's nodes.

    Attributes:
        examples: the examples of this step (may be empty: an empty Poisson sample is a real step).
        expected_batch_size: b = q·s, the expected number of examples; the private step divides by it.
        step: the global step that drew this batch.
    """

    examples: list[tuple[Tensor, Tensor, Tensor, Tensor]]
    expected_batch_size: float
    step: int = 0

    @property
    def size(self) -> int:
        return len(self.examples)


@dataclass
class NodeEvalBatch:
    """Evaluation on the whole graph (outside the guarantee's training data): logits of every node, scored on ``mask``."""

    x: Tensor
    edge_index: Tensor
    y: Tensor
    mask: Tensor
