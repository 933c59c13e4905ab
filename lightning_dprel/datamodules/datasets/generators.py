"""Seeded random graphs with community structure, text-attributed or with dense features (offline, no download)."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from lightning_dprel.pretrained import WORDS

__all__ = ["random_text_graph", "random_feature_graph"]


def _random_edges(num_nodes: int, num_edges: int, generator: torch.Generator) -> torch.Tensor:
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    keep = src != dst
    return torch.stack([src[keep], dst[keep]])


def random_text_graph(num_nodes: int = 60, num_edges: int = 150, *, words_per_node: int = 6, seed: int = 0) -> Data:
    """A random text-attributed graph whose linked nodes share words (so a model can learn links).

    Nodes are split into ``num_nodes // 10 + 1`` communities; an edge joins two nodes of one community
    with probability 0.8; each node's text mixes its community's words with random ones, all from
    :data:`lightning_dprel.pretrained.WORDS` (the ``"tiny-bert"`` tokenizer knows every one).
    """
    g = torch.Generator().manual_seed(seed)
    num_comm = num_nodes // 10 + 1
    comm = torch.randint(0, num_comm, (num_nodes,), generator=g)
    texts = []
    for u in range(num_nodes):
        c = int(comm[u])
        own = [WORDS[(3 * c + t) % len(WORDS)] for t in range(3)]
        rand = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (words_per_node - 3,), generator=g)]
        texts.append(" ".join(own + rand))
    src, dst = [], []
    while len(src) < num_edges:
        u = int(torch.randint(0, num_nodes, (1,), generator=g))
        if float(torch.rand(1, generator=g)) < 0.8:
            same = (comm == comm[u]).nonzero().flatten()
            v = int(same[int(torch.randint(0, len(same), (1,), generator=g))])
        else:
            v = int(torch.randint(0, num_nodes, (1,), generator=g))
        if u != v:
            src.append(u)
            dst.append(v)
    return Data(edge_index=torch.tensor([src, dst]), text=texts, num_nodes=num_nodes, community=comm)


def random_feature_graph(num_nodes: int = 60, num_edges: int = 150, *, dim: int = 16, seed: int = 0) -> Data:
    """A random graph with dense features ``x`` drawn around per-community centres."""
    g = torch.Generator().manual_seed(seed)
    num_comm = num_nodes // 10 + 1
    comm = torch.randint(0, num_comm, (num_nodes,), generator=g)
    centres = torch.randn(num_comm, dim, generator=g)
    x = centres[comm] + 0.5 * torch.randn(num_nodes, dim, generator=g)
    ei = _random_edges(num_nodes, 4 * num_edges, g)
    same = comm[ei[0]] == comm[ei[1]]
    ei = torch.cat([ei[:, same], ei[:, ~same][:, : max(1, num_edges // 5)]], dim=1)[:, :num_edges]
    return Data(x=x, edge_index=ei, num_nodes=num_nodes, community=comm)
