"""Evaluation and inference of a relational module: embeddings, ranking metrics (Section 5.2), predictions.

:class:`EmbedAndRank` is the part of :class:`~lightning_dprel.methods.relational.module.DPRelationalModule` that never touches the
private training batches: it embeds nodes chunk by chunk (with a progress sub-task on the trainer's bar, unless
progress bars are off), ranks each query's target for PREC@1 / MRR, and embeds new texts or node inputs for
``trainer.predict``. Batches that rank against every node of a graph (``candidates=None``) all carry the same
graph; it is embedded once per evaluation and reused by the following batches.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Section 5.2 (PREC@1, MRR).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_dprel.methods.relational.batch import RankingBatch
from lightning_dprel.progress import chunk_progress
from lightning_dprel.methods.relational.ranking import target_ranks

__all__ = ["EmbedAndRank", "embed_texts", "input_spec_of"]


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
