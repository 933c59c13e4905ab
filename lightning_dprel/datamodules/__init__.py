"""Datamodules of every method, and the offline graph sources they read (:mod:`~lightning_dprel.datamodules.datasets`).

Lazy: each datamodule lives in its method's package (``lightning_dprel.methods.<method>.datamodule``) and loads on
first use, so a method's datamodule may import the sources here without a cycle.
"""

from __future__ import annotations

from lightning_dprel.core.lazy import lazy_exports

_EXPORTS = {
    "lightning_dprel.datamodules.datasets.base": ("GraphPair", "GraphSource", "PyGSource"),
    "lightning_dprel.datamodules.edge_tuples.datamodule": ("RelationalDataModule",),
    "lightning_dprel.datamodules.edge_tuples.public_vocabulary": ("PublicVocabularyDataModule",),
    "lightning_dprel.datamodules.edge_tuples.link_batches": ("LinkPredictionDataModule",),
    "lightning_dprel.datamodules.poisson": ("DPDataLoader",),
    "lightning_dprel.datamodules.edge_tuples.public": ("PublicRelations",),
    "lightning_dprel.datamodules.edge_tuples.settings": ("DPDegreeCap", "choose_settings", "suggest_settings"),
    "lightning_dprel.methods.dp_gcn.datamodule": ("NodeSplitDataModule",),
    "lightning_dprel.methods.advsgm.datamodule": ("SkipGramDataModule",),
    "lightning_dprel.methods.dp_gpl.datamodule": ("PromptDataModule",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
