"""The shared privacy core and its extension points: units and specs, events, the ledger, the private module and
datamodule bases, the DP optimizer, keyed randomness. It imports no method; names load on first use."""

from lightning_dprel.core.lazy import lazy_exports
from lightning_dprel.core.notices import silence_lightning_notices

silence_lightning_notices()  # Lightning's notices that no run of this library can act on (see core/notices.py)

_EXPORTS = {
    "lightning_dprel.core.specs": ("PrivacyUnit", "register_privacy_unit", "SamplingSpec", "NoiseSpec"),
    "lightning_dprel.core.events": ("GaussianRelease",),
    "lightning_dprel.core.ledger": ("PrivacyLedger",),
    "lightning_dprel.core.ledger_module": ("LedgerModule",),
    "lightning_dprel.core.private_module": ("PrivateModule",),
    "lightning_dprel.core.datamodule": ("PrivateDataModule",),
    "lightning_dprel.core.batch": ("PrivateBatch", "ExampleBatch"),
    "lightning_dprel.core.optim": ("DPOptimizer",),
    "lightning_dprel.core.randomness": ("KeyedStream",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
