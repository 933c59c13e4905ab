"""The shared privacy core: units and specs, events, the ledger, the DP optimizer, the private module and datamodule bases, clipping, keyed randomness, the budget. It imports no method."""
