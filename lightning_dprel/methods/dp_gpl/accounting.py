"""DP-GPL's privacy unit ``labelled_node`` and its DP-SGD baseline's mechanism, registered on import (Abadi et al. 2016,
Alg. 1): prompt tuning where each private labelled node v is one example, its own graph G[V_pub ∪ {v}]
(:mod:`lightning_dprel.methods.dp_gpl.dpsgd`)."""

from __future__ import annotations

from lightning_dprel.accounting.mechanisms.per_example import (
    per_example_poisson_gaussian, per_example_poisson_gaussian_pld,
)
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import PrivacyUnit, register_privacy_unit

__all__ = ["LABELLED_NODE"]

LABELLED_NODE = register_privacy_unit(PrivacyUnit(
    "labelled_node",
    "one labelled private node (add/remove); with a keyed partition it reaches exactly one teacher",
    "labelled nodes",
))

# The same kernel as `poisson_gaussian` (Mironov et al. 2019, add/remove): only the unit it is proven for differs.
register_mechanism(
    "labelled_node_gaussian", per_example_poisson_gaussian, coupled=False, privacy_unit=LABELLED_NODE,
    label="DP-SGD, one example per labelled node (Poisson Gaussian)", clipping=("standard",),
    accounting="labelled_node_gaussian", pld=per_example_poisson_gaussian_pld,
    description="Poisson-subsampled Gaussian at rate γ: in the public view each labelled node is exactly one example "
                "(its own G[V_pub ∪ {v}], seen by no other example), so removing it removes one clipped per-example "
                "gradient (sensitivity C)",
)
