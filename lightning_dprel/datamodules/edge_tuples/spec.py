"""The edge-tuple family's privacy unit and sampling detail (light: no torch), registered on import.

Unit :data:`ENTITY`: one node with all its ≤ K capped relations, add/remove. It is the unit of every
datamodule that samples coupled edge tuples (the relational method's, AdvSGM's with private ids), so
it lives with that sampling and not with one method (methods never import each other). Unit
:data:`NODE_PUBLIC_IDS`: the same removal where the node set (ids, texts) is public, so the node
stays and only its ≤ K capped relations go (AdvSGM's skip-gram, the relational method's public
negatives: one neighbouring relation, one unit). Detail
:class:`EdgeTuples`: what the coupled sampling adds to a
:class:`~lightning_dprel.core.specs.SamplingSpec` (n nodes, k negatives per positive), which its
mechanisms read.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithm 3 (coupled sampling), Eq. 3 and Theorem C.1 (accounting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lightning_dprel.core.checks import check_int
from lightning_dprel.core.specs import (
    PrivacyUnit,
    SamplingDetail,
    SamplingSpec,
    register_privacy_unit,
    register_sampling_detail,
)

__all__ = ["PRIVACY_UNIT", "ENTITY", "NODE_PUBLIC_IDS", "EdgeTuples", "edge_tuples"]

#: The privacy unit of the relational method (the entity): what neighbouring graphs differ by.
PRIVACY_UNIT = (
    "one entity: a node together with all of its relations (edges); neighbouring graphs differ by "
    "adding or removing one node and its at most K capped edges (node-level DP, add/remove)"
)
ENTITY = register_privacy_unit(
    PrivacyUnit("entity", PRIVACY_UNIT, "entities", rows=True, delta_per_row=True)
)
#: One node's ≤ K capped relations, add/remove, over a public node set (ids and texts): the node
#: keeps its public inputs (and any released per-node row) without edges, and negatives come from
#: the public ids. Shared by AdvSGM's skip-gram and the relational method's public negatives.
NODE_PUBLIC_IDS = register_privacy_unit(PrivacyUnit(
    "node_public_ids",
    "one node with all its incident edges (node-level DP, add/remove its at most K capped "
    "edges); node ids and texts are public: the node keeps its public inputs (and any "
    "released row) without edges, and negatives are drawn from the public id universe",
    "nodes",
))


@register_sampling_detail
@dataclass(frozen=True)
class EdgeTuples(SamplingDetail):
    """Coupled edge-tuple sampling (Algorithm 3, lines 1-3): the record's rows are the m capped
    relations Ē.

    Each step draws positives E⁺ by Poisson sampling of Ē at rate γ, then ``neg_per_pos`` · |E⁺|
    negative nodes *without replacement*, uniformly from all ``num_nodes`` nodes, independent of
    which positives were drawn (Algorithm 2, NEG-SAMPLE-WOR). After degree capping every node has at
    most K (``contribution_bound``) relations.

    Args:
        num_nodes: n = |V| (the entities, unless the record states ``num_units``).
        neg_per_pos: k ≥ 0, negatives per positive tuple.
    """

    num_nodes: int
    neg_per_pos: int = 0
    default_unit: ClassVar[str] = ENTITY.name

    def __post_init__(self) -> None:
        check_int("num_nodes", self.num_nodes, 1)
        check_int("neg_per_pos", self.neg_per_pos, 0)

    def units(self, spec: SamplingSpec) -> int:
        return self.num_nodes

    def bound(self, spec: SamplingSpec) -> int:
        """K' = min(K, n): an entity has at most n relations (see
        :func:`~.accounting.accounted_degree`)."""
        return min(spec.contribution_bound, self.num_nodes)

    def check_draws(self, spec: SamplingSpec) -> None:
        need = self.neg_per_pos * spec.sampling_rate * spec.population
        if need > self.num_nodes:
            raise ValueError(
                f"`neg_per_pos` * expected batch size = {self.neg_per_pos} * "
                f"{spec.sampling_rate * spec.population:g} = {need:g} exceeds `num_nodes` = "
                f"{self.num_nodes}: NEG-SAMPLE-WOR (Algorithm 2) draws negatives without "
                "replacement. "
                "Lower neg_per_pos or the sampling rate."
            )


def edge_tuples(spec: SamplingSpec) -> EdgeTuples:
    """The record's :class:`EdgeTuples` detail, else a ``ValueError`` (a coupled mechanism needs n
    and k)."""
    if not isinstance(spec.detail, EdgeTuples):
        raise ValueError(
            "This mechanism accounts coupled edge-tuple sampling and needs a SamplingSpec with an "
            "EdgeTuples detail "
            f"(n nodes, k negatives per positive), got detail {spec.detail!r}."
        )
    return spec.detail
