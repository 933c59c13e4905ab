"""Tests of the coupled sampling primitives (Algorithms 1-3): invariants, seeded statistics, references.

The statistical tests run on both sources the functions accept: a torch.Generator and the keyed CSPRNG
stream the datamodule uses (:class:`~lightning_dprel.core.randomness.KeyedStream`)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from scipy import stats

from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.edge_tuples.evaluation import sample_eval_candidates
from lightning_dprel.datamodules.edge_tuples.sampling import (
    cap_degree,
    edge_priority,
    max_freq,
    neg_sample_wor,
    poisson_positives,
    sample_without_replacement,
    to_simple_undirected,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _source(kind: str, seed: int):
    """A seeded torch.Generator or a seeded KeyedStream (both are accepted as ``generator=``)."""
    return _gen(seed) if kind == "torch" else KeyedStream.seeded(seed, "test/sampling", warn=False)


KINDS = pytest.mark.parametrize("kind", ["torch", "keyed"])


def _random_simple(n: int, m: int, seed: int) -> torch.Tensor:
    ei = torch.randint(0, n, (2, m), generator=_gen(seed))
    return to_simple_undirected(ei, n)


def _degrees(ei: torch.Tensor, n: int) -> torch.Tensor:
    return torch.bincount(ei.flatten(), minlength=n)


# ----------------------------------------------------------------------------- to_simple_undirected
def test_to_simple_undirected_hand_built():
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3], [1, 0, 1, 3, 3, 2, 0]])
    out = to_simple_undirected(ei, 4)
    assert out.tolist() == [[0, 0, 2], [1, 3, 3]]


def test_to_simple_undirected_matches_python_sets():
    n = 30
    ei = torch.randint(0, n, (2, 200), generator=_gen(1))
    ref = sorted({(min(a, b), max(a, b)) for a, b in ei.t().tolist() if a != b})
    out = to_simple_undirected(ei, n)
    assert [tuple(c) for c in out.t().tolist()] == ref


@pytest.mark.parametrize(
    ("edge_index", "num_nodes", "match"),
    [
        (torch.tensor([[0, 5], [1, 2]]), 5, r"outside \[0, num_nodes\)"),
        (torch.tensor([[-1, 0], [1, 2]]), 5, r"outside \[0, num_nodes\)"),
        (torch.tensor([0, 1, 2]), 5, r"shape \[2, E\]"),
        (torch.tensor([[0, 1], [1, 2]]), 0, r"`num_nodes` must be an int >= 1"),
    ],
)
def test_to_simple_undirected_bad_input(edge_index, num_nodes, match):
    with pytest.raises(ValueError, match=match):
        to_simple_undirected(edge_index, num_nodes)


def test_to_simple_undirected_keep_orientation_keeps_the_first_listing():
    ei = torch.tensor([[3, 1, 0, 2, 2, 0, 1], [2, 0, 1, 2, 3, 3, 3]])  # (3,2) then (2,3); (1,0) then (0,1); a self-loop
    out = to_simple_undirected(ei, 4, keep_orientation=True)
    assert out.tolist() == [[1, 0, 1, 3], [0, 3, 3, 2]]  # same columns as the canonical form, first orientation
    assert torch.equal(torch.sort(out, dim=0).values, to_simple_undirected(ei, 4))


def test_to_simple_undirected_float_ids_type_error():
    with pytest.raises(TypeError, match="integer node ids"):
        to_simple_undirected(torch.tensor([[0.0, 1.0], [1.0, 2.0]]), 3)


# ----------------------------------------------------------------------------- cap_degree
@pytest.mark.parametrize("k_cap", [1, 2, 5])
def test_cap_degree_drop_bounds_degree_and_keeps_a_subset(k_cap):
    n = 200
    simple = _random_simple(n, 2000, seed=k_cap)
    capped = cap_degree(simple, n, k_cap, policy="drop", generator=_gen(3))
    assert int(_degrees(capped, n).max()) <= k_cap
    assert set(map(tuple, capped.t().tolist())) <= set(map(tuple, simple.t().tolist()))
    assert capped.shape[1] > 0


def test_cap_degree_drop_matches_python_reference():
    """Edge kept iff among the K smallest priorities at both ends (a loop-based reference)."""
    n, k_cap, salt_gen = 60, 3, 11
    simple = _random_simple(n, 400, seed=2)
    salt = int(torch.randint(0, 2**62, (1,), generator=_gen(salt_gen)))
    prio = edge_priority(simple, salt).tolist()
    edges = [tuple(c) for c in simple.t().tolist()]
    by_node: dict[int, list[tuple[int, int]]] = {}
    for (u, v), p in zip(edges, prio):
        by_node.setdefault(u, []).append((p, (u, v)))
        by_node.setdefault(v, []).append((p, (u, v)))
    top = {node: {e for _, e in sorted(lst)[:k_cap]} for node, lst in by_node.items()}
    ref = [e for e in edges if e in top[e[0]] and e in top[e[1]]]
    out = cap_degree(simple, n, k_cap, policy="drop", generator=_gen(salt_gen))
    assert [tuple(c) for c in out.t().tolist()] == ref


def test_cap_degree_drop_is_deterministic_and_order_free():
    n = 300
    simple = _random_simple(n, 3000, seed=4)
    a = cap_degree(simple, n, 4, policy="drop", generator=_gen(7))
    b = cap_degree(simple, n, 4, policy="drop", generator=_gen(7))
    c = cap_degree(simple, n, 4, policy="drop", generator=_gen(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # Same edge set given in another order and orientation: same capped set.
    perm = torch.randperm(simple.shape[1], generator=_gen(9))
    shuffled = simple[:, perm].flip(0)
    d = cap_degree(to_simple_undirected(shuffled, n), n, 4, policy="drop", generator=_gen(7))
    assert torch.equal(a, d)


def test_cap_degree_drop_node_removal_is_local():
    """Removing node w: w's capped edges go, no other kept edge is dropped, ≤ 1 edge added per neighbour."""
    n, k_cap = 150, 3
    simple = _random_simple(n, 1200, seed=5)
    full = cap_degree(simple, n, k_cap, policy="drop", generator=_gen(1))
    full_set = set(map(tuple, full.t().tolist()))
    deg = _degrees(simple, n)
    for w in torch.argsort(deg, descending=True)[:10].tolist():
        rest = simple[:, (simple[0] != w) & (simple[1] != w)]
        capped = set(map(tuple, cap_degree(rest, n, k_cap, policy="drop", generator=_gen(1)).t().tolist()))
        untouched = {e for e in full_set if w not in e}
        assert untouched <= capped, "an edge not incident to the removed node was dropped"
        added = capped - untouched
        nbrs = {a if b == w else b for a, b in map(tuple, simple.t().tolist()) if w in (a, b)}
        per_nbr = Counter(x for e in added for x in e if x in nbrs)
        assert all(e[0] in nbrs or e[1] in nbrs for e in added)
        assert len(added) <= len(nbrs)
        assert max(per_nbr.values(), default=0) <= 1


def test_cap_degree_assert_policy():
    star = torch.tensor([[0, 0, 0, 1], [1, 2, 3, 2]])
    assert torch.equal(cap_degree(star, 4, 3, policy="assert"), star)
    with pytest.raises(ValueError, match=r"capping='assert' needs max degree <= max_degree=2.*largest degree 3"):
        cap_degree(star, 4, 2, policy="assert")


def test_cap_degree_drop_is_identity_below_cap():
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    assert torch.equal(cap_degree(ei, 4, 2, policy="drop", generator=_gen()), ei)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"max_degree": 0}, ValueError, r"`max_degree` \(K\) must be an int >= 1, got 0"),
        ({"max_degree": 2, "policy": "random"}, ValueError, r"`policy` must be one of \('drop', 'assert'\)"),
        ({"max_degree": 2, "generator": None}, TypeError, r"`generator` must be a .*KeyedStream or a torch.Generator"),
    ],
)
def test_cap_degree_bad_options(kwargs, exc, match):
    ei = torch.tensor([[0, 0, 0], [1, 2, 3]])
    kwargs = {"generator": _gen(), **kwargs}
    with pytest.raises(exc, match=match):
        cap_degree(ei, 4, **kwargs)


def test_cap_degree_rejects_non_canonical_edges():
    with pytest.raises(ValueError, match="call to_simple_undirected first"):
        cap_degree(torch.tensor([[1, 0], [0, 2]]), 3, 2, generator=_gen())


def test_edge_priority_depends_only_on_the_edge():
    a = torch.tensor([[0, 1, 5], [3, 4, 9]])
    b = torch.tensor([[5, 2], [9, 7]])
    assert edge_priority(a, 42)[2] == edge_priority(b, 42)[0]
    assert edge_priority(a, 42)[2] != edge_priority(a, 43)[2]
    assert bool((edge_priority(a, 42) >= 0).all())


# ----------------------------------------------------------------------------- poisson_positives
@pytest.mark.parametrize(("kind", "m", "gamma", "draws"), [
    ("torch", 200, 0.1, 4000), ("torch", 100_000, 0.0005, 2000), ("keyed", 200, 0.1, 4000), ("keyed", 20_000, 0.002, 400),
])
def test_poisson_positive_count_is_binomial(kind, m, gamma, draws):
    g = _source(kind, 12)
    counts = torch.tensor([poisson_positives(m, gamma, generator=g).numel() for _ in range(draws)], dtype=torch.float64)
    mean, var = m * gamma, m * gamma * (1 - gamma)
    # Seeded: tolerances are 5 standard errors of the sample mean / sample variance.
    assert abs(float(counts.mean()) - mean) < 5 * math.sqrt(var / draws)
    assert abs(float(counts.var()) - var) < 5 * var * math.sqrt(2 / (draws - 1))


@KINDS
def test_poisson_positive_inclusion_is_uniform_and_indices_valid(kind):
    m, gamma, draws = 40, 0.25, 3000
    g = _source(kind, 13)
    hits = torch.zeros(m)
    for _ in range(draws):
        idx = poisson_positives(m, gamma, generator=g)
        assert idx.numel() == idx.unique().numel()
        assert bool((idx[1:] > idx[:-1]).all()) and (idx.numel() == 0 or (0 <= int(idx.min()) and int(idx.max()) < m))
        hits[idx] += 1
    assert stats.chisquare(hits.numpy()).pvalue > 1e-3
    assert abs(float(hits.mean()) / draws - gamma) < 0.01


def test_poisson_positives_rate_one_takes_everything_and_bad_rate_raises():
    assert poisson_positives(7, 1.0, generator=_gen()).tolist() == list(range(7))
    with pytest.raises(ValueError, match=r"`rate` \(gamma\) must be in \(0, 1\], got 1.5"):
        poisson_positives(7, 1.5, generator=_gen())


# ----------------------------------------------------------------------------- NEG-SAMPLE-WOR
@KINDS
def test_neg_sample_wor_invariants(kind):
    g = _source(kind, 14)
    for num_pos, k, n in [(0, 4, 10), (3, 0, 10), (5, 4, 20), (50, 4, 1000), (7, 3, 21)]:
        neg, anchor = neg_sample_wor(num_pos, k, n, generator=g)
        assert neg.shape == anchor.shape == (num_pos, k)
        assert neg.unique().numel() == num_pos * k, "a node filled two negative slots"
        assert neg.numel() == 0 or (int(neg.min()) >= 0 and int(neg.max()) < n)
        assert set(anchor.flatten().tolist()) <= {0, 1}


@KINDS
@pytest.mark.parametrize(("num_pos", "k", "n"), [(5, 4, 50), (2, 3, 1000)])  # randperm and rejection branches
def test_neg_sample_wor_is_uniform_over_nodes(kind, num_pos, k, n):
    g = _source(kind, 15)
    draws = 40 * n // (num_pos * k)
    counts = torch.zeros(n)
    first_slot = torch.zeros(n)
    anchors = 0.0
    for _ in range(draws):
        neg, anchor = neg_sample_wor(num_pos, k, n, generator=g)
        counts[neg.flatten()] += 1
        first_slot[neg[0, 0]] += 1
        anchors += float(anchor.float().mean())
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3
    assert stats.chisquare(first_slot.numpy()).pvalue > 1e-3
    assert abs(anchors / draws - 0.5) < 0.02


def test_neg_sample_wor_depends_only_on_the_count():
    """Same generator state and count ⇒ same negatives; the function never sees the positives."""
    for kind in ("torch", "keyed"):
        a = neg_sample_wor(6, 4, 100, generator=_source(kind, 16))
        b = neg_sample_wor(6, 4, 100, generator=_source(kind, 16))
        c = neg_sample_wor(6, 4, 100, generator=_source(kind, 17))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])


def test_neg_sample_wor_refuses_overflow():
    with pytest.raises(ValueError, match=r"needs \|E\+\|\*k <= n, got \|E\+\|=6, k=4, n=20"):
        neg_sample_wor(6, 4, 20, generator=_gen())
    with pytest.raises(ValueError, match=r"`neg_per_pos` must be an int >= 0, got -1"):
        neg_sample_wor(2, -1, 20, generator=_gen())


@KINDS
def test_sample_without_replacement_sets_are_uniform(kind):
    """Every 2-subset of 6 items equally likely (both code paths)."""
    for population, size in [(6, 2), (60, 2)]:
        g = _source(kind, 18)
        sets = Counter(tuple(sorted(sample_without_replacement(population, size, generator=g).tolist())) for _ in range(6000))
        if population == 6:
            assert len(sets) == 15
            assert stats.chisquare(list(sets.values())).pvalue > 1e-3
        else:
            items = Counter(x for s in sets.elements() for x in s)
            assert len(items) == population
            assert stats.chisquare(list(items.values())).pvalue > 1e-3


# ----------------------------------------------------------------------------- max_freq
def _brute_max_freq(pos: torch.Tensor, neg: torch.Tensor) -> list[int]:
    tuples = [set(p) | set(z) for p, z in zip(pos.tolist(), neg.tolist())]
    freq = Counter(x for t in tuples for x in t)
    return [max(freq[x] for x in t) for t in tuples]


@pytest.mark.parametrize("seed", range(6))
def test_max_freq_matches_brute_force(seed):
    g = _gen(seed)
    num_pos, k, n = int(torch.randint(0, 12, (1,), generator=g)), int(torch.randint(0, 4, (1,), generator=g)), 15
    pos = torch.randint(0, n, (num_pos, 2), generator=g)
    neg = torch.randint(0, n, (num_pos, k), generator=g)  # repeats allowed: exercises the counting
    assert max_freq(pos, neg).tolist() == _brute_max_freq(pos, neg)


def test_max_freq_hand_example():
    pos = torch.tensor([[0, 1], [1, 2], [3, 4]])
    neg = torch.tensor([[1], [5], [0]])  # tuple 0 holds node 1 twice: counted once
    assert max_freq(pos, neg).tolist() == [2, 2, 2]


# ----------------------------------------------------------------------------- evaluation candidates
def test_sample_eval_candidates():
    query, target = torch.tensor([0, 5, 9]), torch.tensor([1, 2, 8])
    cand = sample_eval_candidates(query, target, 10, 8, generator=_gen(19))
    assert cand.shape == (3, 9)
    assert cand[:, 0].tolist() == target.tolist()
    for q, row in zip(query.tolist(), cand.tolist()):
        assert len(set(row)) == 9 and q not in row and all(0 <= x < 10 for x in row)
    with pytest.raises(ValueError, match=r"`eval_candidates` must be in \[1, n - 2\] = \[1, 8\]"):
        sample_eval_candidates(query, target, 10, 9, generator=_gen())
