"""Evaluation and inference of a relational module: embeddings, ranking metrics (Section 5.2), predictions.

:class:`EmbedAndRank` is the part of :class:`~lightning_dprel.methods.relational.module.DPRelationalModule` that never touches the
private training batches: it embeds nodes chunk by chunk (with a progress sub-task on the trainer's bar, unless
progress bars are off), ranks each query's target for PREC@1 / MRR, embeds new texts or node inputs for
``trainer.predict``, and scores new pairs (:meth:`EmbedAndRank.score_pairs`) or ranks candidates for a query
(:meth:`EmbedAndRank.rank_candidates`) with the score the model was trained with. Batches that rank against every
node of a graph (``candidates=None``) all carry the same graph; it is embedded once per evaluation and reused by
the following batches.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Section 5.2 (PREC@1, MRR).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.datamodules.edge_tuples.batch import RankingBatch
from lightning_dprel.encoders import output_width
from lightning_dprel.methods.relational.losses import pair_scores, score_matrix
from lightning_dprel.progress import chunk_progress
from lightning_dprel.methods.relational.ranking import target_ranks

__all__ = ["EmbedAndRank", "RankedCandidates", "embed_texts", "input_spec_of"]


def input_spec_of(datamodule: Any) -> dict[str, Any]:
    """How a datamodule turns node texts into inputs: ``{"tokenizer", "max_length", "embed_text"}``, where
    ``embed_text`` is ``{"model_name", "max_length"}`` of an :class:`~lightning_dprel.transforms.EmbedText` transform."""
    from lightning_dprel.transforms import EmbedText

    transform = getattr(datamodule, "transform", None)
    frozen = {"model_name": transform.model_name, "max_length": int(transform.max_length)} if isinstance(transform, EmbedText) else None
    max_length = getattr(datamodule, "max_length", None)
    return {"tokenizer": getattr(datamodule, "tokenizer", None), "max_length": None if max_length is None else int(max_length), "embed_text": frozen}


def embed_texts(module: Any, texts: Sequence[str], *, max_length: int | None = None) -> Tensor:
    """``[N, d]`` embeddings of new node texts by a trained module, made the way its training inputs were.

    A text encoder (one with ``tokenize``, e.g. :class:`~lightning_dprel.encoders.TextEncoder`) tokenises with its own
    tokenizer (``max_length``: the training datamodule's, else 64). An encoder trained on frozen text embeddings
    (``module.input_spec["embed_text"]``, e.g. the main job's :class:`~lightning_dprel.encoders.ResidualAdapter`)
    gets them from the same frozen model (:func:`lightning_dprel.transforms.embed_texts`) first. A directed adapter
    returns ``[adapter(x) ‖ x]``, as in training. Other encoders were trained on dense features: ``ValueError``.
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("`texts` must be a sequence of strings (one per node).")
    spec, encoder = module.input_spec or {}, module.encoder
    if hasattr(encoder, "tokenize"):
        inputs = encoder.tokenize(list(texts), max_length=max_length or spec.get("max_length") or 64)
    elif spec.get("embed_text"):
        from lightning_dprel.transforms import embed_texts as frozen_embeddings

        frozen = spec["embed_text"]
        inputs = {"x": frozen_embeddings(list(texts), frozen["model_name"], max_length=max_length or frozen["max_length"])}
    else:
        raise ValueError(
            f"This {type(encoder).__name__} was trained on dense features, not on texts (its datamodule had no tokenizer "
            "and no EmbedText transform): embed its features with module.embed({'x': features})."
        )
    was_training = module.training
    module.eval()
    try:
        return module.embed({k: v.to(module.device) for k, v in inputs.items()})
    finally:
        module.train(was_training)


def _is_texts(nodes: Any) -> bool:
    return isinstance(nodes, (list, tuple)) and all(isinstance(t, str) for t in nodes)


class RankedCandidates(NamedTuple):
    """:meth:`EmbedAndRank.rank_candidates`' answer: candidate ``indices`` (into the given candidates) best first, and
    their ``scores``; ``[k]`` for one query, ``[Q, k]`` for several."""

    indices: Tensor
    scores: Tensor


class EmbedAndRank:
    """LightningModule mixin: needs ``self.encoder`` and ``hparams.score`` / ``hparams.temperature``."""

    _eval_cache: tuple[Tensor, dict[str, Tensor], Tensor] | None = None

    @torch.no_grad()
    def embed(self, node_inputs: dict[str, Tensor], *, chunk: int = 512) -> Tensor:
        """Embeddings of all nodes of ``node_inputs``, encoded in chunks of ``chunk`` nodes (with a progress sub-task
        on the trainer's bar when there are several chunks, unless progress bars are off)."""
        size = next(iter(node_inputs.values())).shape[0]
        parts = [self.encoder(**{k: v[i : i + chunk] for k, v in node_inputs.items()}) for i in chunk_progress(self, size, chunk)]
        return torch.cat(parts) if parts else torch.zeros(0)

    def _embed_nodes(self, node_ids: Tensor, inputs: dict[str, Tensor], whole_graph: bool) -> Tensor:
        """Embeddings of a RankingBatch's nodes; a whole-graph batch equal to the previous one reuses its embeddings."""
        cached = self._eval_cache
        if (whole_graph and cached is not None and torch.equal(cached[0], node_ids) and cached[1].keys() == inputs.keys()
                and all(torch.equal(cached[1][k], v) for k, v in inputs.items())):
            return cached[2]
        h = self.embed(inputs)
        self._eval_cache = (node_ids, inputs, h) if whole_graph else None
        return h

    def _forget_embeddings(self) -> None:
        self._eval_cache = None  # the parameters may change between evaluations

    def on_validation_epoch_start(self) -> None:
        self._forget_embeddings()

    def on_validation_epoch_end(self) -> None:
        self._forget_embeddings()

    def on_test_epoch_start(self) -> None:
        self._forget_embeddings()

    def on_test_epoch_end(self) -> None:
        self._forget_embeddings()

    @torch.no_grad()
    def ranking_metrics(self, batches: Any) -> dict[str, float]:
        """PREC@1 and MRR over an iterable of :class:`RankingBatch` without logging (summed over ranks under DDP)."""
        was_training = self.training
        self.eval()
        self._forget_embeddings()
        try:
            totals = torch.zeros(3, dtype=torch.float64)
            for batch in batches:
                inputs = {k: v.to(self.device) for k, v in batch.node_inputs.items()}
                h = self._embed_nodes(batch.node_ids, inputs, batch.candidates is None)
                ranks = target_ranks(
                    h, batch.query.to(self.device), batch.target.to(self.device),
                    None if batch.candidates is None else batch.candidates.to(self.device),
                    score=self.hparams.score, temperature=self.hparams.temperature,
                ).double().cpu()
                totals += torch.stack([(ranks == 1).double().sum(), (1.0 / ranks).sum(), torch.tensor(float(ranks.numel()))])
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                box = totals.to(self.device)
                torch.distributed.all_reduce(box)
                totals = box.cpu()
        finally:
            self.train(was_training)
            self._forget_embeddings()
        count = max(float(totals[2]), 1.0)
        return {"prec1": float(totals[0]) / count, "mrr": float(totals[1]) / count, "queries": int(totals[2])}

    def _rank_step(self, batch: RankingBatch, prefix: str) -> Tensor:
        if not isinstance(batch, RankingBatch):
            raise TypeError(f"{prefix}_step expects a RankingBatch, got {type(batch).__name__}.")
        h = self._embed_nodes(batch.node_ids, batch.node_inputs, batch.candidates is None)
        ranks = target_ranks(
            h, batch.query, batch.target, batch.candidates, score=self.hparams.score, temperature=self.hparams.temperature
        )
        q = max(batch.size, 1)
        self.log(f"{prefix}_prec1", (ranks == 1).float().mean(), batch_size=q, sync_dist=True)
        self.log(f"{prefix}_mrr", (1.0 / ranks.float()).mean(), batch_size=q, sync_dist=True, prog_bar=True)
        return ranks

    def validation_step(self, batch: RankingBatch, batch_idx: int) -> Tensor:
        return self._rank_step(batch, "val")

    def test_step(self, batch: RankingBatch, batch_idx: int) -> Tensor:
        return self._rank_step(batch, "test")

    # --- inference -----------------------------------------------------------------------------------
    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], *, max_length: int | None = None) -> Tensor:
        """``[N, d]`` embeddings of new node texts, made as in training (:func:`embed_texts`)."""
        return embed_texts(self, texts, max_length=max_length)

    def predict_step(self, batch: Any, batch_idx: int = 0) -> Tensor:
        """Embeddings of a batch: a list of texts, a dict of node inputs (e.g. ``{"x": ...}``) or a RankingBatch."""
        if isinstance(batch, RankingBatch):
            return self.embed(batch.node_inputs)
        if isinstance(batch, Mapping):
            return self.embed(dict(batch))
        if isinstance(batch, (list, tuple)) and all(isinstance(t, str) for t in batch):
            return self.embed_texts(list(batch))
        raise TypeError(f"predict_step expects texts, a dict of node inputs or a RankingBatch, got {type(batch).__name__}.")

    # --- scoring new pairs ---------------------------------------------------------------------------
    def _node_sets(self, max_length: int | None, **named: Any) -> list[Tensor]:
        """:meth:`_embeddings_of` each argument, the texts of all of them embedded in one :meth:`embed_texts` call (a
        frozen text model is loaded once per call: one "Loading weights", not one per argument)."""
        for name, nodes in named.items():  # refuse what is neither texts, a tensor nor node inputs before embedding any
            if not (_is_texts(nodes) or isinstance(nodes, (Tensor, Mapping))):
                self._embeddings_of(nodes, name, max_length)  # raises its TypeError
        texts = [t for nodes in named.values() if _is_texts(nodes) for t in nodes]
        joint = self.embed_texts(texts, max_length=max_length) if texts else None
        out, start = [], 0
        for name, nodes in named.items():
            given = None
            if joint is not None and _is_texts(nodes):
                given, start = joint[start : start + len(nodes)], start + len(nodes)
            out.append(self._embeddings_of(nodes, name, max_length, given))
        return out

    def _embeddings_of(self, nodes: Any, name: str, max_length: int | None, embedded: Tensor | None = None) -> Tensor:
        """``[N, d]`` embeddings of ``nodes``: texts (embedded as in training, or ``embedded`` already), embeddings (a
        float tensor ``[N, d]`` of the model's width, as :meth:`embed_texts` / ``embed`` return them) or a dict of
        node inputs (e.g. ``{"x": features}``)."""
        if isinstance(nodes, Tensor):
            if nodes.dim() != 2 or not nodes.is_floating_point():
                raise TypeError(f"`{name}` as a tensor must be float embeddings [N, d] (from embed_texts or embed), got "
                                f"{nodes.dtype} of shape {tuple(nodes.shape)}.")
            width = output_width(self.encoder)
            if width is not None and nodes.shape[1] != width:
                raise ValueError(
                    f"`{name}` has embeddings of dimension {nodes.shape[1]} ({list(nodes.shape)}), but this model's "
                    f"embeddings have dimension {width} ({type(self.encoder).__name__}'s out_dim): pass float [N, {width}] "
                    "embeddings from embed_texts / embed, or the nodes' texts or inputs (node-id pairs are not taken: "
                    "embed the nodes first)."
                )
            h = nodes.to(self.device)
        elif isinstance(nodes, Mapping):
            was_training = self.training
            self.eval()
            try:
                h = self.embed({k: v.to(self.device) for k, v in nodes.items()})
            finally:
                self.train(was_training)
        elif _is_texts(nodes):
            if embedded is not None:
                h = embedded
            else:
                h = self.embed_texts(list(nodes), max_length=max_length) if nodes else torch.zeros(0, 0)
        else:
            raise TypeError(f"`{name}` must be a list of texts, a float tensor of embeddings [N, d] or a dict of node "
                            f"inputs, got {type(nodes).__name__}" + (" (wrap one text in a list)." if isinstance(nodes, str) else "."))
        if h.shape[0] == 0:
            raise ValueError(f"`{name}` is empty: give at least one node.")
        return h

    def _scoring(self) -> dict[str, Any]:
        return {"score": self.hparams.score, "temperature": self.hparams.temperature}

    @torch.no_grad()
    def score_pairs(self, children: Any, parents: Any, *, max_length: int | None = None) -> Tensor:
        """Scores ``[N]`` of the pairs child_i → parent_i by the model's own score (``hparams.score`` / ``temperature``,
        e.g. the directed cosine / τ on ``[adapter(x) ‖ x]``): the same numbers as training and evaluation give them
        (:func:`~lightning_dprel.methods.relational.losses.pair_scores`). Higher means more likely related.

        Args:
            children, parents: N nodes each, as texts (a list of str, embedded by :meth:`embed_texts`), embeddings
                (a float tensor ``[N, d]``) or a dict of node inputs (e.g. ``{"x": features}``).
            max_length: tokens per text (default: the training datamodule's).
        """
        h_child, h_parent = self._node_sets(max_length, children=children, parents=parents)
        if h_child.shape[0] != h_parent.shape[0]:
            raise ValueError(f"`children` and `parents` must have the same length (pair i is children[i] → parents[i]), "
                             f"got {h_child.shape[0]} and {h_parent.shape[0]}.")
        if h_child.shape[1] != h_parent.shape[1]:
            raise ValueError(f"`children` and `parents` embeddings differ in dimension: {h_child.shape[1]} vs {h_parent.shape[1]}.")
        return pair_scores(h_child, h_parent, **self._scoring())

    @torch.no_grad()
    def rank_candidates(self, query: Any, candidates: Any, k: int | None = None, *, max_length: int | None = None) -> RankedCandidates:
        """The candidates sorted by s(query → candidate), best first, as in evaluation (the query is the child, each
        candidate a possible parent): ``RankedCandidates(indices, scores)``, top ``k`` (None: all; a ``k`` above the
        number of candidates gives all). Ties keep the candidates' order; NaN scores rank last.

        Args:
            query: one text (str), or one embedding ``[d]``, or several queries as :meth:`score_pairs` takes nodes
                (then ``indices`` and ``scores`` are ``[Q, k]``).
            candidates: texts, embeddings ``[C, d]`` or node inputs, as :meth:`score_pairs` takes them.
        """
        check_int("k", k, 1, " k: a positive int, or None for all candidates.", optional=True)
        single = isinstance(query, str) or (isinstance(query, Tensor) and query.dim() == 1)
        if single:
            query = [query] if isinstance(query, str) else query.unsqueeze(0)
        h_query, h_cand = self._node_sets(max_length, query=query, candidates=candidates)
        if h_query.shape[1] != h_cand.shape[1]:
            raise ValueError(f"`query` and `candidates` embeddings differ in dimension: {h_query.shape[1]} vs {h_cand.shape[1]}.")
        scores = score_matrix(h_query, h_cand, **self._scoring())  # [Q, C], the evaluation's ranking scores
        order = torch.sort(scores.masked_fill(scores.isnan(), -float("inf")), dim=1, descending=True, stable=True).indices
        order = order.gather(1, scores.gather(1, order).isnan().to(torch.uint8).argsort(dim=1, stable=True))  # NaN last
        order = order[:, : k or scores.shape[1]]
        ranked = RankedCandidates(order, scores.gather(1, order))
        return RankedCandidates(ranked.indices[0], ranked.scores[0]) if single else ranked
