"""DP-GPL's DP-SGD baseline (Abadi et al. 2016, Alg. 1) for the unit ``labelled_node``: prompt tuning where each private
labelled node v is one example, its own graph G[V_pub ∪ {v}] (:mod:`lightning_dprel.methods.dp_gpl.dpsgd`)."""

from __future__ import annotations

from lightning_dprel.accounting.mechanisms.relational import _poisson_gaussian
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import LABELLED_NODE

__all__: list[str] = []

# The same kernel as `poisson_gaussian` (Mironov et al. 2019, add/remove): only the unit it is proven for differs.
register_mechanism(
    "labelled_node_gaussian", _poisson_gaussian, coupled=False, privacy_unit=LABELLED_NODE,
    label="DP-SGD, one example per labelled node (Poisson Gaussian)", clipping=("standard",),
    accounting="labelled_node_gaussian",
    description="Poisson-subsampled Gaussian at rate γ: in the public view each labelled node is exactly one example "
                "(its own G[V_pub ∪ {v}], seen by no other example), so removing it removes one clipped per-example "
                "gradient (sensitivity C)",
)
