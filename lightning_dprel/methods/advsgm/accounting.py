"""AdvSGM's privacy units and mechanisms, registered on import (private adversarial skip-gram, Zhang et al.; spec:
``shared/spec/advsgm.md``).

Units: :data:`NODE_PUBLIC_IDS` (provable mode, node level; registered by the edge-tuple family,
which the relational method's public negatives share), :data:`EDGE` (provable mode, edge level) and
:data:`NODE_REPLACE` (the paper's claim, bounded DP).

* ``skipgram_public_ids`` — the provable mode: Poisson positives at γ = b/m over the K-capped edges, each tuple an
  oriented edge plus k negatives drawn from the *public* node-id universe, per-tuple clipping to C, dense noise
  N(0, σ²C²) on every row. Unit :data:`NODE_PUBLIC_IDS`: removing a node removes only its
  i ≤ K positive tuples (its negative slots see the same — released — rows in both worlds), so the sensitivity profile
  is Δ(i, j) = C·i (Theorem C.1's mixture with j ≡ 0): Σ_i Bin(K', γ)(i)·N(i, σ²) against N(0, σ²), both directions,
  K' = min(K, n) (:func:`~lightning_dprel.datamodules.edge_tuples.accounting.accounted_degree`).
  At K = 1 it is the
  per-example Poisson Gaussian; it never exceeds ``standard`` (Δ = C(i + 2j)), which is the bound to use when the node
  ids are private.
* ``skipgram_edge`` — the provable mode at the edge level: Poisson positives at γ = b/m over the *uncapped* training
  relations, each tuple one relation plus k negatives from the public id universe (NEG-SAMPLE-WOR: they depend on the
  positives only through their count, and the tuples are exchangeable), per-tuple clipping to C, dense noise. Unit
  :data:`EDGE`: removing one relation removes exactly its own tuple (the held-out split hashes each relation alone
  and nothing is capped), so Δ = C and the step is the per-example Poisson sampled Gaussian
  (:func:`~lightning_dprel.accounting.mechanisms.per_example.per_example_poisson_gaussian`, PLD and RDP).
* ``advsgm_paper`` — the paper's Theorem 7 as published (warns: that ε does not hold; the provable ε of the
  paper's pipeline is ∞). Per iteration (one positive and one negative update):
  ε_PSG(B/|E|)(α) + ε_PSG(Bk/|V|)(α), ε_PSG(q) the Poisson-subsampled Gaussian of Mironov et al. (2019) at rate q
  and noise multiplier σ (what TF Privacy's ``compute_rdp`` and dp-accounting's
  ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` compute). Used only to stop the paper-faithful run
  (:func:`advsgm_paper_stop_iteration`).

SamplingSpec mapping for ``advsgm_paper`` (build one with :func:`advsgm_paper_sampling`): ``num_nodes`` = |V|,
``num_edges`` = |E| (the *training* edges), ``expected_batch_size`` = B (the positive batch size),
``sampling_rate`` = B/|E| (the positive update's rate), ``neg_per_pos`` = k (so the negative update's rate is
min(1, B·k/|V|)); ``max_degree`` is not used (the paper caps no degree: the helper sets n − 1).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from lightning_dprel.accounting.analysis.substitution import poisson_gaussian_rdp
from lightning_dprel.accounting.conversion import conversion_constants, epsilon_from_constants, rdp_to_epsilon
from lightning_dprel.accounting.mechanisms.per_example import (
    per_example_poisson_gaussian, per_example_poisson_gaussian_pld,
)
from lightning_dprel.datamodules.edge_tuples.accounting import (
    public_items_pld, public_items_profile, public_items_rdp,
)
from lightning_dprel.datamodules.edge_tuples.spec import NODE_PUBLIC_IDS, EdgeTuples, edge_tuples
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.accounting.registry import check_noise_multiplier, check_step_count, register_mechanism
from lightning_dprel.core.checks import check_choice
from lightning_dprel.core.specs import PrivacyUnit, SamplingSpec, register_privacy_unit

__all__ = [
    "NODE_PUBLIC_IDS", "EDGE", "NODE_REPLACE", "ADVSGM_PAPER_WARNING", "public_ids_profile", "advsgm_paper_sampling",
    "advsgm_paper_epsilon", "advsgm_paper_curve", "advsgm_paper_stop_iteration", "STOP_RULES",
]

EDGE = register_privacy_unit(PrivacyUnit(
    "edge",
    "one relation (an undirected edge) added or removed (edge-level DP); node ids are public. It protects whether one "
    "relation exists, not a node: a node's degree and its whole neighbourhood are not protected",
    "relations",
))
NODE_REPLACE = register_privacy_unit(PrivacyUnit(
    "node_replace",
    "one node with its edges under bounded DP (replace one node, node count fixed), as AdvSGM (Zhang et al.) claims; "
    "no bound proven here holds for it (the paper-faithful accounting under-states ε)",
    "nodes",
))

ADVSGM_PAPER_WARNING = (
    "AdvSGM paper-faithful accounting (Theorem 7): this ε does not hold — the provable ε of the paper's pipeline is ∞. "
    "The ξ noise leaves with its example and never reaches an isolated node's row (δ ≥ 0.5 at T = 750 on PPI), "
    "it is scaled √B·Cσ not BCσ, the constrained sigmoid cancels it to ≈ 0.035σ, nothing is clipped, a node owns "
    "unboundedly many edges (no amplification at B/|E| for a node-level unit), batches are drawn without replacement "
    "but charged as Poisson, and the negative rate Bk/|V| ignores that negatives hang on positives (spec items 1–9). "
    "It only reproduces when the paper's training stops; use accounting='skipgram_public_ids' for a bound that holds."
)

#: The stop rules of :func:`advsgm_paper_stop_iteration`.
STOP_RULES = ("theorem7", "code_product")


#: Δ(i, j)/C = i (node ids public: only the node's own ≤ K positive tuples differ), shape (K+1, 2).
public_ids_profile = public_items_profile
_skipgram_public_ids = public_items_rdp


def _rates(sampling: SamplingSpec) -> tuple[float, float]:
    """(B/|E|, min(1, B·k/|V|)) of the paper's two updates per iteration."""
    batch = float(sampling.expected_batch_size)
    tuples = edge_tuples(sampling)
    return float(sampling.sampling_rate), min(1.0, batch * tuples.neg_per_pos / tuples.num_nodes)


def _advsgm_paper(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    q_pos, q_neg = _rates(sampling)
    return poisson_gaussian_rdp(q_pos, sigma, orders) + poisson_gaussian_rdp(q_neg, sigma, orders)


def advsgm_paper_sampling(
    *, num_nodes: int, num_edges: int, batch_size: int, k: int, privacy_unit: str = NODE_REPLACE.name,
) -> SamplingSpec:
    """The SamplingSpec of the paper's Theorem 7 (see the module docstring for the mapping); ``privacy_unit``: the
    datamodule's declared unit (the paper's claim, ``node_replace``, for the standalone Theorem 7 helpers)."""
    return SamplingSpec(
        population=int(num_edges), contribution_bound=max(1, int(num_nodes) - 1),
        sampling_rate=batch_size / num_edges,
        expected_batch_size=batch_size / num_edges * num_edges,
        steps_per_epoch=math.ceil(num_edges / batch_size),
        privacy_unit=privacy_unit, detail=EdgeTuples(num_nodes=int(num_nodes), neg_per_pos=int(k)),
    )


def advsgm_paper_epsilon(
    iterations: int, *, num_nodes: int, num_edges: int, batch_size: int, k: int, sigma: float, delta: float,
    orders: np.ndarray | None = None,
) -> float:
    """The paper's Theorem 7 ε after ``iterations`` iterations (two updates each), Balle et al. conversion."""
    curve = advsgm_paper_curve(num_nodes=num_nodes, num_edges=num_edges, batch_size=batch_size, k=k, sigma=sigma,
                               delta=delta, orders=orders)
    return curve(check_step_count("iterations", iterations))


def advsgm_paper_curve(
    *, num_nodes: int, num_edges: int, batch_size: int, k: int, sigma: float, delta: float,
    orders: np.ndarray | None = None,
) -> Callable[[int], float]:
    """Theorem 7's ε as a function of the iterations T: the per-iteration RDP is computed once, each ε is T·RDP
    converted (Balle et al.), so a run reads it every iteration at the cost of the conversion alone."""
    orders = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
    spec = advsgm_paper_sampling(num_nodes=num_nodes, num_edges=num_edges, batch_size=batch_size, k=k)
    per_iter = _advsgm_paper(spec, check_noise_multiplier(sigma), orders)
    rdp_to_epsilon(orders, per_iter, delta)  # validates the orders and δ once
    per_iter = np.maximum(np.nan_to_num(per_iter, nan=np.inf, posinf=np.inf), 0.0)
    c1, c2 = conversion_constants(orders)
    return lambda iterations: epsilon_from_constants(orders, c1, c2, int(iterations) * per_iter, delta)[0]


def advsgm_paper_stop_iteration(
    target_eps: float, *, num_nodes: int, num_edges: int, batch_size: int, k: int, sigma: float, delta: float,
    max_iterations: int = 750, rule: str = "theorem7", orders: np.ndarray | None = None,
) -> int:
    """The iteration at which the paper-faithful AdvSGM run stops for ``target_eps`` (``max_iterations`` if never).

    An iteration is one discriminator round: a positive update at rate q₊ = B/|E| and a negative update at
    q₋ = min(1, Bk/|V|). Iterations are numbered 1, 2, … (epoch e ∈ [0, n_epoch), round d ∈ [0, n_D): e·n_D + d + 1);
    ``max_iterations`` = n_epoch·n_D (750 by default).

    Rules:
        ``"theorem7"`` (Thm 7 done right): the number of iterations trained — the last iteration T whose composed
            ε(T·[ε_PSG(q₊) + ε_PSG(q₋)]) ≤ ``target_eps``; iteration T + 1 is the first that would exceed it and is not
            run. PPI (|V| = 3,890, |E| = 68,926, B = 128, k = 5, σ = 5, δ = 1e-5): ε = 1..4 → 50 / 187 / 393 / 660.
        ``"code_product"`` (the authors' script, NetDPer/AdvSGM HEAD, ``n_D`` = 15 rounds per epoch): after each update
            c ∈ {0 (positive), 1 (negative)} of round d of epoch e it charges compute_rdp(q_c, σ) × (d+1)(e+1)(c+1) —
            one update's RDP at the *current* rate times that product, not the composition so far — and stops when
            its ε exceeds the target (δ̂(target ε) > δ in the script: the same test). Returns the number of the
            iteration whose update tripped the check (its updates were applied). PPI: ε = 1..6 →
            28 / 104 / 210 / 345 / 495 / 675.

    ε uses :data:`DEFAULT_ORDERS` and the Balle et al. (2020) conversion (the script's TF Privacy orders and its
    Canonne–Kamath–Steinke δ give the same stop iterations on PPI).
    """
    check_choice("rule", rule, STOP_RULES)
    max_iterations = check_step_count("max_iterations", max_iterations)
    orders = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
    sigma = check_noise_multiplier(sigma)
    spec = advsgm_paper_sampling(num_nodes=num_nodes, num_edges=num_edges, batch_size=batch_size, k=k)
    q_pos, q_neg = _rates(spec)
    r_pos, r_neg = poisson_gaussian_rdp(q_pos, sigma, orders), poisson_gaussian_rdp(q_neg, sigma, orders)

    def eps(rdp: np.ndarray) -> float:
        return rdp_to_epsilon(orders, rdp, delta)[0]

    if rule == "theorem7":
        per_iter = r_pos + r_neg
        if eps(max_iterations * per_iter) <= target_eps:
            return max_iterations
        lo, hi = 0, max_iterations  # ε(lo) ≤ target < ε(hi); ε(T) is non-decreasing in T
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if eps(mid * per_iter) <= target_eps:
                lo = mid
            else:
                hi = mid
        return lo
    n_d = 15  # the script's d_epoch (n_D)
    for it in range(max_iterations):
        e, d = divmod(it, n_d)
        for c, rdp in enumerate((r_pos, r_neg)):
            if eps((d + 1) * (e + 1) * (c + 1) * rdp) > target_eps:
                return it + 1
    return max_iterations


register_mechanism(
    "skipgram_public_ids", _skipgram_public_ids, coupled=False, privacy_unit=NODE_PUBLIC_IDS,
    label="skip-gram, public ids (Thm C.1, j≡0)", clipping=("standard",), accounting="skipgram_public_ids",
    pld=public_items_pld,
    description="skip-gram with negatives from public node ids: Theorem C.1's mixture with Δ=C·i (no negative-slot term)",
)
def _uncapped(sampling: SamplingSpec) -> None:
    """``skipgram_edge``'s premise: nothing capped (a cap that keeps edges by their neighbours lets one relation change
    others), whatever unit the datamodule declares."""
    from lightning_dprel.datamodules.edge_tuples.graph_prep import NO_DEGREE_CAP

    if sampling.contribution_bound < NO_DEGREE_CAP:
        raise ValueError(
            f"accounting='skipgram_edge' (one relation, Δ = C) holds only for uncapped data, but the datamodule caps "
            f"degrees at K = {sampling.contribution_bound}: a cap that keeps edges by their "
            "neighbours "
            "lets one relation change "
            "others. Use EdgeSkipGramDataModule."
        )


register_mechanism(
    "skipgram_edge", per_example_poisson_gaussian, coupled=False, privacy_unit=EDGE,
    label="skip-gram, edge level (Poisson Gaussian)", clipping=("standard",), accounting="skipgram_edge",
    pld=per_example_poisson_gaussian_pld, check_sampling=_uncapped,
    description="skip-gram, one relation per tuple, Poisson at γ = b/m, Δ = C: the per-example Poisson sampled Gaussian",
)
register_mechanism(
    "advsgm_paper", _advsgm_paper, coupled=False, privacy_unit=NODE_REPLACE, label="AdvSGM paper Thm 7 (does not hold)",
    warning=ADVSGM_PAPER_WARNING,
    description="AdvSGM as published (Theorem 7): ε_PSG(B/|E|) + ε_PSG(Bk/|V|) per iteration (provable ε = ∞)",
)
