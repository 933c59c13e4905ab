"""Node-level DP-GCN with random graph splits (Igamberdiev & Habernal 2022), corrected to replace-one accounting."""

from lightning_dprel.core.lazy import lazy_exports
from lightning_dprel.methods.dp_gcn import accounting  # noqa: F401 - registers its unit and mechanisms

_LAZY = {
    "NodeSplitDataModule": "lightning_dprel.methods.dp_gcn.datamodule",
    "DPNodeModule": "lightning_dprel.methods.dp_gcn.module",
    "GNNClassifier": "lightning_dprel.methods.dp_gcn.gnn",
}
__all__ = list(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
