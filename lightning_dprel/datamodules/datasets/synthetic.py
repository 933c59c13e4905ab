"""Seeded synthetic graphs: graph pairs (text or dense features) for tests, docs and quick runs, and a stochastic block
model for the skip-gram embeddings of AdvSGM (Section VI's link prediction and clustering, on a planted partition)."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_dprel.core.checks import check_choice, check_int
from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource
from lightning_dprel.datamodules.datasets.generators import random_feature_graph, random_text_graph

__all__ = ["SyntheticGraphs", "BlockModelGraph", "SyntheticEntityItems", "block_sizes", "block_model_probs"]

#: Uniforms drawn per chunk of adjacency rows (bounds the memory of the edge draw: 4M floats = 16 MiB).
_CHUNK = 1 << 22


class SyntheticGraphs(GraphSource):
    """A train graph and an independent test graph from :mod:`~lightning_dprel.datamodules.datasets.generators`.

    Args:
        kind: ``"text"`` (node text over a closed vocabulary) or ``"features"`` (dense ``x``).
        num_nodes: nodes per graph.
        num_edges: edges per graph (before cleaning and capping).
        dim: feature dimension for ``kind="features"``.
        seed: the train graph uses ``seed``, the test graph ``seed + 1``.
        with_val: also a validation graph (seed ``seed + 2``), for checkpoint selection.
    """

    def __init__(self, kind: str = "text", num_nodes: int = 60, num_edges: int = 150, dim: int = 16, seed: int = 0, with_val: bool = False) -> None:
        check_choice("kind", kind, ("text", "features"))
        self.kind, self.num_nodes, self.num_edges, self.dim, self.seed = kind, num_nodes, num_edges, dim, seed
        self.with_val = bool(with_val)

    def _one(self, seed: int):
        if self.kind == "text":
            return random_text_graph(self.num_nodes, self.num_edges, seed=seed)
        return random_feature_graph(self.num_nodes, self.num_edges, dim=self.dim, seed=seed)

    def load(self) -> GraphPair:
        val = self._one(self.seed + 2) if self.with_val else None
        return GraphPair(train=self._one(self.seed), test=self._one(self.seed + 1), val=val, name=f"synthetic {self.kind} graphs")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, num_nodes={self.num_nodes}, seed={self.seed})"


def block_sizes(num_nodes: int, num_blocks: int) -> list[int]:
    """Sizes of ``num_blocks`` contiguous blocks of ``num_nodes`` nodes, as equal as possible (the first get the rest)."""
    base, rest = divmod(num_nodes, num_blocks)
    return [base + (1 if b < rest else 0) for b in range(num_blocks)]


def block_model_probs(num_nodes: int, num_blocks: int, mean_degree: float, homophily: float) -> tuple[float, float]:
    """``(p_in, p_out)`` of the planted partition: a node of a mean-size block (s = n/K) expects ``homophily·d`` neighbours
    inside its block and ``(1 − homophily)·d`` outside, so p_in = h·d/(s − 1) and p_out = (1 − h)·d/(n − s)."""
    size = num_nodes / num_blocks
    return homophily * mean_degree / (size - 1), (1.0 - homophily) * mean_degree / (num_nodes - size)


def _check_block_model(num_nodes: int, num_blocks: int, mean_degree: float, homophily: float) -> None:
    for name, value in (("num_nodes", num_nodes), ("num_blocks", num_blocks)):
        check_int(name, value, 1)
    if num_blocks < 2:
        raise ValueError(f"`num_blocks` must be >= 2 (a block model needs an outside), got {num_blocks}.")
    if num_nodes < 2 * num_blocks:
        raise ValueError(f"`num_nodes` must be >= 2·num_blocks = {2 * num_blocks} (two nodes per block), got {num_nodes}.")
    if not (math.isfinite(mean_degree) and mean_degree > 0):
        raise ValueError(f"`mean_degree` must be a finite number > 0, got {mean_degree!r}.")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"`homophily` must be a fraction in [0, 1], got {homophily!r}.")
    p_in, p_out = block_model_probs(num_nodes, num_blocks, mean_degree, homophily)
    if p_in > 1.0 or p_out > 1.0:
        size = num_nodes / num_blocks
        most = min((size - 1) / homophily if homophily > 0 else math.inf, (num_nodes - size) / (1 - homophily) if homophily < 1 else math.inf)
        raise ValueError(
            f"`mean_degree={mean_degree}` is unreachable with {num_nodes} nodes in {num_blocks} blocks at homophily "
            f"{homophily}: it needs p_in = {p_in:.3g}, p_out = {p_out:.3g} (probabilities must be <= 1); at most {most:.4g}."
        )


def _draw_block_model(y: Tensor, probs: Tensor, generator: torch.Generator) -> Tensor:
    """Each pair u < v an edge independently with probability ``probs[y[u], y[v]]`` (the model of PyG's
    ``stochastic_blockmodel_graph``), drawn on ``generator`` in chunks of rows: ``[2, E]`` with u < v, sorted."""
    n = y.numel()
    rows = max(1, _CHUNK // n)
    out = []
    for r0 in range(0, n - 1, rows):
        r1 = min(r0 + rows, n - 1)
        u = torch.arange(r0, r1).view(-1, 1)
        v = torch.arange(r0, n).view(1, -1)  # columns from r0: the pairs with v > u lie in this window
        hit = torch.rand((r1 - r0, n - r0), generator=generator, dtype=torch.float64) < probs[y[r0:r1]][:, y[r0:]]
        hit &= v > u
        src, dst = hit.nonzero(as_tuple=True)
        out.append(torch.stack([src + r0, dst + r0]))
    return torch.cat(out, dim=1) if out else torch.empty(2, 0, dtype=torch.long)


class BlockModelGraph(GraphSource):
    """A stochastic block model (planted partition) for skip-gram node embeddings: link prediction and clustering
    against the blocks (AdvSGM Section VI's tasks on a graph with a known community structure).

    Nodes ``0..n−1`` fall into ``num_blocks`` contiguous blocks of (nearly) equal size; each pair is an edge
    independently with probability p_in inside a block and p_out across (:func:`block_model_probs`), so a node expects
    ``mean_degree`` neighbours, a fraction ``homophily`` of them in its own block. The model is that of
    ``torch_geometric.utils.stochastic_blockmodel_graph``, drawn on a private ``torch.Generator`` seeded by ``seed``
    (that function draws from the global RNG and materialises all n²/2 pairs): the same seed gives the same graph and
    the global RNG is untouched.

    ``load()`` gives ``GraphPair(train=Data(edge_index, num_nodes, y, node_id))``: ``edge_index`` ``[2, E]`` lists each
    undirected edge once (u < v, sorted), ``y`` the block of each node, ``node_id = arange(n)``; no features (``x`` is
    None).

    Args:
        num_nodes: n (>= 2 per block).
        num_blocks: K (>= 2).
        mean_degree: the expected degree d of a node of a mean-size block.
        homophily: the expected fraction of a node's neighbours inside its block, in [0, 1].
        seed: the edge draw's seed.
    """

    def __init__(self, num_nodes: int = 4000, num_blocks: int = 20, mean_degree: float = 20.0, homophily: float = 0.9,
                 seed: int = 0) -> None:
        _check_block_model(num_nodes, num_blocks, float(mean_degree), float(homophily))
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"`seed` must be an int, got {seed!r}.")
        self.num_nodes, self.num_blocks, self.seed = num_nodes, num_blocks, seed
        self.mean_degree, self.homophily = float(mean_degree), float(homophily)

    def load(self) -> GraphPair:
        sizes = block_sizes(self.num_nodes, self.num_blocks)
        y = torch.repeat_interleave(torch.arange(self.num_blocks), torch.tensor(sizes))
        p_in, p_out = block_model_probs(self.num_nodes, self.num_blocks, self.mean_degree, self.homophily)
        probs = torch.full((self.num_blocks, self.num_blocks), p_out, dtype=torch.float64)
        probs.fill_diagonal_(p_in)
        edge_index = _draw_block_model(y, probs, torch.Generator().manual_seed(self.seed))
        data = Data(edge_index=edge_index, num_nodes=self.num_nodes, y=y, node_id=torch.arange(self.num_nodes))
        return GraphPair(train=data, name=repr(self))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_nodes={self.num_nodes}, num_blocks={self.num_blocks}, "
                f"mean_degree={self.mean_degree:g}, homophily={self.homophily:g}, seed={self.seed})")


class SyntheticEntityItems:
    """Seeded private entities linked to public items (``load()`` → ``HeteroData``), for tests and the tiny config.

    Each entity links to ``items_per_entity`` items around one of ``clusters`` item groups; its features are a noisy,
    rotated mix of its items' (so the base model ranks them somewhat and a trained adapter better). Items get a
    chain graph (item j → j // 2) as their public item graph.
    """

    nouns = ("entity", "entities", "relations", "items")

    def __init__(self, num_entities: int = 400, num_items: int = 60, dim: int = 16, items_per_entity: int = 6,
                 clusters: int = 6, seed: int = 0) -> None:
        self.num_entities, self.num_items, self.dim, self.items_per_entity = num_entities, num_items, dim, items_per_entity
        self.clusters, self.seed = clusters, seed

    def load(self):
        from torch_geometric.data import HeteroData

        g = torch.Generator().manual_seed(self.seed)
        ni, ne, d = self.num_items, self.num_entities, self.dim
        item_x = torch.randn(ni, d, generator=g)
        group = torch.randint(self.clusters, (ne,), generator=g)
        members = [torch.nonzero(torch.arange(ni) % self.clusters == c).view(-1) for c in range(self.clusters)]
        pairs = []
        for e in range(ne):
            pool = members[int(group[e])]
            chosen = pool[torch.randperm(pool.numel(), generator=g)[: self.items_per_entity]]
            pairs += [(e, int(j)) for j in chosen]
        edge_index = torch.tensor(pairs).t()
        mix = torch.zeros(ne, d).index_add_(0, edge_index[0], item_x[edge_index[1]])
        rotation = torch.linalg.qr(torch.randn(d, d, generator=g))[0]
        entity_x = 0.5 * mix @ rotation + 0.5 * mix + torch.randn(ne, d, generator=g)
        data = HeteroData()
        data["entity"].ids, data["entity"].x = [f"e{i}" for i in range(ne)], entity_x
        data["item"].ids, data["item"].x = [f"i{j}" for j in range(ni)], item_x
        data["entity", "has", "item"].edge_index = edge_index
        data["item", "is_a", "item"].edge_index = torch.stack([torch.arange(1, ni), torch.arange(1, ni) // 2])
        return data

    def __repr__(self) -> str:
        return f"SyntheticEntityItems(num_entities={self.num_entities}, num_items={self.num_items}, seed={self.seed})"
