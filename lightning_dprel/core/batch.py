"""The batch records a private datamodule hands its module, one type per sampling family, all on one base.

:class:`PrivateBatch` carries what every private step needs from its sample: b (the step divides the noised sum by
the *expected* batch size, never by the drawn one; Algorithm 3, line 5) and ``step``, the global step that drew the
sample (the sample token: releases made on one batch are one step on one sample). The coupled edge-tuple family's
batch is :class:`~lightning_dprel.datamodules.edge_tuples.batch.TupleBatch`; the per-example Poisson family's (DP-SGD,
Abadi et al. 2016, Alg. 1; DP-GCN's subgraphs, DP-GPL's labelled nodes) is :class:`ExampleBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_dprel.core.checks import check_int, positive_finite

__all__ = ["PrivateBatch", "ExampleBatch"]


@dataclass(kw_only=True)
class PrivateBatch:
    """What every private training batch carries (keyword-only, after a subclass's own fields).

    Attributes:
        expected_batch_size: b of the global batch (b = γ·m); the private step divides by it.
        step: the global step index that drew this batch: its sample token (no default, so that no two samples share
            one by omission).
    """

    expected_batch_size: float
    step: int

    def __post_init__(self) -> None:
        b = self.expected_batch_size
        positive_finite("expected_batch_size", b)
        check_int("step (the sample token)", self.step, 0)


@dataclass
class ExampleBatch(PrivateBatch):
    """One step of per-example Poisson sampling: the examples kept at rate γ (one per privacy unit) and their labels.

    Attributes:
        examples: the method's examples (a list of DP-GCN's subgraph tuples, or DP-GPL's disjoint union of ego graphs,
            an ``EgoBatch``); may be empty: an empty Poisson sample is a real step.
        labels: ``[B]`` class ids when the examples do not hold them (None otherwise).
    """

    examples: Any
    labels: Tensor | None = None

    @property
    def size(self) -> int:
        """The number of examples drawn (B)."""
        n = getattr(self.examples, "size", None)
        return int(n) if isinstance(n, int) else len(self.examples)
