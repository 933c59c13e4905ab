"""Node-level DP-GCN with random graph splits (Igamberdiev & Habernal 2022), corrected to replace-one accounting."""

from lightning_dprel.core.lazy import lazy_exports
from lightning_dprel.methods.dp_gcn import accounting  # noqa: F401 - registers its unit and mechanisms

_EXPORTS = {
    "lightning_dprel.methods.dp_gcn.datamodule": ("NodeSplitDataModule",),
    "lightning_dprel.methods.dp_gcn.module": ("DPNodeModule",),
    "lightning_dprel.methods.dp_gcn.gnn": ("GNNClassifier",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
