"""Coupled edge tuples over a public vocabulary: the relational method's public negatives.

When the node set (ids and texts: ontology terms, products) is public and only the relations are
private, :class:`PublicVocabularyDataModule` samples exactly as :class:`RelationalDataModule`
(Algorithm 3: K-capped relations, Poisson positives at γ = b/m, NEG-SAMPLE-WOR from the n public
ids by the keyed stream, which reads the positives' count and nothing else) and declares the unit
``node_public_ids``: one node's ≤ K capped relations, added or removed, the node itself staying.

Why that unit and not a new one: AdvSGM's skip-gram samples these same coupled batches over a
public id universe and removes the same thing (a node's capped relations, its public inputs kept);
the relation between neighbouring datasets is identical, so the two share it.

Why Δ = C·i (Theorem C.1 without its j term; mechanism ``public_negatives``). Removing the node's
relations removes its i sampled tuples. A slot it fills as a negative holds its public text in both
worlds, so that tuple's gradient is unchanged. The negatives of the other tuples are a draw without
replacement whose size is |E⁺|·k; by exchangeability the draw of the remaining |E⁺| − i tuples has
the same law in both worlds, so couple them equal. Each other tuple and its standard clip are then
common to both batches, and per outcome the sums differ by the i removed clipped tuples (‖·‖ ≤ C·i);
joint convexity of the hockey-stick divergence gives the pair Σ_i Bin(K', γ)(i) N(i, σ²) vs
N(0, σ²) (``docs/accounting.md``, "Tight accounting"). FREQ-CLIP is not covered: its thresholds
read the frequencies of the removed tuples' nodes.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithms 2-3, Theorem C.1. Zhu, Dong & Wang 2022 (dominating pairs).
"""

from __future__ import annotations

from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.spec import NODE_PUBLIC_IDS

__all__ = ["PublicVocabularyDataModule"]


class PublicVocabularyDataModule(RelationalDataModule):
    """:class:`RelationalDataModule` over node ids and texts declared public (Theorem C.1, j ≡ 0).

    Use it with ``DPRelationalModule(clipping="standard", accounting="public_negatives")``. Only the
    relations are protected: the node set, its count n and every node's text or features are taken
    as public, so state them (``data.num_nodes``, ``data.text`` / ``data.x``) independently of the
    relations. A private node set needs :class:`RelationalDataModule` (unit ``entity``), whose
    mechanisms keep the negative-slot term; ``public_negatives`` is refused there.

    Args:
        source, **kwargs: as :class:`RelationalDataModule`.
    """

    privacy_unit = NODE_PUBLIC_IDS.name
