"""Each example's own input graph: a node's ``hops``-hop neighbourhood inside the nodes it may see (DP-GPL Sec. 4.3).

**Decision (provable mode):** a private node v is seen through G[V_pub ∪ {v}] only (v, its edges to public nodes, and
the public graph around them), and every query, student or test node through G_pub. So an example is a function of
public data and its own node alone: removing v changes v's example and nothing else, and v reaches exactly one teacher.
The paper-faithful ``full`` view is the whole graph G, where one private node enters other examples' neighbourhoods.
Neighbours are kept up to ``fanout`` per node, ranked by a public hash of their ids (not by row order or data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.datamodules.graph_splits import public_id_uniforms

__all__ = ["EgoBatch", "EgoNets"]


@dataclass
class EgoBatch:
    """A disjoint union of example graphs: ``rows`` [n] (rows of the source's x), local ``edge_index`` [2, E],
    ``center`` [B] (local index of each example's node) and ``example`` [n] (which example a node belongs to)."""

    rows: Tensor
    edge_index: Tensor
    center: Tensor
    example: Tensor

    @property
    def size(self) -> int:
        return int(self.center.numel())

    def select(self, idx: Tensor) -> "EgoBatch":
        """The examples ``idx`` (in that order) as a new disjoint union."""
        idx = torch.as_tensor(idx, dtype=torch.long).view(-1)
        keep = torch.zeros(self.size, dtype=torch.long).index_fill_(0, idx, 1).bool()
        if torch.unique(idx).numel() != idx.numel():
            raise ValueError("EgoBatch.select: repeated example indices.")
        order = torch.full((self.size,), -1, dtype=torch.long)
        order[idx] = torch.arange(idx.numel())
        node_keep = keep[self.example]
        new_ex = order[self.example[node_keep]]
        perm = torch.argsort(new_ex, stable=True)
        old_nodes = node_keep.nonzero().view(-1)[perm]
        local = torch.full((self.rows.numel(),), -1, dtype=torch.long)
        local[old_nodes] = torch.arange(old_nodes.numel())
        e = self.edge_index[:, node_keep[self.edge_index[0]]]
        return EgoBatch(self.rows[old_nodes], local[e], local[self.center[idx]], new_ex[perm])


class EgoNets:
    """Builds :class:`EgoBatch` es of ``centers`` over the graph (``edge_index``, ``num_nodes``, stable ``node_id``).

    Args:
        visible: bool [n], the nodes every example may see besides its own center (G_pub's nodes); None: all (full graph).
        hops: neighbourhood depth (the GNN's number of layers).
        fanout: most neighbours kept per node and hop (public-hash order); None keeps all.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, node_id: Tensor, *, visible: Tensor | None, hops: int = 2,
                 fanout: int | None = 10, seed: int = 0) -> None:
        check_int("hops", hops, 1)
        check_int("fanout", fanout, 1, optional=True)
        self.num_nodes, self.hops, self.fanout = int(num_nodes), int(hops), fanout
        ei = edge_index.cpu().numpy()
        rank = np.argsort(np.argsort(public_id_uniforms(node_id, seed, "ego-fanout").numpy()))
        order = np.lexsort((rank[ei[1]], ei[0]))  # by source, then neighbour's public rank
        self._dst = ei[1][order]
        self._ptr = np.searchsorted(ei[0][order], np.arange(self.num_nodes + 1))
        self.visible = np.ones(self.num_nodes, bool) if visible is None else visible.cpu().numpy().astype(bool)

    def neighbours(self, v: int, allowed) -> np.ndarray:
        nb = self._dst[self._ptr[v]:self._ptr[v + 1]]
        nb = nb[allowed(nb)]
        return nb if self.fanout is None else nb[: self.fanout]

    def nodes_of(self, center: int) -> np.ndarray:
        """The center first, then its neighbourhood among the visible nodes."""
        allowed = lambda nb: self.visible[nb] & (nb != center)  # noqa: E731
        seen, frontier = [np.array([center])], np.array([center])
        for _ in range(self.hops):
            nxt = [self.neighbours(int(u), allowed) for u in frontier]
            frontier = np.setdiff1d(np.concatenate(nxt) if nxt else np.empty(0, int), np.concatenate(seen))
            seen.append(frontier)
        return np.concatenate(seen)

    def batch(self, centers: Tensor) -> EgoBatch:
        """The disjoint union of every center's example graph (edges: those of G among its nodes, both directions)."""
        rows, edges, center, example, offset = [], [], [], [], 0
        for b, c in enumerate(torch.as_tensor(centers).view(-1).tolist()):
            nodes = self.nodes_of(int(c))
            deg = self._ptr[nodes + 1] - self._ptr[nodes]
            src = np.repeat(np.arange(nodes.size), deg)
            dst = np.concatenate([self._dst[self._ptr[v]:self._ptr[v + 1]] for v in nodes])
            inside = np.isin(dst, nodes)
            sorter = np.argsort(nodes)
            edges.append(np.stack([src[inside], sorter[np.searchsorted(nodes, dst[inside], sorter=sorter)]]) + offset)
            rows.append(nodes)
            center.append(offset)
            example.append(np.full(nodes.size, b))
            offset += nodes.size
        cat = lambda xs: torch.from_numpy(np.concatenate(xs)).long() if xs else torch.empty(0, dtype=torch.long)  # noqa: E731
        ei = torch.from_numpy(np.concatenate(edges, axis=1)).long() if edges else torch.empty(2, 0, dtype=torch.long)
        return EgoBatch(cat(rows), ei, torch.tensor(center, dtype=torch.long), cat(example))
