"""Datamodules that turn graphs into the batches the entity-level privacy analysis assumes."""

from datamodules.datasets.base import GraphPair, GraphSource, PyGSource
from datamodules.relational import RelationalDataModule

__all__ = ["GraphPair", "GraphSource", "PyGSource", "RelationalDataModule"]
