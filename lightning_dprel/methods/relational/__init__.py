"""Entity-level DP relational learning (Huang et al.): coupled sampling, per-tuple gradients, FREQ-CLIP, Theorem C.1.

Its units and mechanisms (``entity``; FREQ-CLIP and Theorem C.1) are the coupled edge-tuple sampling's, which the core
registers (:mod:`lightning_dprel.accounting.mechanisms.coupled`): this package registers none of its own.
"""

from lightning_dprel.core.lazy import lazy_exports

_EXPORTS = {
    "lightning_dprel.methods.relational.module": ("DPRelationalModule",),
    "lightning_dprel.datamodules.edge_tuples.datamodule": ("RelationalDataModule",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
