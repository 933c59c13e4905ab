"""DP-GCN's privacy unit and mechanisms, registered on import (node-level): Poisson-sampled subgraph examples under a
keyed partition (Igamberdiev & Habernal 2022, Section 4; corrected to replace-one,
:mod:`~lightning_dprel.accounting.analysis.substitution`)."""

from __future__ import annotations

import numpy as np

from lightning_dprel.accounting.analysis.substitution import poisson_gaussian_rdp, substitution_rdp
from lightning_dprel.accounting.pld import replace_one_pld
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import PrivacyUnit, SamplingSpec, register_privacy_unit

__all__ = ["NODE_IN_SUBGRAPH", "SUBGRAPH_PRIVACY_UNIT", "GCN_PAPER_WARNING"]

NODE_IN_SUBGRAPH = register_privacy_unit(PrivacyUnit(
    "node_in_subgraph",
    "one node with its features, label and edges (node-level DP, add/remove a node); with a secret partition keyed by "
    "stable node ids each node lies in exactly one subgraph, so neighbouring datasets differ in one subgraph's contents "
    "(replace-one)",
    "nodes",
))

#: DP-GCN's unit: node-level add/remove, each node inside exactly one subgraph example (lightning_dprel/datamodules/graph_splits.py).
SUBGRAPH_PRIVACY_UNIT = NODE_IN_SUBGRAPH.description
GCN_PAPER_WARNING = (
    "DP-GCN paper-faithful accounting: the moments-accountant reading of Igamberdiev & Habernal (2022) treats each "
    "subgraph as an added/removed example under Poisson sampling, but removing a node *changes* one subgraph "
    "(substitution, sensitivity 2C) and the published pipeline visits a fixed partition in a fixed order: this ε "
    "under-states the loss; use accounting='subgraph_replace' for a bound that holds."
)


def _subgraph_replace(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return substitution_rdp(float(sampling.sampling_rate), sigma, orders)


def _subgraph_replace_pld(sampling: SamplingSpec, sigma: float, interval: float):
    """Replace-one pair ((1−q)N(0) + qN(1), (1−q)N(0) + qN(−1)): it dominates the d-dimensional mechanism whatever the two
    subgraphs' clipped gradients are (Neyman–Pearson; ``docs/accounting.md``, "Tight accounting")."""
    return replace_one_pld(float(sampling.sampling_rate), sigma, interval)


def _gcn_paper(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return poisson_gaussian_rdp(float(sampling.sampling_rate), sigma, orders)


register_mechanism(
    "subgraph_replace", _subgraph_replace, coupled=False, privacy_unit=NODE_IN_SUBGRAPH,
    label="DP-GCN subgraphs (replace-one)", clipping=("standard",), accounting="subgraph_replace", pld=_subgraph_replace_pld,
    description="Poisson-sampled subgraphs, one node changes one subgraph: replace-one bound min(2α/σ², weak triangle)",
)
register_mechanism(
    "gcn_paper", _gcn_paper, coupled=False, privacy_unit=NODE_IN_SUBGRAPH, label="DP-GCN paper (add/remove)",
    clipping=("standard",), accounting="gcn_paper", warning=GCN_PAPER_WARNING,
    description="DP-GCN as published: Poisson-subsampled Gaussian add/remove at the subgraph rate (under-states)",
)
