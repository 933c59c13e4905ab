"""Public relations beside the private graph: never charged, never mixed into a private batch (issue 24).

A :class:`PublicRelations` holds a second graph whose relations carry no privacy cost (a public ontology, an older
released snapshot). It is prepared like the private graph (same ``transform``, same node inputs, same orientation)
but kept apart: its own node table, its own tuples, its own ordinary seeded sampler (nothing about it is secret).
Training code reads it for public pre-training (:func:`lightning_dprel.methods.relational.public.warm_start`) and for
the public gradient subspace (:class:`lightning_dprel.callbacks.PublicGradientSubspace`); the private stream never
sees it, and the ledger never charges it.

References:
    Yu, Zhang, Chen, Yin, Liu. Do not Let Privacy Overbill Utility: Gradient Embedding Perturbation for Private
    Learning (ICLR 2021), Algorithm 1 (an auxiliary public set for the anchor subspace).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.datamodules.edge_tuples.graph_prep import (
    as_graph, check_int, count_nodes, load_tokenizer, node_inputs, oriented_relations, public_generator,
)
from lightning_dprel.datamodules.edge_tuples.rows import gather_rows
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

__all__ = ["PublicRelations"]


class PublicRelations:
    """A public relational graph: uniform tuple batches for non-private pre-training and gradient-subspace estimates.

    Args:
        source: a :class:`~lightning_dprel.datamodules.datasets.base.GraphSource` (its training graph is used), a PyG
            ``Data`` or ``Dataset``; nodes need ``text`` (or ``x``) like the private graph's.
        name: how ``privacy.json`` names it (default: ``repr(source)``).
        max_relations: keep at most this many relations (a seeded subset); None keeps all.
        seed: seeds the subset and the public batches (public randomness: nothing here needs a secret).

    Attributes (after :meth:`prepare`):
        relations: ``[2, m_pub]`` relations in the data's orientation; ``inputs``: per-node inputs; ``num_nodes``.
    """

    def __init__(self, source: Any, *, name: str | None = None, max_relations: int | None = None, seed: int = 0) -> None:
        if source is None:
            raise ValueError("`public` needs a graph: a GraphSource, a PyG Data or a PyG Dataset.")
        if max_relations is not None:
            check_int("max_relations", max_relations, 1)
        check_int("seed", seed, 0)
        self.source, self.max_relations, self.seed = source, max_relations, seed
        self.name = name if name is not None else repr(source)
        self.relations: Tensor | None = None
        self.inputs: dict[str, Tensor] | None = None
        self.num_nodes = 0

    def prepare(self, *, transform: Any = None, tokenizer: str | None = None, max_length: int = 64, inputs: str = "auto") -> None:
        """Load the graph and cache its node inputs the way the private graph's are (idempotent)."""
        if self.relations is not None:
            return
        data, _, _ = as_graph(self.source, "public")
        if not isinstance(data, Data):
            raise TypeError(f"`public` must give a PyG Data, got {type(data).__name__}.")
        if transform is not None:
            data = transform(data)
        n = count_nodes(data, "public")
        self.inputs = node_inputs(data, n, load_tokenizer(tokenizer), max_length, "public", inputs)
        relations = oriented_relations(data, n, "public")
        if self.max_relations is not None and relations.shape[1] > self.max_relations:
            g = public_generator(self.seed, "public_subset")
            keep = torch.randperm(relations.shape[1], generator=g)[: self.max_relations].sort().values
            relations = relations[:, keep]
        self.relations, self.num_nodes = relations, n

    @property
    def num_relations(self) -> int:
        self._check()
        return int(self.relations.shape[1])

    def _check(self) -> None:
        if self.relations is None:
            raise RuntimeError("PublicRelations is read only after prepare() (the datamodule's setup() calls it).")

    def sample(self, size: int, *, neg_per_pos: int, step: int, directed: bool = True) -> TupleBatch:
        """``size`` public relations drawn uniformly without replacement, each with ``neg_per_pos`` uniform negative
        nodes and anchors (Algorithm 2's tuple shape); batch ``step`` is the same every time it is asked for."""
        self._check()
        check_int("size", size, 1)
        check_int("neg_per_pos", neg_per_pos, 0)
        g = public_generator(self.seed, "public_batch", int(step))
        m = self.relations.shape[1]
        pos = self.relations[:, torch.randperm(m, generator=g)[: min(size, m)]].t().contiguous()
        if not directed:
            pos = pos.sort(dim=1).values
        b = pos.shape[0]
        neg = torch.randint(0, self.num_nodes, (b, neg_per_pos), generator=g)
        anchor = torch.randint(0, 2, (b, neg_per_pos), generator=g)
        node_ids, inverse = torch.unique(torch.cat([pos, neg], dim=1), return_inverse=True)
        return TupleBatch(
            pos=pos, neg=neg, neg_anchor=anchor, max_freq=max_freq(pos, neg), node_ids=node_ids,
            tuple_nodes=inverse.view(b, 2 + neg_per_pos), node_inputs=gather_rows(self.inputs, node_ids),
            expected_batch_size=float(b), global_size=b, step=int(step),
        )

    def describe(self) -> dict[str, Any]:
        """What ``privacy.json`` says of it: this data was public, outside ε."""
        out: dict[str, Any] = {"name": self.name, "charged": False}
        if self.relations is not None:
            out.update(nodes=self.num_nodes, relations=self.num_relations)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
