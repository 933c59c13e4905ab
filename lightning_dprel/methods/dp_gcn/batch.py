"""DP-GCN's evaluation batch, datamodule → module (its training steps are :class:`~lightning_dprel.core.batch.ExampleBatch`
es of subgraph examples, the per-example Poisson family's batch).

References:
    Igamberdiev, Habernal 2022, Section 4 (random graph splits).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["NodeEvalBatch"]


@dataclass
class NodeEvalBatch:
    """Evaluation on the whole graph (outside the guarantee's training data): logits of every node, scored on ``mask``."""

    x: Tensor
    edge_index: Tensor
    y: Tensor
    mask: Tensor
