"""lightning_dprel: differentially private graph and relational learning with Lightning and PyG.

The top level holds what the quickstart and the docs type; each method's classes live in its package
(``lightning_dprel.methods.<method>``), the extension points in ``lightning_dprel.core`` and
``lightning_dprel.accounting``. Light at import: every name loads on first use (the accounting CLI pays no torch).
"""

from __future__ import annotations

from lightning_dprel.core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "PrivacyCallback": "lightning_dprel.callbacks",
    "ValidationSelection": "lightning_dprel.callbacks",
    "DPDataLoader": "lightning_dprel.datamodules",
    "GraphSource": "lightning_dprel.datamodules",
    "GraphPair": "lightning_dprel.datamodules",
    "RelationalDataModule": "lightning_dprel.datamodules",
    "NodeSplitDataModule": "lightning_dprel.datamodules",
    "DPRelationalModule": "lightning_dprel.methods.relational.module",
    "MLPEncoder": "lightning_dprel.encoders",
    "TextEncoder": "lightning_dprel.encoders",
    "export_model": "lightning_dprel.export",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
