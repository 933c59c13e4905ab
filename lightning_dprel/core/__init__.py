"""The shared privacy core and its extension points: units and specs, events, the ledger, the private module and
datamodule bases, the DP optimizer, keyed randomness. It imports no method; names load on first use."""

from lightning_dprel.core.lazy import lazy_exports
from lightning_dprel.core.notices import silence_lightning_notices

silence_lightning_notices()  # Lightning's notices that no run of this library can act on (see core/notices.py)

_LAZY = {
    "PrivacyUnit": "lightning_dprel.core.specs",
    "register_privacy_unit": "lightning_dprel.core.specs",
    "SamplingSpec": "lightning_dprel.core.specs",
    "NoiseSpec": "lightning_dprel.core.specs",
    "GaussianRelease": "lightning_dprel.core.events",
    "PrivacyLedger": "lightning_dprel.core.ledger",
    "LedgerModule": "lightning_dprel.core.ledger_module",
    "PrivateModule": "lightning_dprel.core.private_module",
    "PrivateDataModule": "lightning_dprel.core.datamodule",
    "PrivateBatch": "lightning_dprel.core.batch",
    "ExampleBatch": "lightning_dprel.core.batch",
    "DPOptimizer": "lightning_dprel.core.optim",
    "KeyedStream": "lightning_dprel.core.randomness",
}
__all__ = list(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
