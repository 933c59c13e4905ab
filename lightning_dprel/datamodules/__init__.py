"""Datamodules of every method, and the offline graph sources they read (:mod:`~lightning_dprel.datamodules.datasets`).

Lazy: each datamodule lives in its method's package (``lightning_dprel.methods.<method>.datamodule``) and loads on
first use, so a method's datamodule may import the sources here without a cycle.
"""

from __future__ import annotations

from lightning_dprel.core.lazy import lazy_exports

_LAZY = {
    "GraphPair": "lightning_dprel.datamodules.datasets.base",
    "GraphSource": "lightning_dprel.datamodules.datasets.base",
    "PyGSource": "lightning_dprel.datamodules.datasets.base",
    "RelationalDataModule": "lightning_dprel.datamodules.edge_tuples.datamodule",
    "LinkPredictionDataModule": "lightning_dprel.datamodules.edge_tuples.link_batches",
    "DPDataLoader": "lightning_dprel.datamodules.poisson",
    "PublicRelations": "lightning_dprel.datamodules.edge_tuples.public",
    "DPDegreeCap": "lightning_dprel.datamodules.edge_tuples.settings",
    "choose_settings": "lightning_dprel.datamodules.edge_tuples.settings",
    "suggest_settings": "lightning_dprel.datamodules.edge_tuples.settings",
    "NodeSplitDataModule": "lightning_dprel.methods.dp_gcn.datamodule",
    "SkipGramDataModule": "lightning_dprel.methods.advsgm.datamodule",
    "PromptDataModule": "lightning_dprel.methods.dp_gpl.datamodule",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
