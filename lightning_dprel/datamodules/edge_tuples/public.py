"""Public relations beside the private graph: never charged, never mixed into a private batch (issue 24).

A :class:`PublicRelations` holds a second graph whose relations carry no privacy cost (a public ontology, an older
released snapshot). It is prepared like the private graph (same ``transform``, same node inputs, same orientation)
but kept apart: its own node table, its own tuples, its own ordinary seeded sampler (nothing about it is secret).
Training code reads it for public pre-training (:func:`lightning_dprel.methods.relational.public.warm_start`) and for
the public gradient subspace (:class:`lightning_dprel.callbacks.PublicGradientSubspace`); the private stream never
sees it, and the ledger never charges it. It must be disjoint from the private graph (:func:`shared_with_private`):
a public graph sharing a node or a relation with it is refused.

References:
    Yu, Zhang, Chen, Yin, Liu. Do not Let Privacy Overbill Utility: Gradient Embedding Perturbation for Private
    Learning (ICLR 2021), Algorithm 1 (an auxiliary public set for the anchor subspace).
"""

from __future__ import annotations

from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data

from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.datamodules.edge_tuples.graph_prep import (
    as_graph, check_int, count_nodes, load_tokenizer, node_inputs, oriented_relations, public_generator,
)
from lightning_dprel.datamodules.edge_tuples.rows import gather_rows
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

__all__ = ["PublicRelations", "IDENTITY_KEYS", "shared_with_private"]

#: What names a node across two graphs, in this order: the first attribute both graphs have is compared. Never
#: ``node_id`` or row numbers: each source numbers its nodes its own way (an HPO term's integer may be a WordNet offset).
IDENTITY_KEYS = ("node_names", "text", "x")


def _identities(data: Data, key: str, num_nodes: int) -> list[Any] | None:
    """One hashable identity per node from ``data.<key>`` (a name, a text, the bytes of a feature row), or None."""
    value = getattr(data, key, None)
    if value is None or isinstance(value, str) or len(value) != num_nodes:
        return None
    if key == "x":
        rows = value.detach().cpu().float().reshape(num_nodes, -1).contiguous().numpy()
        return [r.tobytes() for r in rows]
    return [str(v) for v in value]


def shared_with_private(public: Data, relations: Tensor, private: Data) -> tuple[str, int, int] | None:
    """``(key, shared nodes, shared relations)``: the public nodes whose identity (:data:`IDENTITY_KEYS`) is a private
    node's, and the public ``relations`` joining two such nodes that the private graph relates too (either
    orientation); None when the graphs have no identity in common to compare."""
    n_pub, n_priv = count_nodes(public, "public"), count_nodes(private, "source")
    for key in IDENTITY_KEYS:
        pub, priv = _identities(public, key, n_pub), _identities(private, key, n_priv)
        if pub is None or priv is None:
            continue
        private_ids = set(priv)
        nodes = len(set(pub) & private_ids)
        ei = private.edge_index
        private_pairs = {frozenset((priv[u], priv[v])) for u, v in ei.t().tolist() if u != v} if nodes else set()
        shared = sum(frozenset((pub[u], pub[v])) in private_pairs for u, v in relations.t().tolist()) if nodes else 0
        return key, nodes, shared
    return None


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
        self.disjoint_by: str | None = None  # the identity the private graph was compared by

    def prepare(self, *, transform: Any = None, tokenizer: str | None = None, max_length: int = 64, inputs: str = "auto",
                private: Data | None = None) -> None:
        """Load the graph and cache its node inputs the way the private graph's are (idempotent); with ``private`` (the
        private training graph, as transformed), refuse a public graph that shares a node or a relation with it."""
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
        if private is not None:
            self._refuse_private(data, relations, private)
        self.relations, self.num_nodes = relations, n

    def _refuse_private(self, data: Data, relations: Tensor, private: Data) -> None:
        """A ``ValueError`` naming the overlap when this graph shares nodes or relations with the private graph."""
        found = shared_with_private(data, relations, private)
        if found is None:
            rank_zero_warn(f"{self!r}: neither graph names its nodes the way the other does ({', '.join(IDENTITY_KEYS)}), "
                           "so nothing shows that the public graph is disjoint from the private one; make sure it is.",
                           category=UserWarning)
            return
        key, nodes, shared = found
        if nodes:
            raise ValueError(
                f"public data {self.name!r} shares {nodes} node{'s' * (nodes != 1)} (by `{key}`) and {shared} "
                f"relation{'s' * (shared != 1)} with the private graph. Public data is never charged, so it must be "
                "disjoint from the private graph: remove the shared nodes and their relations from the public graph, or "
                "train on them privately (give the graphs distinct `node_names` if equal names/texts/features do not "
                "mean the same node).")
        self.disjoint_by = key

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
        if self.disjoint_by is not None:
            out["disjoint_from_private"] = self.disjoint_by  # no node shared with the private graph, compared by it
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
