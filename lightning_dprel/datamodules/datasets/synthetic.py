"""Seeded synthetic graph pairs (text or dense features) for tests, docs and quick runs."""

from __future__ import annotations

from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource
from lightning_dprel.demos import random_feature_graph, random_text_graph

__all__ = ["SyntheticGraphs"]


class SyntheticGraphs(GraphSource):
    """A train graph and an independent test graph from :mod:`lightning_dprel.demos`.

    Args:
        kind: ``"text"`` (node text over a closed vocabulary) or ``"features"`` (dense ``x``).
        num_nodes: nodes per graph.
        num_edges: edges per graph (before cleaning and capping).
        dim: feature dimension for ``kind="features"``.
        seed: the train graph uses ``seed``, the test graph ``seed + 1``.
        with_val: also a validation graph (seed ``seed + 2``), for checkpoint selection.
    """

    def __init__(self, kind: str = "text", num_nodes: int = 60, num_edges: int = 150, dim: int = 16, seed: int = 0, with_val: bool = False) -> None:
        if kind not in ("text", "features"):
            raise ValueError(f"`kind` must be 'text' or 'features', got {kind!r}.")
        self.kind, self.num_nodes, self.num_edges, self.dim, self.seed = kind, num_nodes, num_edges, dim, seed
        self.with_val = bool(with_val)

    def _one(self, seed: int):
        if self.kind == "text":
            return random_text_graph(self.num_nodes, self.num_edges, seed=seed)
        return random_feature_graph(self.num_nodes, self.num_edges, dim=self.dim, seed=seed)

    def load(self) -> GraphPair:
        val = self._one(self.seed + 2) if self.with_val else None
        return GraphPair(train=self._one(self.seed), test=self._one(self.seed + 1), val=val, name=f"synthetic {self.kind} graphs")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, num_nodes={self.num_nodes}, seed={self.seed})"
