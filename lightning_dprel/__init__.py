"""lightning_dprel: entity-level differentially private relational learning with Lightning and PyG.

Light at import: the specs and batch records load eagerly; the module, encoders and CLI load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_dprel.batch import RankingBatch, TupleBatch
from lightning_dprel.specs import PRIVACY_UNIT, NoiseSpec, SamplingSpec

__version__ = "0.1.0"

_LAZY = {
    "DPRelationalModule": "lightning_dprel.module",
    "TextEncoder": "lightning_dprel.encoders",
    "MLPEncoder": "lightning_dprel.encoders",
    "DPOptimizer": "lightning_dprel.optim",
    "KeyedStream": "lightning_dprel.randomness",
    "PrivacyLedger": "lightning_dprel.ledger",
    "Accountant": "lightning_dprel.accounting",
    "PrivacyCallback": "lightning_dprel.callbacks",
    "ValidationSelection": "lightning_dprel.callbacks",
    "RelationalDataModule": "lightning_dprel.datamodules",
    "GraphSource": "lightning_dprel.datamodules",
    "GraphPair": "lightning_dprel.datamodules",
}

__all__ = ["PRIVACY_UNIT", "NoiseSpec", "SamplingSpec", "RankingBatch", "TupleBatch", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_dprel' has no attribute {name!r}")
