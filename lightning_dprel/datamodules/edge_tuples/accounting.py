"""The coupled edge-tuple sampling's mechanisms (entity-level): Theorem C.1's mixture and its
readings, registered on import (light: no torch, so the accounting command line loads them without a
model).

They account the coupled batches of :mod:`lightning_dprel.datamodules.edge_tuples` (the relational
method's and AdvSGM's sampling, whose :class:`~.spec.EdgeTuples` detail they read), so they live
with that sampling:

* ``freq_corrected`` — FREQ-CLIP with the corrected profile Δ_freq(i,j) = C(1/2 + 3j/4 + i(1+k)/4)
  (holds).
* ``freq_paper`` — FREQ-CLIP with the paper's Eq. 3 (Δ ≡ C; rests on Proposition 4.1, which does not
  hold as stated: reproduces the paper, under-states ε).
* ``standard`` — standard per-tuple clipping, Theorem C.1 (Δ = C(i + 2j)).
* ``naive`` — the unamplified Gaussian bound α/(2σ²) of the paper's Figure 2.
* ``public_negatives`` — standard clipping where the node set is public (unit ``node_public_ids``):
  the negatives come from the public ids, so the coupled slot term vanishes and Δ = C·i
  (:func:`public_items_rdp`, :func:`public_items_pld`).
* the public-items mixture (Δ = C·i), which AdvSGM with public ids and entities & items register
  under their units.

The coupled mechanisms charge K' = min(K, n) (:func:`accounted_degree` proves it covers the same
neighbouring graphs) and refuse K' > 2²²; their cost stops growing with K above
:data:`~lightning_dprel.accounting.analysis.coupled_rdp.HEAD_ROWS` (closed-form tail bound).
"""

from __future__ import annotations

import numpy as np

from lightning_dprel.accounting.analysis.coupled_rdp import coupled_rdp
from lightning_dprel.accounting.analysis.sampled_gaussian import eq3_rdp
from lightning_dprel.accounting.pld import binomial_mixture_pld
from lightning_dprel.accounting.profiles import freq_corrected_profile, standard_profile
from lightning_dprel.accounting.registry import register_mechanism
from lightning_dprel.core.clipping_modes import register_mechanism_choice
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY, NODE_PUBLIC_IDS, edge_tuples

__all__ = [
    "MECHANISMS",
    "PAPER_EQ3_WARNING",
    "accounted_degree",
    "MAX_ACCOUNTED_DEGREE",
    "public_items_profile",
    "public_items_rdp",
    "public_items_pld",
    "PUBLIC_NEGATIVES",
]

#: The entity-level mechanisms of the paper, in the order reports list them.
MECHANISMS: tuple[str, ...] = ("freq_corrected", "freq_paper", "standard", "naive")

#: Warned once when an accounting that rests on Proposition 4.1 (the paper's Eq. 3, or the naive
#: bound) is used.
PAPER_EQ3_WARNING = (
    "PrivacyCallback: ε is computed with the paper's Eq. 3 (sensitivity Δ ≡ C). Eq. 3 rests on "
    "Proposition 4.1 (FREQ-CLIP has sensitivity C), which does not hold as stated: removing a node "
    "changes the clip thresholds of other tuples (a counterexample moves the clipped sum by 6.75·C "
    "for K=5, k=4). This ε reproduces the paper and under-states the privacy loss; use "
    "accounting='corrected' for a bound that holds."
)


def _spec_kwargs(sampling: SamplingSpec, sigma: float) -> dict:
    tuples = edge_tuples(sampling)
    return dict(
        num_nodes=tuples.num_nodes,
        num_edges=sampling.population,
        max_degree=sampling.contribution_bound,
        sampling_rate=float(sampling.sampling_rate),
        neg_per_pos=tuples.neg_per_pos,
        noise_multiplier=sigma,
    )


#: Largest degree bound the coupled mechanisms evaluate (their profiles are arrays of K + 1 rows).
MAX_ACCOUNTED_DEGREE = 2**22


def accounted_degree(sampling: SamplingSpec) -> int:
    """The degree bound the coupled mechanisms charge: K' = min(K, n), or a ``ValueError`` above
    2²².

    Why min(K, n) is not an under-statement: K enters Theorem C.1 only as a bound on the number of
    relations (capped edges) of the entity that is added or removed — the clipping, the Poisson rate
    γ and the negative sampling do not depend on K. Relations are simple and undirected (no
    self-loops, no repeats; see
    :func:`~lightning_dprel.datamodules.edge_tuples.sampling.to_simple_undirected`), so in a graph
    of n nodes an entity has at most n − 1 of them, and an entity *added* to it (a graph of n + 1
    nodes) at most n. Every pair of neighbouring datasets the guarantee quantifies over therefore
    differs by an entity with ≤ min(K, n) relations, and the theorem with K' = min(K, n) covers
    exactly the same pairs as with K. (The *observed* maximum degree is no
    such bound: an added entity may bring up to K relations, so it is never used.)
    """
    n, k_eff = edge_tuples(sampling).num_nodes, sampling.accounted_bound
    if k_eff > MAX_ACCOUNTED_DEGREE:
        raise ValueError(
            f"`max_degree` K = {sampling.contribution_bound:,} (with n = {n:,} nodes, min(K, n) = "
            f"{k_eff:,}) "
            f"is above the {MAX_ACCOUNTED_DEGREE:,} the coupled accountant evaluates; its ε grows "
            "like K² (one "
            "entity with K sampled relations moves the sum by ~K·C), so such a cap gives no useful "
            "guarantee. "
            "Lower max_degree to about the graph's largest degree (the paper uses K = 5)."
        )
    return k_eff


def _coupled_kwargs(sampling: SamplingSpec, sigma: float) -> dict:
    return {**_spec_kwargs(sampling, sigma), "max_degree": accounted_degree(sampling)}


def _freq_corrected(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    kw = _coupled_kwargs(sampling, sigma)
    prof = freq_corrected_profile(kw["max_degree"], edge_tuples(sampling).neg_per_pos)
    return coupled_rdp(prof, orders=orders, **kw)


def _freq_paper(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return eq3_rdp(orders=orders, **_spec_kwargs(sampling, sigma))


def _standard(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    kw = _coupled_kwargs(sampling, sigma)
    prof = standard_profile(kw["max_degree"], edge_tuples(sampling).neg_per_pos)
    return coupled_rdp(prof, orders=orders, **kw)


def _naive(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return np.asarray(orders, dtype=float) / (2.0 * sigma * sigma)


def public_items_profile(max_degree: int, neg_per_pos: int = 0) -> np.ndarray:
    """Δ(i, j)/C = i for both j (negatives drawn from a public vocabulary: only the unit's own ≤ K
    tuples differ)."""
    i = np.arange(max_degree + 1, dtype=float)[:, None]
    return np.repeat(i, 2, axis=1)


def public_items_rdp(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Theorem C.1's mixture with Δ = C·i (no negative-slot term): Σ_i Bin(K', γ)(i)·N(i, σ²) vs
    N(0, σ²), both ways.

    For units whose negatives come from a public universe (AdvSGM's public node ids, the public
    items of :mod:`lightning_dprel.methods.entity_items`); at K = 1 it is the per-example Poisson
    Gaussian.
    """
    k_eff = accounted_degree(sampling)
    # j ≡ 0: the profile does not depend on whether the unit fills a negative slot, so the mixture
    # weights (1−p)·b_i + p·b_i merge to b_i for every p; neg_per_pos = 0 evaluates exactly that
    # mixture (one plan point).
    return coupled_rdp(
        public_items_profile(k_eff),
        num_nodes=edge_tuples(sampling).num_nodes,
        num_edges=sampling.population,
        max_degree=k_eff,
        sampling_rate=float(sampling.sampling_rate),
        neg_per_pos=0,
        noise_multiplier=sigma,
        orders=orders,
    )


def public_items_pld(sampling: SamplingSpec, sigma: float, interval: float):
    """PLD of :func:`public_items_rdp`'s mixture, Σ_i Bin(K', γ)(i) N(i, σ²) vs N(0, σ²): it
    dominates every hockey-stick divergence of the real mechanism (Neyman–Pearson;
    ``docs/accounting.md``, "Tight accounting")."""
    return binomial_mixture_pld(
        accounted_degree(sampling), float(sampling.sampling_rate), sigma, interval
    )


register_mechanism(
    "freq_corrected", _freq_corrected, coupled=True, privacy_unit=ENTITY,
    label="FREQ-CLIP corrected", clipping=("freq",), accounting="corrected",
    stands_in_for=("freq_paper",),  # the bound that holds, for a run accounted by Eq. 3
    description="FREQ-CLIP, corrected accounting: profile Δ=C(1/2+3j/4+i(1+k)/4) in Theorem C.1's "
                "mixture",
)
register_mechanism(
    "freq_paper", _freq_paper, coupled=True, privacy_unit=ENTITY, label="FREQ-CLIP paper Eq. 3",
    clipping=("freq",), accounting="paper", warning=PAPER_EQ3_WARNING,
    description="FREQ-CLIP, paper's accounting: Eq. 3 (Δ≡C; Proposition 4.1 does not hold as "
                "stated)",
)
register_mechanism(
    "standard", _standard, coupled=True, privacy_unit=ENTITY, label="standard (Thm C.1)",
    clipping=("standard",), description="standard per-tuple clipping: Theorem C.1 (Δ=C(i+2j))",
)
register_mechanism(
    "naive", _naive, coupled=False, privacy_unit=ENTITY, label="naive Δ ≡ C, no amplification",
    warning=PAPER_EQ3_WARNING, stands_in_for=("freq_paper",),
    description="naive Gaussian bound α/(2σ²), no amplification by sampling (paper's Figure 2)",
)

#: Standard clipping over a public node set: Theorem C.1 without its negative-slot term.
PUBLIC_NEGATIVES = "public_negatives"
register_mechanism(
    PUBLIC_NEGATIVES, public_items_rdp, coupled=True, privacy_unit=NODE_PUBLIC_IDS,
    label="standard, public negatives (Δ=C·i)", clipping=("standard",),
    accounting=PUBLIC_NEGATIVES,
    pld=public_items_pld,
    description="standard per-tuple clipping, negatives from public ids: Theorem C.1's mixture "
                "with Δ=C·i (the negative-slot term vanishes)",
)

# What a module's (clipping, accounting) selects: FREQ-CLIP's two readings, and Theorem C.1 for
# standard clipping.
for _accounting, _mechanism in (
    (None, "freq_corrected"),
    ("corrected", "freq_corrected"),
    ("paper", "freq_paper"),
):
    register_mechanism_choice("freq", _accounting, _mechanism)
    register_mechanism_choice("standard", _accounting, "standard")
