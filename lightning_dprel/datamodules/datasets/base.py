"""Graph sources: anything that yields a train graph and (optionally) a separate test graph."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from torch_geometric.data import Data

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
