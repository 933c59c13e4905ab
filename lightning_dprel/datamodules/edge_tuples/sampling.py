"""Coupled relational sampling as pure tensor functions (Algorithms 1-3 of Huang et al.).

Every random function takes an explicit source of randomness — a
:class:`~lightning_dprel.core.randomness.KeyedStream` (the CSPRNG the datamodule uses by default) or a
``torch.Generator`` (tests); the datamodule wires them together:

1. :func:`to_simple_undirected` — self-loops, duplicates and reverse duplicates removed (Algorithm 3's
   input is a set of undirected relations).
2. :func:`cap_degree` — Algorithm 3, line 1 (degree capping to K).
3. :func:`poisson_positives` — Algorithm 3, line 3 (E⁺, Poisson sampling of Ē at rate γ).
4. :func:`neg_sample_wor` — Algorithm 2 (NEG-SAMPLE-WOR).
5. :func:`max_freq` — Algorithm 1's max-freq(T_i).

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithms 1-3. Daigavane et al. 2021 (arXiv 2111.15521), Algorithm 1 (degree capping).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_dprel.core import randomness
from lightning_dprel.core.checks import check_choice, check_int, check_probability
from lightning_dprel.core.randomness import check_source

__all__ = [
    "CAPPING_POLICIES",
    "to_simple_undirected",
    "edge_priority",
    "cap_degree",
    "poisson_positives",
    "neg_sample_wor",
    "sample_without_replacement",
    "max_freq",
]

CAPPING_POLICIES = ("drop", "assert")

# splitmix64 constants as signed int64 (torch int64 arithmetic wraps modulo 2^64).
_M64 = 1 << 64
_GOLDEN = 0x9E3779B97F4A7C15 - _M64
_MIX1 = 0xBF58476D1CE4E5B9 - _M64
_MIX2 = 0x94D049BB133111EB - _M64
_MAX_NODE_ID = (1 << 31) - 1


def _check_edge_index(edge_index: Tensor, num_nodes: int) -> None:
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"`edge_index` must be a torch.Tensor, got {type(edge_index).__name__}.")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"`edge_index` must have shape [2, E], got {tuple(edge_index.shape)}.")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise TypeError(f"`edge_index` must hold integer node ids, got dtype {edge_index.dtype}.")
    check_int("num_nodes", num_nodes, 1)
    if num_nodes > _MAX_NODE_ID:
        raise ValueError(f"`num_nodes` must be < 2^31, got {num_nodes}.")
    if edge_index.numel() > 0:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise ValueError(
                f"`edge_index` holds node ids in [{lo}, {hi}], outside [0, num_nodes) = [0, {num_nodes}); "
                "fix the edge list or pass the right number of nodes."
            )


def _check_generator(generator: Any) -> None:
    check_source(generator, "generator")


def to_simple_undirected(edge_index: Tensor, num_nodes: int, *, keep_orientation: bool = False) -> Tensor:
    """The simple undirected graph of ``edge_index``: one column per relation, sorted by (min, max) endpoint.

    Self-loops are dropped; (u, v), (v, u) and repeats collapse to one edge, so the result is a function of
    the edge *set* only. This is the one edge-cleaning routine of the library (the datamodule uses it too).

    Args:
        edge_index: ``[2, E]`` integer node ids (directed or undirected, any order).
        num_nodes: n; ids must lie in ``[0, n)``.
        keep_orientation: False (default): canonical columns (u < v). True: each relation as it was
            first listed (e.g. child → parent), same column order.

    Returns:
        ``[2, m]`` long tensor, sorted lexicographically by (min, max) endpoint.

    Raises:
        ValueError: wrong shape, ids out of range.
    """
    _check_edge_index(edge_index, num_nodes)
    ei = edge_index.long()
    u, v = torch.minimum(ei[0], ei[1]), torch.maximum(ei[0], ei[1])
    keep = u != v
    key = u[keep] * num_nodes + v[keep]
    if not keep_orientation:
        key = torch.unique(key)  # sorted
        return torch.stack([key // num_nodes, key % num_nodes])
    ei = ei[:, keep]
    uniq, inverse = torch.unique(key, return_inverse=True)
    first = torch.full((uniq.numel(),), key.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(key.numel()), reduce="amin")  # first listing of each relation
    return ei[:, first]


def _splitmix64(x: Tensor) -> Tensor:
    """Vectorised splitmix64 finaliser on int64 (wrapping arithmetic, logical shifts)."""

    def xor_shr_(t: Tensor, s: int) -> Tensor:  # t ^= t >>> s (logical shift), in place
        return t.bitwise_xor_(torch.bitwise_right_shift(t, s).bitwise_and_((1 << (64 - s)) - 1))

    x = x + _GOLDEN
    xor_shr_(x, 30).mul_(_MIX1)
    xor_shr_(x, 27).mul_(_MIX2)
    return xor_shr_(x, 31)


def edge_priority(edge_index: Tensor, salt: int) -> Tensor:
    """A pseudo-random priority per edge, a function of the edge's endpoints and ``salt`` only.

    The priority of (u, v) does not depend on the rest of the graph or on the edge's position, so removing
    a node leaves every other edge's priority unchanged (what makes :func:`cap_degree`'s ``"drop"`` policy
    stable under node removal).

    Args:
        edge_index: ``[2, m]`` canonical edges (u < v < 2^31).
        salt: any Python int (e.g. drawn from a seeded generator).

    Returns:
        ``[m]`` int64 priorities in ``[0, 2^63)``; smaller means kept first.
    """
    key = (edge_index[0].long() << 31) | edge_index[1].long()
    salt = int(salt) % _M64
    salt = salt - _M64 if salt >= (1 << 63) else salt
    return _splitmix64(key.bitwise_xor_(salt)).bitwise_and_((1 << 63) - 1)


def cap_degree(
    edge_index: Tensor,
    num_nodes: int,
    max_degree: int,
    *,
    policy: str = "drop",
    generator: Any | None = None,
) -> Tensor:
    """Degree capping to K (Algorithm 3, line 1): every node keeps at most ``max_degree`` edges.

    Policies, and what the privacy guarantee then covers:

    * ``"assert"``: the input must already have max degree ≤ K (K a *publicly known* bound); the edges are
      returned unchanged, otherwise a ``ValueError`` is raised. Capping is the identity, so the
      entity-level guarantee holds for the input graph itself: removing a node changes exactly its ≤ K
      edges, as the accountant assumes.
    * ``"drop"``: a seeded random priority is fixed *per edge* (:func:`edge_priority`, a hash of the
      endpoints and a salt drawn once from ``generator``), and edge (u, v) is kept iff it is among the K
      highest-priority edges of u **and** among the K highest-priority edges of v. This reads the data, so
      it is not the identity: under removal of a node w, (a) w's ≤ K capped edges disappear; (b) no other
      kept edge is ever dropped (ranks only improve); (c) each neighbour u of w whose edge (u, w) was in
      u's top K may gain at most one edge (its (K+1)-th), so the capped graphs differ by w's capped edges
      plus at most deg(w) added edges at w's *uncapped* neighbours — bounded by w's raw degree, not by K.
      The accountant's K-edge neighbouring relation therefore holds for the **capped** graph taken as the
      dataset; for the raw graph it holds exactly only when no such edge moves (always when the raw graph
      has max degree ≤ K). The paper's sequential random dropping (Daigavane et al. 2021, Algorithm 1) has
      no such structure (removing a node can both add and drop edges anywhere, in cascades), though on
      power-law graphs it moved fewer edges when a hub was removed; ``benchmarks/bench_sampling.py``
      measures both.

    The result is a deterministic function of (edge set, K, salt), i.e. of the edge set and the generator
    state; edges keep the input order (sorted if the input came from :func:`to_simple_undirected`).

    Args:
        edge_index: ``[2, m]`` simple canonical edges (u < v), e.g. from :func:`to_simple_undirected`.
        num_nodes: n.
        max_degree: K ≥ 1.
        policy: ``"drop"`` or ``"assert"`` (keyword-only).
        generator: required for ``"drop"``; one salt is drawn from it.

    Returns:
        ``[2, m']`` capped edges, a subset of the input columns in input order.

    Raises:
        ValueError: K < 1, unknown policy, non-canonical edges, or (``"assert"``) a node above K.
        TypeError: ``"drop"`` without a KeyedStream or ``torch.Generator``.
    """
    _check_edge_index(edge_index, num_nodes)
    check_int("max_degree (K)", max_degree, 1)
    check_choice("policy", policy, CAPPING_POLICIES)
    ei = edge_index.long()
    if ei.shape[1] and not bool((ei[0] < ei[1]).all()):
        raise ValueError(
            "`edge_index` must be simple and canonical (u < v, no self-loops); call to_simple_undirected first."
        )
    deg = torch.bincount(ei.flatten(), minlength=num_nodes)
    if policy == "assert":
        worst = int(deg.max()) if deg.numel() else 0
        if worst > max_degree:
            over = int((deg > max_degree).sum())
            raise ValueError(
                f"capping='assert' needs max degree <= max_degree={max_degree}, but {over} node(s) exceed it "
                f"(largest degree {worst}); use capping='drop' or raise max_degree."
            )
        return ei
    _check_generator(generator)
    salt = int(randomness.randint(2**62, 1, generator))
    m = ei.shape[1]
    if m == 0 or int(deg.max()) <= max_degree:
        return ei
    # Edges in priority order (stable: ties, ~m²/2^64 likely, fall back to input order).
    order = torch.sort(edge_priority(ei, salt), stable=True).indices
    # Incidences (node, edge) in priority order, then grouped by node: rank of the edge at that node.
    # Interleaved (u_0, v_0, u_1, v_1, ...) so that a stable sort by node keeps priority order per node.
    inc_node = torch.stack([ei[0].index_select(0, order), ei[1].index_select(0, order)], dim=1).view(-1)
    inc_edge = torch.stack([order, order], dim=1).view(-1)
    by_node = torch.sort(inc_node, stable=True).indices
    start = torch.cumsum(deg, 0) - deg
    sorted_nodes = inc_node.index_select(0, by_node)
    rank_sorted = torch.arange(2 * m).sub_(start.index_select(0, sorted_nodes))
    edge_sorted = inc_edge.index_select(0, by_node)
    # An edge survives iff its rank is < K at both of its two incidences.
    over = torch.zeros(m, dtype=torch.bool)
    over[edge_sorted[rank_sorted >= max_degree]] = True
    return ei[:, ~over]


def sample_without_replacement(population: int, size: int, *, generator: Any) -> Tensor:
    """``size`` distinct ints drawn uniformly from ``[0, population)``, in uniformly random order.

    For small samples, draws i.i.d. uniform ids and keeps first occurrences (the first ``size`` distinct
    values of an i.i.d. uniform sequence form a uniformly random ordered sample without replacement);
    for large ones, a prefix of a random permutation. Exact in both regimes.

    Raises:
        ValueError: ``size`` < 0 or ``size`` > ``population``.
    """
    if size < 0 or size > population:
        raise ValueError(f"cannot draw {size} distinct items from a population of {population}.")
    if size == 0:
        return torch.zeros(0, dtype=torch.long)
    if 8 * size > population:
        return randomness.randperm(population, generator)[:size]
    seq = torch.zeros(0, dtype=torch.long)
    while True:
        need = size + size // 4 + 8
        seq = torch.cat([seq, randomness.randint(population, need, generator)])
        uniq, inv = torch.unique(seq, return_inverse=True)
        if uniq.numel() >= size:
            break
    first = torch.full((uniq.numel(),), seq.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(seq.numel()), reduce="amin")
    return seq[torch.sort(first).values[:size]]


def poisson_positives(num_edges: int, rate: float, *, generator: Any) -> Tensor:
    """E⁺ of Algorithm 3, line 3: each of the m capped edges independently with probability γ.

    Drawn as |E⁺| ~ Binomial(m, γ) followed by a uniform |E⁺|-subset, which has exactly the distribution
    of independent per-edge coins but costs O(|E⁺|) instead of O(m).

    Args:
        num_edges: m ≥ 1.
        rate: γ in (0, 1].
        generator: the source of randomness.

    Returns:
        ``[|E⁺|]`` sorted long indices into the capped edge list (possibly empty: a real step).
    """
    _check_generator(generator)
    check_int("num_edges", num_edges, 1)
    check_probability("rate (gamma)", rate, one=True)
    size = randomness.binomial(num_edges, float(rate), generator)
    return torch.sort(sample_without_replacement(num_edges, size, generator=generator)).values


def neg_sample_wor(
    num_pos: int, neg_per_pos: int, num_nodes: int, *, generator: Any
) -> tuple[Tensor, Tensor]:
    """Algorithm 2, NEG-SAMPLE-WOR: |E⁺|·k distinct negative nodes, uniform over V, plus anchor ends.

    The draw depends on the positives only through their count ``num_pos`` (it never sees them), so
    the same generator state and count give the same negatives whatever positives were drawn; no node
    fills two negative slots of a batch (|B₋(u)| ≤ 1).

    Args:
        num_pos: B = |E⁺| ≥ 0.
        neg_per_pos: k ≥ 0.
        num_nodes: n; needs B·k ≤ n.
        generator: the source of randomness.

    Returns:
        ``(neg, neg_anchor)``: ``[B, k]`` negative node ids z_{i,j} and ``[B, k]`` anchors in {0, 1}
        (e_{i,j}⁻ = (pos[i, neg_anchor[i, j]], z_{i,j}), each end chosen uniformly).

    Raises:
        ValueError: B·k > n (NEG-SAMPLE-WOR is undefined; never truncated), negative arguments.
    """
    _check_generator(generator)
    check_int("num_pos", num_pos, 0)
    check_int("neg_per_pos", neg_per_pos, 0)
    if num_pos * neg_per_pos > num_nodes:
        raise ValueError(
            f"NEG-SAMPLE-WOR needs |E+|*k <= n, got |E+|={num_pos}, k={neg_per_pos}, n={num_nodes}; "
            "lower expected_batch_size or neg_per_pos."
        )
    total = num_pos * neg_per_pos
    neg = sample_without_replacement(num_nodes, total, generator=generator).view(num_pos, neg_per_pos)
    anchor = randomness.randint(2, total, generator).view(num_pos, neg_per_pos)
    return neg, anchor


def max_freq(pos: Tensor, neg: Tensor) -> Tensor:
    """Algorithm 1's max-freq(T_i): the max over the tuple's nodes of the number of tuples they occur in.

    A node is counted once per tuple even if it fills two roles there (a negative may equal an end of
    its own positive). Vectorised over the whole logical batch.

    Args:
        pos: ``[B, 2]`` positive edges (global node ids).
        neg: ``[B, k]`` negative nodes (global node ids).

    Returns:
        ``[B]`` long tensor, each entry ≥ 1 (empty when B = 0).
    """
    if pos.dim() != 2 or pos.shape[1] != 2:
        raise ValueError(f"`pos` must have shape [B, 2], got {tuple(pos.shape)}.")
    if neg.dim() != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"`neg` must have shape [B, k] with B = {pos.shape[0]}, got {tuple(neg.shape)}.")
    nodes = torch.cat([pos, neg], dim=1).long()
    if nodes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=pos.device)
    nodes, _ = torch.sort(nodes, dim=1)
    first = torch.ones_like(nodes, dtype=torch.bool)
    first[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
    uniq, inverse = torch.unique(nodes, return_inverse=True)
    freq = torch.zeros(uniq.numel(), dtype=torch.long, device=pos.device)
    # Weighted scatter rather than ``inverse[first]``: boolean indexing is multi-threaded on CPU and stalls
    # badly when the cores are shared.
    freq.scatter_add_(0, inverse.reshape(-1), first.reshape(-1).long())
    return freq[inverse].max(dim=1).values
