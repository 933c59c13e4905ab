"""User-facing re-export of :mod:`lightning_dprel.datamodules` (the library itself never imports this package).

A project with its own top-level ``datamodules`` package shadows this one; import from
``lightning_dprel`` (``from lightning_dprel import RelationalDataModule``) to be safe.
"""

from lightning_dprel.datamodules import (
    DPDataLoader, DPDegreeCap, GraphPair, LinkPredictionDataModule, GraphSource, NodeSplitDataModule, PublicRelations, PyGSource, RelationalDataModule, choose_settings,
    suggest_settings,
)
from lightning_dprel.datamodules import datasets

__all__ = ["DPDataLoader", "LinkPredictionDataModule", "GraphPair", "GraphSource", "PyGSource", "RelationalDataModule", "NodeSplitDataModule", "PublicRelations", "DPDegreeCap",
           "choose_settings", "suggest_settings", "datasets"]
