"""Query groups: the Q public queries grouped by public clusters, one vote per teacher per group, labels spread by cluster.

**Decision (ours, not the paper's):** the public training nodes are clustered (k-means on their L2-normalised features,
public data only), each query falls in its node's cluster, and teacher i's vote on group g is the class it predicts
most often on g's queries (ties: the lowest class). That vote is a function of teacher i's own predictions, so one
private node still moves at most one teacher's vote per group: the max count by ≤ 1 and the histogram by ≤ √2, the
same sensitivities as one query. An answered group's label then labels every public training node of its cluster, which
is post-processing of the released answer with public data. The point: the student learns from thousands of public
nodes instead of the few answered queries, and each answer averages a teacher's noise over its group.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor
from lightning_dprel.core.checks import check_int

__all__ = ["public_clusters", "group_votes"]


def public_clusters(features: Tensor, k: int, *, seed: int = 0, restarts: int = 10) -> Tensor:
    """Cluster ids [n] of ``features`` [n, d] (public nodes only) by k-means on the unit sphere: SciPy's ``kmeans2``
    (k-means++ start) from ``restarts`` starts, the one with the least within-cluster sum of squares kept."""
    from scipy.cluster.vq import kmeans2

    check_int("k", k, 1, " k is at most the public nodes to cluster.", maximum=features.shape[0])
    x = torch.nn.functional.normalize(features.double(), dim=1).numpy()
    rng, best, best_sse = np.random.default_rng(seed), None, np.inf
    for _ in range(max(1, int(restarts))):  # one start can leave two centres in one cluster
        with warnings.catch_warnings():  # an empty cluster: this start loses on the sum of squares below
            warnings.simplefilter("ignore", UserWarning)
            centre, label = kmeans2(x, k, minit="++", seed=rng)
        sse = float(((x - centre[label]) ** 2).sum())
        if sse < best_sse:
            best, best_sse = label, sse
    return torch.as_tensor(best, dtype=torch.long)


def group_votes(votes: Tensor, group: Tensor, num_groups: int, num_classes: int) -> Tensor:
    """Votes [N, G] from votes [N, Q]: teacher i's vote on group g is its most frequent class on g's queries.

    A group without a query gets −1 (no vote; :func:`~.aggregation.vote_histogram` refuses it, so drop such groups first).
    """
    if votes.dim() != 2 or group.shape != (votes.shape[1],):
        raise ValueError(f"`group` must give one group per query: votes {tuple(votes.shape)}, group {tuple(group.shape)}.")
    if group.numel() and (int(group.min()) < 0 or int(group.max()) >= num_groups):
        raise ValueError(f"`group` holds ids outside [0, {num_groups}).")
    n = votes.shape[0]
    tally = torch.zeros(n, num_groups, num_classes, dtype=torch.long)
    index = (group[None, :] * num_classes + votes.long()).expand(n, -1)
    tally.view(n, -1).scatter_add_(1, index, torch.ones_like(index))
    out = tally.argmax(-1)  # first maximal class on ties
    out[:, tally.sum((0, 2)) == 0] = -1
    return out
