"""The unit and mechanism of private entities linked to public items, registered on import.

Unit :data:`ENTITY_PUBLIC_ITEMS`: one entity with all its raw relations, add/remove. Each entity keeps at most K of
them, chosen by its own keyed hash (:func:`~lightning_dprel.methods.entity_items.capping.keyed_cap`), so removing it
changes no other entity's relations; items (ids, texts, the item graph) are public and negatives come from them.

Mechanism ``entity_items``: per-tuple (or per-entity) clipping to C, Poisson sampling at rate γ, dense noise σ·C.
Removing an entity removes only its i ≤ K sampled tuples, so Δ = C·i: Theorem C.1's mixture with no negative-slot term
(:func:`~lightning_dprel.datamodules.edge_tuples.accounting.public_items_rdp`). Entity-as-example
sampling states K = 1 (one clipped term per entity) and is then exactly the Poisson subsampled
Gaussian (Mironov et al. 2019).
"""

from __future__ import annotations

from lightning_dprel.datamodules.edge_tuples.accounting import public_items_pld, public_items_rdp
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.specs import PrivacyUnit, register_privacy_unit

__all__ = ["ENTITY_PUBLIC_ITEMS", "MECHANISM"]

ENTITY_PUBLIC_ITEMS = register_privacy_unit(PrivacyUnit(
    "entity_public_items",
    "one private entity with all its raw relations to public items (add/remove); each entity keeps at most K "
    "relations chosen by its own keyed hash, so no other entity's data changes; items and their graph are public",
    "entities",
))
MECHANISM = "entity_items"

register_mechanism(
    MECHANISM, public_items_rdp, coupled=False, privacy_unit=ENTITY_PUBLIC_ITEMS, label="entities, public items (Δ=C·i)",
    clipping=("standard",), accounting=MECHANISM, pld=public_items_pld,
    description="private entities, public items: Theorem C.1's mixture with Δ=C·i (K=1: Poisson subsampled Gaussian)",
)
