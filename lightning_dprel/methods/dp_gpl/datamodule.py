"""DP-GPL's data: public and private halves of one labelled graph, the keyed teacher partition and public queries.

Privacy unit: one labelled private node with its features, label and edges (add/remove; ``labelled_node``). Nodes are
public or private by a public hash of their stable ids (``public_fraction``). **Decision:** private node v goes to
teacher ⌊N·u(id_v)⌋, u a secret keyed PRF of its id (:func:`~lightning_dprel.datamodules.graph_splits.keyed_split`), so
removing v moves no other node; v is seen through G[V_pub ∪ {v}] only (``view="public"``, :mod:`.egonets`), so it
reaches exactly one teacher and no query. ``view="full"`` (paper-faithful) runs every example on the whole graph G.
Queries (Q public training nodes, by a public hash), the student, validation and test run on G_pub. With
``query_groups`` = k the queries are grouped by public clusters (:mod:`.query_groups`): the teachers vote once per group
and an answered group labels every public training node of its cluster for the student.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_dprel.core.checks import check_choice, check_int, check_probability
from lightning_dprel.core.datamodule import PrivateDataModule
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.methods.dp_gpl.accounting import LABELLED_NODE
from lightning_dprel.datamodules.datasets.nodes import NodeSource, stable_node_ids
from lightning_dprel.datamodules.graph_splits import keyed_split, public_id_uniforms
from lightning_dprel.methods.dp_gpl.egonets import EgoBatch, EgoNets
from lightning_dprel.methods.dp_gpl.query_groups import public_clusters

__all__ = ["PromptDataModule", "VIEWS"]

VIEWS = ("public", "full")


def _one(batch: Any) -> DataLoader:
    return DataLoader([batch], batch_size=None, collate_fn=lambda b: b)


class PromptDataModule(PrivateDataModule):
    """Public/private halves, teacher groups, queries and the student's answered set of a :class:`NodeSource`.

    Args:
        source: a labelled graph with stable ``node_id`` (e.g. ``WordNetNodes``, ``SyntheticNodes``).
        num_teachers: N, disjoint groups of private nodes.
        num_queries: Q public query nodes (from the source's public training nodes).
        public_fraction: share of nodes that are public (by a public hash of their ids).
        view: ``"public"`` (provable) or ``"full"`` (paper-faithful; a private node reaches many teachers and queries).
        hops, fanout: each example's neighbourhood (the GNN's layers; neighbours kept per node, public-hash order).
        query_groups: None (the paper: one vote per query, the student learns on the answered queries) or k: the
            public training nodes are clustered into k groups (k-means on their features, public data only); teachers
            vote once per group that holds a query, and an answered group labels all public training nodes of its
            cluster.
        seed: the public halves, queries, clusters and fanout order.
        partition_seed: None (default): the teacher partition is keyed by a secret stream; an int makes it
            reproducible (tests and experiments; the guarantee assumes the partition is secret).
    """

    privacy_unit = LABELLED_NODE

    def __init__(self, source: NodeSource, *, num_teachers: int = 250, num_queries: int = 200, public_fraction: float = 0.5,
                 view: str = "public", hops: int = 2, fanout: int | None = 10, query_groups: int | None = None,
                 seed: int = 0, partition_seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(source, NodeSource):
            raise TypeError(f"`source` must be a NodeSource, got {type(source).__name__}.")
        check_choice("view", view, VIEWS)
        check_int("num_teachers", num_teachers, 1)
        check_int("num_queries", num_queries, 1)
        check_int("query_groups", query_groups, 1, optional=True)
        check_probability("public_fraction", public_fraction)
        self.source, self.num_teachers, self.num_queries = source, num_teachers, num_queries
        self.public_fraction, self.view, self.hops, self.fanout, self.seed = public_fraction, view, hops, fanout, seed
        self.query_groups = query_groups
        self.partition = KeyedStream("dp-gpl/partition", seed=partition_seed, _warn=partition_seed is not None)
        self.data = None
        self.student_batch: EgoBatch | None = None
        self._batches: dict[str, EgoBatch] = {}
        self.student_labels: torch.Tensor | None = None

    # --- the splits ------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        data = self.source.load()
        ids = stable_node_ids(data, repr(self.source), allow_rows=False)
        self.public = public_id_uniforms(ids, self.seed, "dp-gpl/public") < self.public_fraction
        self.private = ~self.public
        self.teacher = keyed_split(self.private, self.num_teachers, self.partition, node_ids=ids)
        pool = (self.public & data.train_mask).nonzero().view(-1)
        rank = public_id_uniforms(ids[pool], self.seed, "dp-gpl/queries").argsort()
        if pool.numel() < self.num_queries:
            raise ValueError(f"Only {pool.numel()} public training nodes for {self.num_queries} queries.")
        self.queries = pool[rank[: self.num_queries]]
        if self.query_groups is not None:
            if self.query_groups > pool.numel():
                raise ValueError(f"`query_groups` = {self.query_groups} exceeds the {pool.numel()} public training nodes.")
            cluster = torch.full((data.num_nodes,), -1, dtype=torch.long)
            cluster[pool] = public_clusters(data.x[pool], self.query_groups, seed=self.seed)
            self.groups, self.query_group = torch.unique(cluster[self.queries], return_inverse=True)  # groups with a query
            self.pool, self.cluster = pool, cluster
        nets = dict(hops=self.hops, fanout=self.fanout, seed=self.seed)
        self.public_nets = EgoNets(data.edge_index, data.num_nodes, ids, visible=self.public, **nets)
        self.teacher_nets = self.public_nets if self.view == "public" else EgoNets(data.edge_index, data.num_nodes, ids, visible=None, **nets)
        self.data = data

    @property
    def num_private_units(self) -> int:
        """n: the private labelled nodes (the units a δ is measured against)."""
        return int(self.private.sum())

    @property
    def num_classes(self) -> int:
        return int(self.data.num_classes)

    @property
    def num_vote_queries(self) -> int:
        """What the teachers vote on and the ledger charges: the Q queries, or the groups holding one."""
        return self.num_queries if self.query_groups is None else int(self.groups.numel())

    @property
    def num_features(self) -> int:
        return int(self.data.x.shape[1])

    def public_graph(self) -> tuple[torch.Tensor, torch.Tensor]:
        """G_pub: (x of every node, edges among public nodes) — private rows are never read by pre-training."""
        ei = self.data.edge_index
        keep = self.public[ei[0]] & self.public[ei[1]]
        idx = self.public.nonzero().view(-1)
        local = torch.full((self.data.num_nodes,), -1, dtype=torch.long)
        local[idx] = torch.arange(idx.numel())
        return self.data.x[idx], local[ei[:, keep]]

    def _batch(self, key: str, nets: EgoNets, nodes: torch.Tensor) -> EgoBatch:
        """``nets.batch(nodes)``, built once per key (the splits are fixed after setup; batches are never modified)."""
        if key not in self._batches:
            self._batches[key] = nets.batch(nodes)
        return self._batches[key]

    def teacher_examples(self) -> tuple[EgoBatch, torch.Tensor, torch.Tensor]:
        """(examples of every private node, their labels, their teacher), private nodes in id order."""
        nodes = self.private.nonzero().view(-1)
        return self._batch("teachers", self.teacher_nets, nodes), self.data.y[nodes], self.teacher[nodes]

    def query_examples(self, view: str | None = None) -> EgoBatch:
        """The Q queries on G_pub, the teachers' view by default (``view="full"``: on G, as published); built once per view."""
        view = view or self.view
        return self._batch(f"queries/{view}", self.public_nets if view == "public" else self.teacher_nets, self.queries)

    def public_examples(self, mask_name: str) -> tuple[EgoBatch, torch.Tensor]:
        nodes = (self.public & getattr(self.data, mask_name)).nonzero().view(-1)
        return self._batch(f"public/{mask_name}", self.public_nets, nodes), self.data.y[nodes]

    # --- the student's data (answered queries, set once the votes are released) ------------------------
    def set_answers(self, answered: torch.Tensor, labels: torch.Tensor) -> None:
        """The student's examples (on G_pub whatever the teachers' view): the answered queries, or with ``query_groups``
        every public training node whose cluster's group was answered, with that group's label."""
        if self.query_groups is None:
            idx = answered.nonzero().view(-1)
            self.student_batch, self.student_labels = self.query_examples("public").select(idx), labels[idx]
            return
        label_of = torch.full((self.query_groups,), -1, dtype=torch.long)
        label_of[self.groups[answered]] = labels[answered]
        nodes = self.pool[label_of[self.cluster[self.pool]] >= 0]
        self.student_batch, self.student_labels = self.public_nets.batch(nodes), label_of[self.cluster[nodes]]

    def train_dataloader(self) -> DataLoader:
        if self.student_batch is None:
            raise RuntimeError("No answered queries yet: DPGPLModule answers them at the start of fit.")
        return _one((self.student_batch, self.student_labels))

    def val_dataloader(self) -> DataLoader:
        return _one(self.public_examples("val_mask"))

    def test_dataloader(self) -> DataLoader:
        return _one(self.public_examples("test_mask"))
