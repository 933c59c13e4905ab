"""Graph sources: anything that yields a train graph and (optionally) a separate test graph."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import coalesce

from lightning_dprel.core.checks import check_int
from lightning_dprel.datamodules.graph_splits import public_id_uniforms

__all__ = ["GraphPair", "GraphSource", "PyGSource"]


@dataclass
class GraphPair:
    """A train graph and, for zero-shot transfer, a separate test graph (None: split the train graph).

    ``val`` is an optional *public validation* graph, disjoint from both, on which checkpoints and
    hyper-parameters are chosen (never on ``test``).
    """

    train: Data
    test: Data | None = None
    name: str = ""
    val: Data | None = None


class GraphSource(ABC):
    """A configurable, offline loader of a :class:`GraphPair` (YAML-friendly: plain init arguments)."""

    #: The init arguments ``repr`` names, in order (a source's repr is its identity: stable node ids are keyed by it).
    repr_fields: tuple[str, ...] = ()

    def __repr__(self) -> str:
        if not self.repr_fields:
            return super().__repr__()
        return f"{type(self).__name__}(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.repr_fields) + ")"

    @abstractmethod
    def load(self) -> GraphPair:
        """Read the data and return the graphs. Raise ``FileNotFoundError``/``ValueError`` naming the problem."""


class PyGSource(GraphSource):
    """Any ``torch_geometric.datasets`` class (or a dotted class path) that needs no download.

    Example: ``PyGSource("FakeDataset", num_graphs=1, avg_num_nodes=500, num_channels=16)``.

    Args:
        dataset: a class name in ``torch_geometric.datasets`` or a dotted path ``pkg.mod.Class``.
        index: which graph of the dataset to use (default: ``0``).
        **kwargs: passed to the dataset class.
    """

    def __init__(self, dataset: str, index: int = 0, **kwargs: Any) -> None:
        self.dataset = dataset
        self.index = index
        self.kwargs = kwargs

    def _cls(self) -> type:
        if "." in self.dataset:
            module, _, name = self.dataset.rpartition(".")
        else:
            module, name = "torch_geometric.datasets", self.dataset
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"Unknown PyG dataset {self.dataset!r}: cannot import {name!r} from {module!r}.") from err

    def load(self) -> GraphPair:
        ds = self._cls()(**self.kwargs)
        if len(ds) <= self.index:
            raise ValueError(f"PyG dataset {self.dataset!r} has {len(ds)} graph(s); `index={self.index}` is out of range.")
        return GraphPair(train=ds[self.index], test=None, name=self.dataset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r}, index={self.index})"


def simple_undirected_edges(pairs: list[tuple[int, int]], num_nodes: int) -> Tensor:
    """Each undirected relation once as ``[2, E]`` (u < v, sorted; self-loops and repeats dropped): the skip-gram graph."""
    ei = torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)
    ei = torch.stack([ei.min(dim=0).values, ei.max(dim=0).values])
    return coalesce(ei[:, ei[0] != ei[1]], num_nodes=num_nodes)


def check_max_nodes(max_nodes: int | None) -> int | None:
    """``max_nodes`` of a hashed subset: None (all nodes) or an int >= 10."""
    return check_int("max_nodes", max_nodes, 10, optional=True)


def hashed_subset(node_ids: Tensor, max_nodes: int | None, population: int, seed: int) -> Tensor:
    """Keep mask: each node iff a seeded public hash u(id) < max_nodes / population (all when None or >= population);
    the hash of :func:`~lightning_dprel.datamodules.datasets.nodes.public_subset`, so the same seed keeps the same ids."""
    if max_nodes is None or max_nodes >= population:
        return torch.ones(node_ids.numel(), dtype=torch.bool)
    return public_id_uniforms(node_ids, seed, "subset") < max_nodes / population

