"""Tiny sampling specs for tests and examples (no torch: accounting tests stay light)."""

from __future__ import annotations

from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.edge_tuples.spec import EdgeTuples

__all__ = ["make_spec"]


def make_spec(n=2000, m=5000, K=3, gamma=0.01, k=2, *, steps_per_epoch=8, unit="entity", num_units=None) -> SamplingSpec:
    """n nodes, m capped edges of degree <= K, positives at Poisson rate γ (b = γ·m), k negatives per positive.

    ``steps_per_epoch`` sets the length of a :class:`~lightning_dprel.demos.boring_classes.SpecDataModule` epoch; the
    accountant does not read it.
    """
    return SamplingSpec(
        population=m, contribution_bound=K, sampling_rate=gamma, expected_batch_size=gamma * m,
        steps_per_epoch=steps_per_epoch, privacy_unit=unit, num_units=num_units,
        detail=EdgeTuples(num_nodes=n, neg_per_pos=k),
    )
