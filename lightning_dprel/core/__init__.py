"""The shared privacy core: units and specs, events, the ledger, the DP optimizer, the private module and datamodule bases, clipping, keyed randomness, the budget. It imports no method."""

from lightning_dprel.core.notices import silence_lightning_notices

silence_lightning_notices()  # Lightning's notices that no run of this library can act on (see core/notices.py)
