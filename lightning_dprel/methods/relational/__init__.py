"""Entity-level DP relational learning (Huang et al.): coupled sampling, per-tuple gradients, FREQ-CLIP, Theorem C.1.

Its clipping ``"freq"``, unit ``entity`` and mechanisms are registered on import
(:mod:`.accounting`).
"""

from lightning_dprel.methods.relational import accounting  # noqa: F401 - registers its names
from lightning_dprel.core.lazy import lazy_exports

_EXPORTS = {
    "lightning_dprel.methods.relational.module": ("DPRelationalModule",),
    "lightning_dprel.datamodules.edge_tuples.datamodule": ("RelationalDataModule",),
    "lightning_dprel.datamodules.edge_tuples.public_vocabulary": ("PublicVocabularyDataModule",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
