"""Coupled edge tuples as PyG link-prediction batches, for a user's own link predictor (entity-level DP-SGD).

:class:`LinkPredictionDataModule` is a :class:`~.datamodule.RelationalDataModule` (same options, same sampling: Poisson
positives over degree-capped relations, NEG-SAMPLE-WOR negatives, Algorithms 2-3) whose batches have the fields PyG's
link-prediction examples train on: ``x``, ``n_id``, ``edge_label_index``, ``edge_label``. Every tuple keeps its own
2 + k node rows (a node in two tuples is two rows), so the loss of the whole batch is the mean of the tuples' own losses
and one tuple's gradient never reads another's data; the stacked ``tuple_*`` fields are what
:class:`~lightning_dprel.core.example_views.LinkTuples` hands to the user's ``training_step`` one tuple at a time.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy Guarantees,
    Algorithms 2-3 (coupled sampling) and Theorem C.1 (standard per-tuple clipping).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data

from lightning_dprel.core.example_views import LinkTuples
from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.datamodules.edge_tuples.coupled_stream import StatefulLoader, TupleStream
from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.evaluation import EvalSet, sample_eval_candidates
from lightning_dprel.datamodules.edge_tuples.graph_prep import public_generator
from lightning_dprel.datamodules.edge_tuples.rows import one_thread, slice_rows

__all__ = ["LinkPredictionDataModule", "LinkBatch", "link_batch", "eval_link_batch", "NO_EDGE_INDEX"]

_TEXT_REFUSED = (
    "LinkPredictionDataModule feeds dense node features (`data.x`) to your link predictor; {what}. Embed the texts "
    "into `x` first (transform=lightning_dprel.transforms.EmbedText(...)), or train a text encoder with "
    "RelationalDataModule and lightning_dprel's relational model."
)


#: Why a link batch has no ``edge_index``, and what to score instead (raised by :attr:`LinkBatch.edge_index`).
NO_EDGE_INDEX = (
    "A LinkPredictionDataModule batch has no `edge_index`. Its fields are `x`, `n_id`, `edge_label_index` and "
    "`edge_label`, and the privacy callback runs your training_step on each coupled tuple alone: `edge_label_index` "
    "holds the sampled positive relations (label 1 in `edge_label`) and, for each, the k negatives the library's "
    "sampler drew (label 0). Those negatives are part of the private mechanism (charged by the accountant) and are "
    "already in the batch. Message passing over the training graph would read other entities' relations, and negatives "
    "drawn in your step (torch_geometric.utils.negative_sampling) are not the sampler's. Score `edge_label_index` "
    "against `edge_label` instead, e.g. F.binary_cross_entropy_with_logits(model(batch.x, batch.edge_label_index), "
    "batch.edge_label); set k with LinkPredictionDataModule(neg_per_pos=k)."
)


class LinkBatch(Data):
    """A PyG link-prediction ``Data`` (``x``, ``n_id``, ``edge_label_index``, ``edge_label``) without a graph: reading
    ``edge_index`` raises :data:`NO_EDGE_INDEX` (a ``ValueError``) instead of returning None, so a step written for
    PyG's link-prediction examples (message passing over ``edge_index``, negatives drawn from it) is refused with the
    fix named rather than failing inside PyG. Everything else is PyG's ``Data`` (collation, ``to``, pickling)."""

    @property
    def edge_index(self) -> Tensor:
        if "edge_index" in self._store:  # only if set explicitly; the library's batches never hold one
            return self["edge_index"]
        raise ValueError(NO_EDGE_INDEX)

    @edge_index.setter
    def edge_index(self, edge_index: Tensor | None) -> None:
        self._store.edge_index = edge_index

    def __getitem__(self, key: str) -> Any:
        if key == "edge_index" and key not in self._store:
            raise ValueError(NO_EDGE_INDEX)
        return super().__getitem__(key)


def _features(inputs: dict[str, Tensor]) -> Tensor | None:
    """The dense features ``x`` of cached node inputs, None for id-only inputs (``node_inputs = "ids"``)."""
    if "x" in inputs:
        return inputs["x"]
    if "node_id" in inputs:
        return None
    raise ValueError(_TEXT_REFUSED.format(what=f"these nodes have {sorted(inputs)} instead"))


def link_batch(batch: TupleBatch) -> LinkBatch:
    """One slice of coupled tuples as a PyG link-prediction ``Data`` (a :class:`LinkBatch`: no ``edge_index``).

    Tuple i has rows (u_i, v_i, z_i1, …, z_ik) and edges (u_i, v_i) with label 1 and (w_ij, z_ij) with label 0, w_ij
    the end of e_i⁺ that NEG-SAMPLE-WOR paired with z_ij. Full-batch fields: ``x`` ``[B·(2+k), d]``, ``n_id``
    ``[B·(2+k)]``, ``edge_label_index`` ``[2, B·(1+k)]`` (into those rows), ``edge_label`` ``[B·(1+k)]``; per tuple:
    ``tuple_x`` ``[B, 2+k, d]``, ``tuple_n_id`` ``[B, 2+k]``, ``tuple_edge_label_index`` ``[B, 2, 1+k]`` (into the
    tuple's own rows), ``tuple_edge_label`` ``[B, 1+k]``. B = 0 gives every field with size 0.
    """
    size, k = batch.size, batch.neg_per_pos
    slots = 2 + k
    tuple_n_id = batch.node_ids[batch.tuple_nodes.long()].reshape(size, slots)  # (u, v, z_1..z_k): global ids
    src = torch.cat([torch.zeros(size, 1, dtype=torch.long), batch.neg_anchor.long().reshape(size, k)], dim=1)
    dst = torch.cat([torch.ones(1, dtype=torch.long), torch.arange(2, slots)]).expand(size, 1 + k)
    tuple_eli = torch.stack([src, dst], dim=1)  # [B, 2, 1+k], local to the tuple's rows
    tuple_label = torch.zeros(size, 1 + k)
    tuple_label[:, 0] = 1.0
    offsets = (torch.arange(size) * slots).view(size, 1, 1)
    out = LinkBatch(
        n_id=tuple_n_id.reshape(-1),
        edge_label_index=(tuple_eli + offsets).permute(1, 0, 2).reshape(2, size * (1 + k)),
        edge_label=tuple_label.reshape(-1),
        tuple_n_id=tuple_n_id,
        tuple_edge_label_index=tuple_eli,
        tuple_edge_label=tuple_label,
        num_nodes=size * slots,
        expected_batch_size=batch.expected_batch_size,  # b and the sample token ride along (PrivateBatch's two facts)
        step=batch.step,
    )
    x = _features(batch.node_inputs)
    if x is not None:
        tuple_x = x[batch.tuple_nodes.long()].reshape(size, slots, *x.shape[1:])
        out.x, out.tuple_x = tuple_x.reshape(size * slots, *x.shape[1:]), tuple_x
    return out


def eval_link_batch(ev: EvalSet, negatives: Tensor, rows: Tensor) -> LinkBatch:
    """Evaluation queries ``rows`` as a PyG link batch: each held-out relation (u, v) with label 1, then (u, z) with
    label 0 for its sampled non-neighbours z (``negatives[rows]``); ``x`` / ``n_id`` hold the batch's distinct nodes."""
    query, target, neg = ev.query[rows], ev.target[rows], negatives[rows]
    src = torch.cat([query, query.repeat_interleave(neg.shape[1])])
    dst = torch.cat([target, neg.reshape(-1)])
    node_ids, inverse = torch.unique(torch.cat([src, dst]), return_inverse=True)
    label = torch.cat([torch.ones(query.numel()), torch.zeros(neg.numel())])
    out = LinkBatch(n_id=node_ids, edge_label_index=inverse.view(2, -1), edge_label=label, num_nodes=node_ids.numel())
    x = _features(ev.inputs)
    if x is not None:
        out.x = x.index_select(0, node_ids)
    return out


class _LinkTrainBatches(IterableDataset):
    """The training stream's TupleBatches, each as a :func:`link_batch` (an epoch = ``steps_per_epoch`` draws)."""

    def __init__(self, tuples: TupleStream) -> None:
        self.tuples = tuples

    def __len__(self) -> int:
        return len(self.tuples)

    def __iter__(self) -> Iterator[Data]:
        for batch in self.tuples:
            with one_thread():
                out = link_batch(batch)
            yield out


class _LinkEvalBatches(IterableDataset):
    """One evaluation graph's held-out relations and their negatives, ``batch_size`` relations a batch (rank slices)."""

    def __init__(self, ev: EvalSet, negatives: Tensor, batch_size: int, world: Callable[[], tuple[int, int]]) -> None:
        self.ev, self.negatives, self.batch_size, self.world = ev, negatives, batch_size, world

    def _rows(self) -> list[Tensor]:
        rank, world = self.world()
        num_q = self.ev.query.numel()
        num_batches = max(1, math.ceil(math.ceil(num_q / world) / self.batch_size))
        return list(torch.tensor_split(slice_rows(num_q, rank, world), num_batches))

    def __len__(self) -> int:
        return len(self._rows())

    def __iter__(self) -> Iterator[Data]:
        for rows in self._rows():
            yield eval_link_batch(self.ev, self.negatives, rows)


class LinkPredictionDataModule(RelationalDataModule):
    """Entity-level private training of your own PyG link predictor: coupled tuples as ``Data`` link batches.

    The constructor is :class:`RelationalDataModule`'s; so are the sampling, the :attr:`sampling_spec` (unit: an entity)
    and the accounting (standard per-tuple clipping: Theorem C.1). Training batches are :func:`link_batch`; validation
    and test batches (:func:`eval_link_batch`) hold the held-out relations with label 1 and, per relation (u, v),
    ``eval_candidates`` nodes z (default 1) drawn once from V minus {u, v} with a public seed as (u, z) with label 0, so
    a ``validation_step`` written for PyG's link-prediction batches runs unchanged. Node inputs are dense ``data.x``
    (texts are refused: embed them first); a subclass with ``node_inputs = "ids"`` gives ``n_id`` only.

    Example::

        >>> from lightning_dprel.datamodules.datasets.generators import random_feature_graph
        >>> dm = LinkPredictionDataModule(random_feature_graph(200, 600), expected_batch_size=8, neg_per_pos=2)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch.tuple_x.shape[1:], batch.edge_label_index.shape[1] == 3 * batch.tuple_x.shape[0]
        (torch.Size([4, 16]), True)
    """

    #: How the privacy callback splits a batch into its examples: one coupled tuple each.
    example_view = LinkTuples(LinkBatch)  # reading edge_index names the fix

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.tokenizer is not None:
            raise ValueError(_TEXT_REFUSED.format(what=f"it got tokenizer={self.tokenizer!r}"))
        self._eval_negatives: dict[str, Tensor] = {}

    def match_encoder(self, encoder: Any) -> None:
        """As RelationalDataModule's, but a module's text encoder (which would tokenise node texts) is refused."""
        super().match_encoder(encoder)
        if self.tokenizer is not None:
            raise ValueError(_TEXT_REFUSED.format(what=f"the module's encoder tokenises texts ({self.tokenizer!r})"))

    def setup(self, stage: str | None = None) -> None:
        """RelationalDataModule's setup, then the public evaluation negatives (fixed once, from ``seed``)."""
        try:
            super().setup(stage)
        except ValueError as err:
            if "have no features" in str(err):  # a text-only graph: name the fix for this datamodule
                raise ValueError(_TEXT_REFUSED.format(what="this graph's nodes have no `data.x`")) from err
            raise
        _features(self.train_inputs)
        for name, ev in (("test", self._test), ("val", self._val)):
            if ev is not None and name not in self._eval_negatives:
                self._eval_negatives[name] = self._negatives(ev, name)

    def _negatives(self, ev: EvalSet, name: str) -> Tensor:
        if ev.cands is not None:  # eval_candidates=N: the ranking candidates' N negatives, fixed at setup
            return ev.cands[:, 1:]
        return sample_eval_candidates(ev.query, ev.target, ev.num_nodes, 1,
                                      generator=public_generator(self.seed, "link_eval", name))[:, 1:]

    def train_dataloader(self) -> DataLoader:
        """``steps_per_epoch`` link batches per epoch (its position saved with the datamodule's state)."""
        return StatefulLoader(_LinkTrainBatches(TupleStream(self._live_stream(), self.world)), self)

    def _eval_loader(self, name: str) -> DataLoader:
        ev = self._test if name == "test" else self._val
        return DataLoader(_LinkEvalBatches(ev, self._eval_negatives[name], self.eval_batch_size, self.world),
                          batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        """Validation link batches: the validation graph's relations, else the test relations (warned, as the parent)."""
        ranking = super().val_dataloader()  # warns when there is no validation graph
        return self._eval_loader("val" if ranking.dataset.ev is self._val else "test")

    def test_dataloader(self) -> DataLoader:
        """Test link batches: the test graph's held-out relations and their negatives."""
        self.sampling_spec  # noqa: B018 - a clear error before setup
        return self._eval_loader("test")
