"""Utility of released node embeddings, as AdvSGM Section VI measures it: link prediction (ROC AUC of v_u·v_v on held-out
edges against as many random non-edges) and node clustering (k-means on the embeddings, mutual information with labels).

Evaluation is outside the privacy guarantee: the non-edges come from a PUBLIC seeded generator, and the held-out edges
and labels are read in the clear. Nothing here touches the training data's randomness.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.cluster.vq import kmeans2
from torch import Tensor
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.functional.clustering import mutual_info_score, normalized_mutual_info_score

from lightning_dprel.core.checks import check_choice, check_int

__all__ = ["sample_non_edges", "link_auc", "cluster_scores", "SCORES"]

#: Edge scores s(u, v) of :func:`link_auc`: the paper's inner product, or the cosine of the two vectors.
SCORES = ("dot", "cosine")
#: Up to this many unordered pairs, :func:`sample_non_edges` enumerates the non-edges (exact, any density).
_ENUMERATE_PAIRS = 1 << 22
#: Rejection rounds before :func:`sample_non_edges` gives up (each round draws about twice what is still missing).
_MAX_ROUNDS = 10_000
#: Lloyd iterations of each k-means run.
_KMEANS_ITER = 50


def _check_edges(edge_index: Any, num_nodes: int, name: str) -> Tensor:
    """``edge_index`` checked: an integer ``[2, E]`` tensor of ids in ``[0, num_nodes)``; returned as long."""
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(edge_index).__name__}.")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"`{name}` must have shape [2, E], got {tuple(edge_index.shape)}.")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer node ids, got dtype {edge_index.dtype}.")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(
            f"`{name}` holds node ids in [{int(edge_index.min())}, {int(edge_index.max())}], outside [0, {num_nodes})."
        )
    return edge_index.long().cpu()


def _pair_keys(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Sorted distinct keys min·n + max of the unordered pairs u ≠ v in ``edge_index`` (either direction, self-loops dropped)."""
    u, v = torch.minimum(edge_index[0], edge_index[1]), torch.maximum(edge_index[0], edge_index[1])
    return torch.unique(u[u != v] * num_nodes + v[u != v])


def _first_unique(keys: Tensor) -> Tensor:
    """The distinct values of ``keys`` in order of first occurrence (a sequential draw without replacement)."""
    uniq, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((uniq.numel(),), keys.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(keys.numel()), reduce="amin")
    return uniq[torch.argsort(first)]


def _enumerated_non_edges(edge_keys: Tensor, num_nodes: int, count: int, generator: torch.Generator) -> Tensor:
    """``count`` keys drawn uniformly without replacement from the enumerated non-edges (small graphs)."""
    u, v = torch.triu_indices(num_nodes, num_nodes, offset=1)
    keys = u * num_nodes + v
    keys = keys[~torch.isin(keys, edge_keys)]
    return keys[torch.randperm(keys.numel(), generator=generator)[:count]]


def _rejected_non_edges(edge_keys: Tensor, num_nodes: int, count: int, free: int, generator: torch.Generator) -> Tensor:
    """``count`` keys by rejection: uniform ordered pairs, u ≠ v, not an edge, first occurrences kept (large graphs)."""
    total = num_nodes * (num_nodes - 1) // 2
    keys = torch.empty(0, dtype=torch.long)
    for _ in range(_MAX_ROUNDS):
        missing = count - keys.numel()
        if missing <= 0:
            return keys[:count]
        draw = int(min(1 << 24, 2 * missing * total / free + 1024))
        u = torch.randint(0, num_nodes, (draw,), generator=generator)
        v = torch.randint(0, num_nodes, (draw,), generator=generator)
        cand = torch.minimum(u, v) * num_nodes + torch.maximum(u, v)
        cand = cand[(u != v) & ~torch.isin(cand, edge_keys)]
        keys = _first_unique(torch.cat([keys, cand]))
    raise RuntimeError(f"sample_non_edges: {count} distinct non-edges not found in {_MAX_ROUNDS} rounds of rejection.")


def sample_non_edges(edge_index: Tensor, num_nodes: int, count: int, *, generator: torch.Generator) -> Tensor:
    """``count`` distinct random non-edges for link prediction (AdvSGM Section VI: "as many random non-edges").

    Each is an unordered pair u ≠ v that is not an edge of ``edge_index`` in either direction; the sample is uniform
    without replacement over all such pairs, drawn on ``generator`` (PUBLIC: evaluation is outside the guarantee).

    Args:
        edge_index: ``[2, E]`` integer node ids (directed or undirected; self-loops and repeats ignored).
        num_nodes: n; ids lie in ``[0, n)``.
        count: how many non-edges (>= 0).
        generator: a seeded ``torch.Generator``.

    Returns:
        ``[2, count]`` long tensor, each column (u, v) with u < v, in draw order.

    Raises:
        ValueError: bad shapes or ids, or ``count`` above the number of non-edges.
    """
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a seeded torch.Generator, got {type(generator).__name__}.")
    num_nodes, count = check_int("num_nodes", num_nodes, 0), check_int("count", count, 0)
    edge_keys = _pair_keys(_check_edges(edge_index, num_nodes, "edge_index"), num_nodes)
    total = num_nodes * (num_nodes - 1) // 2
    free = total - edge_keys.numel()
    if count > free:
        raise ValueError(
            f"Cannot draw {count} distinct non-edges: a graph of {num_nodes} nodes and {edge_keys.numel()} distinct "
            f"edges has only {free} unordered non-adjacent pairs."
        )
    if count == 0:
        return torch.empty(2, 0, dtype=torch.long)
    if total <= _ENUMERATE_PAIRS:
        keys = _enumerated_non_edges(edge_keys, num_nodes, count, generator)
    else:
        keys = _rejected_non_edges(edge_keys, num_nodes, count, free, generator)
    return torch.stack([keys // num_nodes, keys % num_nodes])


def _edge_scores(vectors: Tensor, edges: Tensor, score: str) -> Tensor:
    """s(u, v) for each column: v_u·v_v (``"dot"``, the paper's) or the cosine of v_u and v_v (``"cosine"``)."""
    if score == "cosine":
        vectors = F.normalize(vectors, dim=1)
    return (vectors[edges[0]] * vectors[edges[1]]).sum(dim=1)


def link_auc(node_vectors: Tensor, pos_edges: Tensor, neg_edges: Tensor, *, score: str = "dot") -> float:
    """Link-prediction ROC AUC of s(u, v) for held-out edges against non-edges (AdvSGM Section VI, Table V's AUC).

    The AUC is P(s(pos) > s(neg)) + ½·P(s(pos) = s(neg)) over all (positive, negative) pairs, computed by torchmetrics'
    ``binary_auroc`` on the scores' dense ranks scaled to [0, 1] in float64 (``binary_auroc`` would squash raw scores
    outside [0, 1] with a sigmoid, which ties large scores in float32).

    Args:
        node_vectors: ``[n, d]`` embeddings (rows indexed by node).
        pos_edges: ``[2, P]`` held-out edges (P >= 1).
        neg_edges: ``[2, N]`` non-edges (N >= 1), e.g. from :func:`sample_non_edges`.
        score: ``"dot"`` (v_u·v_v, the paper's) or ``"cosine"``.

    Returns:
        The AUC, a float in [0, 1].
    """
    check_choice("score", score, SCORES)
    if not isinstance(node_vectors, Tensor) or node_vectors.dim() != 2 or not node_vectors.dtype.is_floating_point:
        raise ValueError(f"`node_vectors` must be a floating [n, d] tensor, got {getattr(node_vectors, 'shape', type(node_vectors))}.")
    n = node_vectors.shape[0]
    pos, neg = _check_edges(pos_edges, n, "pos_edges"), _check_edges(neg_edges, n, "neg_edges")
    if pos.shape[1] == 0 or neg.shape[1] == 0:
        raise ValueError(f"link_auc needs at least one positive and one negative pair, got {pos.shape[1]} and {neg.shape[1]}.")
    vectors = node_vectors.detach().cpu().double()
    scores = torch.cat([_edge_scores(vectors, pos, score), _edge_scores(vectors, neg, score)])
    if not torch.isfinite(scores).all():
        raise ValueError("link_auc: some edge scores are not finite (NaN or inf in `node_vectors`?).")
    uniq, rank = torch.unique(scores, return_inverse=True)  # dense ranks: ties stay ties, order is kept
    preds = rank.double() / max(1, uniq.numel() - 1)
    target = torch.cat([torch.ones(pos.shape[1], dtype=torch.long), torch.zeros(neg.shape[1], dtype=torch.long)])
    return float(binary_auroc(preds, target))


def _kmeans_labels(points: np.ndarray, k: int, seed: int, restarts: int) -> np.ndarray:
    """k-means++ cluster index of each row: the best (least within-cluster squared distance) of ``restarts`` runs of
    SciPy's ``kmeans2``, all drawn from one generator seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    best, best_cost = None, np.inf
    for _ in range(restarts):
        centroids, assignment = kmeans2(points, k, iter=_KMEANS_ITER, minit="++", seed=rng)
        cost = float(((points - centroids[assignment]) ** 2).sum())
        if cost < best_cost:
            best, best_cost = assignment, cost
    return best


def cluster_scores(vectors: Tensor, labels: Tensor, *, num_clusters: int | None = None, seed: int = 0,
                   restarts: int = 10) -> dict[str, float]:
    """Node clustering quality: k-means clusters of the embeddings against labels (AdvSGM Section VI, Table V's MI).

    Rows of ``vectors`` are L2-normalised before k-means (clusters by direction, the geometry the inner-product score
    sees; a zero row stays zero). The paper clusters with Affinity Propagation; k-means (k-means++ seeding, the best
    of ``restarts`` runs) with k = the number of labels is the scalable stand-in. Scores by torchmetrics: ``mi``, the
    mutual information in nats (natural log, as sklearn's ``mutual_info_score``), and ``nmi``, normalised by the
    arithmetic mean of the two entropies.

    Args:
        vectors: ``[n, d]`` embeddings.
        labels: ``[n]`` integer labels (any values).
        num_clusters: k (default: the number of distinct labels), in [1, n].
        seed: k-means++'s seed.
        restarts: k-means runs; the one with the least within-cluster squared distance is scored (>= 1).

    Returns:
        ``{"nmi": float, "mi": float}``.
    """
    if not isinstance(vectors, Tensor) or vectors.dim() != 2 or not vectors.dtype.is_floating_point:
        raise ValueError(f"`vectors` must be a floating [n, d] tensor, got {getattr(vectors, 'shape', type(vectors))}.")
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"`labels` must be an integer [n] tensor, got {getattr(labels, 'shape', type(labels))}.")
    n = vectors.shape[0]
    if labels.numel() != n or n == 0:
        raise ValueError(f"`vectors` and `labels` must describe the same n >= 1 nodes, got {n} and {labels.numel()}.")
    points = F.normalize(vectors.detach().cpu().double(), dim=1)
    if not torch.isfinite(points).all():
        raise ValueError("cluster_scores: `vectors` holds NaN or inf.")
    labels = labels.detach().cpu().long()
    k = int(torch.unique(labels).numel()) if num_clusters is None else num_clusters
    k, restarts = check_int("num_clusters", k, 1, maximum=n), check_int("restarts", restarts, 1)
    clusters = torch.from_numpy(_kmeans_labels(points.numpy(), k, int(seed), restarts)).long()
    with torch.sparse.check_sparse_tensor_invariants(enable=True):  # torchmetrics' sparse contingency table, checked
        mi = float(mutual_info_score(clusters, labels))
        nmi = float(normalized_mutual_info_score(clusters, labels))
    return {"nmi": nmi, "mi": mi}
