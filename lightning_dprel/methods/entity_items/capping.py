"""Per-entity contribution bound chosen by the entity's own keyed hash (no cascade across entities)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from lightning_dprel.core.checks import check_int

__all__ = ["keyed_cap"]


def keyed_cap(entity_ids: Sequence[str], item_ids: Sequence[str], pairs: torch.Tensor, max_relations: int,
              key: bytes) -> torch.Tensor:
    """A mask over the columns of ``pairs`` ``[2, m]`` (entity row, item row): each entity keeps its ≤ K relations
    with the smallest keyed hash of (entity id, item id). An entity's choice reads only its own relations and the
    key, so adding or removing an entity leaves every other entity's kept relations as they were.
    """
    if not isinstance(key, bytes) or len(key) < 16:
        raise ValueError("`key` must be at least 16 bytes (from the keyed stream).")
    check_int("max_relations (K)", max_relations, 1)
    e, i = pairs[0].tolist(), pairs[1].tolist()
    h = [hashlib.blake2b(f"{entity_ids[a]}\0{item_ids[b]}".encode(), key=key[:64], digest_size=8).digest()
         for a, b in zip(e, i)]
    order = sorted(range(len(e)), key=lambda c: (e[c], h[c]))
    keep = torch.zeros(len(e), dtype=torch.bool)
    last, count = None, 0
    for c in order:
        count = count + 1 if e[c] == last else 1
        last = e[c]
        keep[c] = count <= max_relations
    return keep
