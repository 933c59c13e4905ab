"""AdvSGM Section VI's utility metrics: random non-edges, link-prediction AUC, k-means clustering NMI / MI."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lightning_dprel.methods.advsgm.evaluation import cluster_scores, link_auc, sample_non_edges


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pairs(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return {(min(u, v), max(u, v)) for u, v in edge_index.t().tolist()}


# --- sample_non_edges ------------------------------------------------------------------------------------------------

def _check_non_edges(non_edges: torch.Tensor, edge_index: torch.Tensor, count: int) -> None:
    assert non_edges.shape == (2, count) and non_edges.dtype == torch.long
    assert bool((non_edges[0] < non_edges[1]).all())  # u < v: no self-loop, one orientation
    got = _pairs(non_edges)
    assert len(got) == count  # distinct
    assert got.isdisjoint(_pairs(edge_index))  # no edge, in either direction


def test_non_edges_small_graph_are_non_edges_distinct_and_exhaustive() -> None:
    edges = torch.tensor([[0, 1, 2, 5, 4], [1, 2, 0, 3, 3]])  # a triangle and a path, given in mixed orientation
    n, free = 6, 15 - 5
    for seed in range(5):
        _check_non_edges(sample_non_edges(edges, n, 7, generator=_gen(seed)), edges, 7)
    every = sample_non_edges(edges, n, free, generator=_gen(1))
    assert _pairs(every) == set(itertools.combinations(range(n), 2)) - _pairs(edges)
    assert sample_non_edges(edges, n, 0, generator=_gen()).shape == (2, 0)
    with pytest.raises(ValueError, match="Cannot draw 11 distinct non-edges: .* only 10"):
        sample_non_edges(edges, n, free + 1, generator=_gen())


def test_non_edges_respect_both_directions_and_the_last_free_pair() -> None:
    n = 8
    complete = torch.tensor(list(itertools.combinations(range(n), 2))).t()
    keep = [i for i, (u, v) in enumerate(complete.t().tolist()) if (u, v) != (2, 5)]
    edges = complete[:, keep].flip(0)  # every pair but {2, 5}, listed as (v, u) only
    assert sample_non_edges(edges, n, 1, generator=_gen(3)).t().tolist() == [[2, 5]]


def test_non_edges_are_seeded_and_uniform() -> None:
    edges = torch.tensor([[0, 1], [1, 2]])
    assert torch.equal(sample_non_edges(edges, 5, 4, generator=_gen(9)), sample_non_edges(edges, 5, 4, generator=_gen(9)))
    counts: dict[tuple[int, int], int] = {}
    for seed in range(1600):
        (pair,) = _pairs(sample_non_edges(edges, 5, 1, generator=_gen(seed)))
        counts[pair] = counts.get(pair, 0) + 1
    assert len(counts) == 8  # C(5, 2) − 2 free pairs, each drawn about 200 times
    assert all(abs(c - 200) < 5 * math.sqrt(200) for c in counts.values()), counts


def test_non_edges_large_graph_by_rejection() -> None:
    n = 3000  # 4.5M pairs: above the enumeration limit
    g = _gen(5)
    edges = torch.randint(0, n, (2, 30_000), generator=g)
    non = sample_non_edges(edges, n, 20_000, generator=_gen(6))
    _check_non_edges(non, edges, 20_000)
    assert torch.equal(non, sample_non_edges(edges, n, 20_000, generator=_gen(6)))
    assert abs(non.float().mean().item() - (n - 1) / 2) < 30  # endpoints spread over all ids


def test_non_edges_bad_input() -> None:
    edges = torch.tensor([[0], [1]])
    with pytest.raises(TypeError, match="seeded torch.Generator"):
        sample_non_edges(edges, 4, 1, generator=0)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        sample_non_edges(torch.tensor([[0], [3]]), 2, 1, generator=_gen())
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        sample_non_edges(torch.tensor([0, 1]), 4, 1, generator=_gen())
    with pytest.raises(ValueError, match="`count` must be an int >= 0"):
        sample_non_edges(edges, 4, -1, generator=_gen())


# --- link_auc --------------------------------------------------------------------------------------------------------

def _brute_auc(vectors: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, cosine: bool = False) -> float:
    """P(s+ > s−) + ½·P(s+ = s−) over every (positive, negative) pair (a pair listed twice scores the same both times)."""
    def s(u: int, v: int) -> float:
        a, b = vectors[u].double(), vectors[v].double()
        if cosine:
            a, b = a / a.norm(), b / b.norm()
        return float((a * b).sum())

    sp = [s(u, v) for u, v in pos.t().tolist()]
    sn = [s(u, v) for u, v in neg.t().tolist()]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in sp for b in sn)
    return wins / (len(sp) * len(sn))


def test_auc_is_one_for_a_perfectly_separating_embedding() -> None:
    y = torch.arange(40) % 4
    vectors = torch.nn.functional.one_hot(y).float() * 50.0  # scores 2,500 inside a block, 0 across
    pos = torch.tensor([(u, v) for u in range(40) for v in range(u + 1, 40) if y[u] == y[v]]).t()
    neg = torch.tensor([(u, v) for u in range(40) for v in range(u + 1, 40) if y[u] != y[v]]).t()
    assert link_auc(vectors, pos, neg) == 1.0
    assert link_auc(vectors, neg, pos) == 0.0
    assert link_auc(vectors, pos, neg, score="cosine") == 1.0


def test_auc_is_about_one_half_for_a_random_embedding() -> None:
    g = _gen(2)
    vectors = torch.randn(500, 16, generator=g)
    pos, neg = torch.randint(0, 500, (2, 3000), generator=g), torch.randint(0, 500, (2, 3000), generator=g)
    for score in ("dot", "cosine"):
        assert abs(link_auc(vectors, pos, neg, score=score) - 0.5) < 0.03


def test_auc_equals_the_brute_force_pairwise_count_with_ties_and_large_scores() -> None:
    g = _gen(4)
    vectors = torch.randint(-3, 4, (12, 3), generator=g).float() * 1000.0  # many ties; sigmoid would saturate
    vectors[vectors.abs().sum(1) == 0] = 1000.0
    pos, neg = torch.randint(0, 12, (2, 25), generator=g), torch.randint(0, 12, (2, 30), generator=g)
    # torchmetrics returns float32: agreement to its precision
    assert link_auc(vectors, pos, neg) == pytest.approx(_brute_auc(vectors, pos, neg), abs=1e-6)
    # cosine on continuous vectors (exact cosine ties of integer vectors may round apart)
    gauss = torch.randn(12, 3, generator=g) * torch.rand(12, 1, generator=g) * 100
    assert link_auc(gauss, pos, neg, score="cosine") == pytest.approx(_brute_auc(gauss, pos, neg, cosine=True), abs=1e-6)
    assert link_auc(gauss, pos, neg) == pytest.approx(_brute_auc(gauss, pos, neg), abs=1e-6)
    assert link_auc(gauss, pos, neg) != pytest.approx(link_auc(gauss, pos, neg, score="cosine"))  # the scores differ
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    scores = [float(vectors[u] @ vectors[v]) for u, v in torch.cat([pos, neg], 1).t().tolist()]
    assert link_auc(vectors, pos, neg) == pytest.approx(sklearn_metrics.roc_auc_score([1] * 25 + [0] * 30, scores), abs=1e-6)


def test_auc_bad_input() -> None:
    vectors, e = torch.randn(4, 2), torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="`score` must be one of"):
        link_auc(vectors, e, e, score="l2")
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        link_auc(vectors, e, torch.empty(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`neg_edges` holds node ids in \[0, 4\]"):
        link_auc(vectors, e, torch.tensor([[0], [4]]))
    with pytest.raises(ValueError, match="not finite"):
        link_auc(torch.full((4, 2), float("nan")), e, e)


# --- cluster_scores --------------------------------------------------------------------------------------------------

def test_nmi_is_one_for_perfectly_clustered_blocks() -> None:
    y = torch.arange(400) % 8
    vectors = torch.nn.functional.one_hot(y).float() + 0.05 * torch.randn(400, 8, generator=_gen(1))
    out = cluster_scores(vectors, y)
    assert out["nmi"] == pytest.approx(1.0, abs=1e-5)
    assert out["mi"] == pytest.approx(math.log(8), abs=1e-5)  # balanced blocks: MI = H(labels) = ln 8 nats


def test_nmi_is_about_zero_for_random_labels() -> None:
    g = _gen(3)
    out = cluster_scores(torch.randn(2000, 8, generator=g), torch.randint(0, 5, (2000,), generator=g))
    assert 0.0 <= out["nmi"] < 0.01 and 0.0 <= out["mi"] < 0.02


def test_mi_and_nmi_equal_a_hand_computation() -> None:
    # two tight directions → clusters {0, 1, 2} and {3, 4, 5}; labels 0, 0, 1 | 1, 1, 1
    vectors = torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, -0.01], [0.0, 1.0], [0.01, 1.0], [-0.01, 1.0]])
    labels = torch.tensor([0, 0, 1, 1, 1, 1])
    mi = (2 / 6) * math.log((2 / 6) / (1 / 2 * 1 / 3)) + (1 / 6) * math.log((1 / 6) / (1 / 2 * 2 / 3)) \
        + (3 / 6) * math.log((3 / 6) / (1 / 2 * 2 / 3))  # = ln(2)/6 + ln(1.5)/2
    h_clusters = math.log(2)
    h_labels = -(1 / 3) * math.log(1 / 3) - (2 / 3) * math.log(2 / 3)
    out = cluster_scores(vectors, labels, num_clusters=2)
    assert out["mi"] == pytest.approx(mi, rel=1e-5)
    assert out["nmi"] == pytest.approx(mi / ((h_clusters + h_labels) / 2), rel=1e-5)


def test_rows_are_l2_normalised_before_kmeans() -> None:
    """Same direction, different lengths: one cluster (raw k-means would split the long vectors off)."""
    vectors = torch.tensor([[1.0, 0.0], [10.0, 0.0], [100.0, 0.0], [0.0, 1.0], [0.0, 10.0], [0.0, 100.0]])
    labels = torch.tensor([7, 7, 7, 3, 3, 3])  # any label values
    out = cluster_scores(vectors, labels)
    assert out["nmi"] == pytest.approx(1.0, abs=1e-6) and out["mi"] == pytest.approx(math.log(2), abs=1e-6)


def test_cluster_scores_are_seeded_and_check_their_input() -> None:
    g = _gen(8)
    vectors, labels = torch.randn(300, 4, generator=g), torch.randint(0, 6, (300,), generator=g)
    assert cluster_scores(vectors, labels, seed=5) == cluster_scores(vectors, labels, seed=5)
    with pytest.raises(ValueError, match=r"`num_clusters` must be an int in \[1, 300\]"):
        cluster_scores(vectors, labels, num_clusters=0)
    with pytest.raises(ValueError, match="same n >= 1 nodes"):
        cluster_scores(vectors, labels[:-1])
    with pytest.raises(ValueError, match="integer \\[n\\] tensor"):
        cluster_scores(vectors, labels.float())
    with pytest.raises(ValueError, match="`restarts` must be an int >= 1"):
        cluster_scores(vectors, labels, restarts=0)
    with pytest.raises(ValueError, match="NaN or inf"):
        cluster_scores(torch.full((300, 4), float("inf")), labels)
