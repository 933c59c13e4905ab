"""lightning_dprel: differentially private graph and relational learning with Lightning and PyG.

The top level holds what the quickstart and the docs type; each method's classes live in its package
(``lightning_dprel.methods.<method>``), the extension points in ``lightning_dprel.core`` and
``lightning_dprel.accounting``. Light at import: every name loads on first use (the accounting CLI pays no torch).
"""

from __future__ import annotations

from lightning_dprel.core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "lightning_dprel.callbacks": ("PrivacyCallback", "ValidationSelection"),
    "lightning_dprel.datamodules": ("DPDataLoader", "GraphSource", "GraphPair", "RelationalDataModule", "NodeSplitDataModule"),
    "lightning_dprel.methods.relational.module": ("DPRelationalModule",),
    "lightning_dprel.encoders": ("MLPEncoder", "TextEncoder"),
    "lightning_dprel.export": ("export_model",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
