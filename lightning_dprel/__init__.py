"""lightning_dprel: entity-level differentially private relational learning with Lightning and PyG.

Light at import: only the specs load eagerly (no torch: the accounting CLI must not pay for it); everything
else — batch records, module, encoders, callbacks, datamodules — loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_dprel.core.specs import NoiseSpec, SamplingSpec

__version__ = "0.1.0"

_LAZY = {
    "PRIVACY_UNIT": "lightning_dprel.datamodules.edge_tuples.spec",
    "TupleBatch": "lightning_dprel.datamodules.edge_tuples.batch",
    "RankingBatch": "lightning_dprel.datamodules.edge_tuples.batch",
    "DPRelationalModule": "lightning_dprel.methods.relational.module",
    "TextEncoder": "lightning_dprel.encoders",
    "MLPEncoder": "lightning_dprel.encoders",
    "DPOptimizer": "lightning_dprel.core.optim",
    "DPNodeModule": "lightning_dprel.methods.dp_gcn.module",
    "GNNClassifier": "lightning_dprel.methods.dp_gcn.gnn",
    "NodeSplitDataModule": "lightning_dprel.datamodules",
    "KeyedStream": "lightning_dprel.core.randomness",
    "PrivacyLedger": "lightning_dprel.core.ledger",
    "Accountant": "lightning_dprel.accounting",
    "PrivacyCallback": "lightning_dprel.callbacks",
    "DPDataLoader": "lightning_dprel.datamodules",
    "LinkPredictionDataModule": "lightning_dprel.datamodules",
    "ValidationSelection": "lightning_dprel.callbacks",
    "RelationalDataModule": "lightning_dprel.datamodules",
    "GraphSource": "lightning_dprel.datamodules",
    "GraphPair": "lightning_dprel.datamodules",
    "export_model": "lightning_dprel.export",
}

__all__ = ["PRIVACY_UNIT", "NoiseSpec", "SamplingSpec", *(n for n in _LAZY if n != "PRIVACY_UNIT")]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_dprel' has no attribute {name!r}")
