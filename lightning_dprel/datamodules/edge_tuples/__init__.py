"""The edge-tuple sampling family, shared by the methods that train on edge tuples (relational learning, AdvSGM).

Poisson positives over degree-capped edges plus negatives without replacement (NEG-SAMPLE-WOR), on the keyed stream:
:class:`~lightning_dprel.datamodules.edge_tuples.datamodule.RelationalDataModule` → :class:`~.batch.TupleBatch`.
"""
