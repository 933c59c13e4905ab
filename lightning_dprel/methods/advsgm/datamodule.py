"""Edge tuples for private skip-gram: node ids as inputs, the unit and sampling of each AdvSGM mode.

Provable mode (:class:`SkipGramDataModule`): the coupled edge-tuple sampling of the relational method, reused as is —
K-capped edges, Poisson positives at γ = b/m, NEG-SAMPLE-WOR negatives from the whole id universe — with the unit
``node_public_ids`` (the ids are public: a removed node keeps its rows, only its ≤ K positive tuples differ) or, in
:class:`PrivateIdsSkipGramDataModule`, ``entity`` (the node set itself is private; use the ``standard`` accounting).
Edge level (:class:`EdgeSkipGramDataModule`, unit ``edge``): the same stream over the *uncapped* relations, so one
relation is one tuple (``skipgram_edge`` accounting).
Paper-faithful mode (:class:`AdvSGMPaperDataModule`, unit ``node_replace``): the published batches (Algorithm 3): B
edges without replacement, a random orientation, B·k negatives uniform on V hung on the start nodes, no degree cap; no
bound holds for them. Each class declares its unit once, in ``privacy_unit``; its SamplingSpec reads it there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset

from lightning_dprel.core.checks import check_bool
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY, edge_tuples
from lightning_dprel.datamodules.datasets.base import GraphSource
from lightning_dprel.datamodules.edge_tuples.coupled_stream import CoupledStream
from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule, derive_seed
from lightning_dprel.datamodules.edge_tuples.graph_prep import NO_DEGREE_CAP
from lightning_dprel.datamodules.edge_tuples.sampling import sample_without_replacement
from lightning_dprel.methods.advsgm.accounting import EDGE, NODE_PUBLIC_IDS, NODE_REPLACE, advsgm_paper_sampling
from lightning_dprel.methods.advsgm.evaluation import sample_non_edges

__all__ = ["SkipGramDataModule", "PrivateIdsSkipGramDataModule", "EdgeSkipGramDataModule", "AdvSGMPaperDataModule", "PaperStream"]


class SkipGramDataModule(RelationalDataModule):
    """:class:`RelationalDataModule` for id embeddings (inputs ``node_id``), unit ``node_public_ids`` (ids public; use the
    ``skipgram_public_ids`` accounting). When the node set itself is private, use :class:`PrivateIdsSkipGramDataModule`.

    Args:
        source: the graph (a GraphSource, PyG ``Data`` or ``Dataset``); no features needed.
        eval_candidates: random candidates per held-out edge for the validation/test AUC (default 1: as many
            random pairs as held-out edges).
        **kwargs: the options of :class:`RelationalDataModule` (``max_degree`` K, ``expected_batch_size`` b,
            ``neg_per_pos`` k, ``test_fraction``, ``seed``, ``sampling_seed``, …).
    """

    privacy_unit = NODE_PUBLIC_IDS.name
    node_inputs = "ids"

    def __init__(self, source: GraphSource | Data | PyGDataset | None = None, *, eval_candidates: int | None = 1, **kwargs: Any) -> None:
        if kwargs.get("transform") is not None:
            raise ValueError(
                f"{type(self).__name__} takes no `transform`: the inputs are node ids, and a transform that rewrites the "
                "edges (two-hop, largest component, …) would let one relation or node change many tuples."
            )
        super().__init__(source, eval_candidates=eval_candidates, **kwargs)

    @property
    def num_nodes(self) -> int:
        """n, the id universe (after :meth:`setup`)."""
        return int(self.train_inputs["node_id"].numel())


class PrivateIdsSkipGramDataModule(SkipGramDataModule):
    """:class:`SkipGramDataModule` whose node set is private: unit ``entity`` (use the ``standard`` accounting)."""

    privacy_unit = ENTITY.name


class EdgeSkipGramDataModule(SkipGramDataModule):
    """:class:`SkipGramDataModule` at the edge level: unit ``edge`` (one relation added or removed; node ids public).

    Nothing is capped, so removing one relation from your graph removes exactly its own tuple from the training
    relations (the held-out split hashes each relation alone): the guarantee holds for the raw graph. Use the
    ``skipgram_edge`` accounting (Δ = C, the per-example Poisson sampled Gaussian). It protects whether one relation
    exists, not a node: a node's degree and its neighbourhood as a whole are not protected.

    Args:
        source, eval_candidates, **kwargs: as :class:`SkipGramDataModule`, without ``max_degree`` and ``capping``.
    """

    privacy_unit = EDGE.name

    def __init__(self, source: GraphSource | Data | PyGDataset | None = None, **kwargs: Any) -> None:
        for name in ("max_degree", "capping"):
            if name in kwargs:
                raise ValueError(
                    f"EdgeSkipGramDataModule caps no degree (`{name}` is not an option): a cap that keeps edges by "
                    "their neighbours would let one relation change others. Use SkipGramDataModule for node level."
                )
        super().__init__(source, max_degree=NO_DEGREE_CAP, capping="assert", **kwargs)

    def setup(self, stage: str | None = None) -> None:
        """As :meth:`SkipGramDataModule.setup`, refusing a cap set after construction (a subclass or attribute)."""
        if self.max_degree < NO_DEGREE_CAP:
            raise ValueError(f"EdgeSkipGramDataModule caps no degree, but max_degree = {self.max_degree}; leave it unset.")
        super().setup(stage)


class PaperStream(CoupledStream):
    """Algorithm 3's batches: B training edges without replacement, random orientation, B·k uniform negatives on V
    (with replacement, as the code draws them) hung on each positive's start node (``neg_anchor`` ≡ 0)."""

    def draw_global(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        spec, tuples = self.spec, edge_tuples(self.spec)
        b, k = int(round(spec.expected_batch_size)), tuples.neg_per_pos
        positives = self.randomness.child(step, "positives")
        idx = sample_without_replacement(spec.population, b, generator=positives)
        pos = self.edges.index_select(1, idx).t().contiguous()
        flip = self.randomness.child(step, "orientation").uniform(b) < 0.5
        pos = torch.where(flip[:, None], pos.flip(1), pos)
        neg = self.randomness.child(step, "negatives").randint(tuples.num_nodes, b * k).view(b, k)
        return pos, neg, torch.zeros(b, k, dtype=torch.long)


class AdvSGMPaperDataModule(SkipGramDataModule):
    """The paper-faithful batches (fixed size B, no degree cap, ``n_D`` = 15 iterations per epoch); unit ``node_replace``.

    Its sampling spec is :func:`~lightning_dprel.methods.advsgm.accounting.advsgm_paper_sampling` (what Theorem 7
    charges); the training it feeds has provable ε = ∞ (``docs/advsgm.md``).

    Args:
        batch_size, neg_per_pos, steps_per_epoch: B, k and n_D.
        inject_non_edges: the authors' code also adds its training non-edges to the training graph as edges: as many
            random non-edges (seeded by ``seed``; drawn outside the training and test edges, so they read E) as
            training edges.
    """

    privacy_unit = NODE_REPLACE.name

    def __init__(self, source: GraphSource | Data | PyGDataset | None = None, *, batch_size: int = 128, neg_per_pos: int = 5,
                 steps_per_epoch: int = 15, inject_non_edges: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("max_degree", NO_DEGREE_CAP)  # no cap: the paper bounds no degree
        kwargs.setdefault("max_overflow_probability", 1.0 - 1e-12)  # negatives with replacement: no |E+|·k ≤ n bound
        super().__init__(source, expected_batch_size=float(batch_size), neg_per_pos=neg_per_pos, steps_per_epoch=steps_per_epoch, **kwargs)
        check_bool("inject_non_edges", inject_non_edges)
        self.batch_size, self.inject_non_edges = int(batch_size), inject_non_edges

    def setup(self, stage: str | None = None) -> None:
        fresh = self.stream is None
        super().setup(stage)
        if fresh:
            old = self.stream
            if self.inject_non_edges:
                self._inject_non_edges()
            self.stream = PaperStream(self.train_edges, old.inputs, self._spec, old.randomness)
            self.stream._pending, self.stream.epoch, self.stream.index = old._pending, old.epoch, old.index

    def _inject_non_edges(self) -> None:
        """The code's non-edge injection: the training graph gets as many public random non-edges as it has edges."""
        n, m = self.num_nodes, int(self.train_edges.shape[1])
        known = self.train_edges
        if self.held_out_test:  # the test relations share the ids: never inject one of them
            known = torch.cat([known, torch.stack([self.eval_query, self.eval_target])], dim=1)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "non_edges"))
        self.train_edges = torch.cat([self.train_edges, sample_non_edges(known, n, m, generator=generator)], dim=1)
        rate = self._spec.expected_batch_size / (2 * m)
        self._spec = replace(self._spec, population=2 * m, sampling_rate=rate)

    @property
    def sampling_spec(self) -> SamplingSpec:
        spec = RelationalDataModule.sampling_spec.fget(self)
        tuples = edge_tuples(spec)
        return advsgm_paper_sampling(num_nodes=tuples.num_nodes, num_edges=spec.population,
                                     batch_size=self.batch_size, k=tuples.neg_per_pos,
                                     privacy_unit=self.privacy_unit)
