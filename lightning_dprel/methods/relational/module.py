"""The private relational LightningModule: per-tuple gradients → DP optimizer hook (Algorithm 3).

Training (manual optimization): encoder f_Θ → embeddings → scores → per-tuple loss; per-tuple
gradients from :class:`~lightning_dprel.grad_sample.dispatch.GradSampler` (ghost clipping where exact, else vmap); then :class:`~lightning_dprel.core.optim.DPOptimizer`
clips (FREQ-CLIP or standard), sums, all-reduces, adds N(0, σ²C²I) once, divides by the expected batch
size b and steps Adam. ``clipping="none"`` with ``noise_multiplier=0`` is the non-private baseline
through the same code path. Evaluation ranks each test relation's target among candidates
(PREC@1, MRR; Section 5.2).

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 (training loop), Algorithm 1 (FREQ-CLIP), Section 5.2 (PREC@1, MRR).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_dprel.core.checks import check_bool, check_int
from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.encoders import build_encoder, check_encoder_inputs, encoder_spec
from lightning_dprel.methods.relational.inference import input_spec_of
from lightning_dprel.methods.relational.inference import EmbedAndRank
from lightning_dprel.methods.relational.losses import check_loss_options, tuple_loss
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.private_module import PrivateModule, refuse_unsafe_trainer_settings
from lightning_dprel.grad_sample.base import PerTupleResult, trainable_parameters
from lightning_dprel.grad_sample.dispatch import GradSampler
from lightning_dprel.datamodules.edge_tuples.batch import tuple_inputs
from lightning_dprel.methods.relational.ranking import target_ranks

__all__ = ["DPRelationalModule", "target_ranks", "refuse_unsafe_trainer_settings"]


class DPRelationalModule(EmbedAndRank, PrivateModule):
    """Entity-level DP relational learning with per-tuple clipping and one global noise draw.

    Saved models: the hyper-parameters keep the encoder's spec (:func:`~lightning_dprel.encoders.encoder_spec`), so
    ``DPRelationalModule.load_from_checkpoint(path)`` rebuilds it (a custom encoder without ``init_args``: pass
    ``encoder=``); the checkpoint also keeps the ledger and :attr:`input_spec`, so :meth:`embed_texts` embeds new
    texts as training did. :func:`lightning_dprel.export.export_model` writes the trained weights and the privacy report.
    """

    def __init__(
        self,
        encoder: nn.Module,
        *,
        score: str = "cosine",
        temperature: float = 0.05,
        loss: str = "infonce",
        margin: float = 1.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        clipping: str = "freq",
        accounting: str = "corrected",
        clip_norm: float = 1.0,
        noise_multiplier: float = 1.0,
        noise_seed: int | None = None,
        secure_noise: bool | None = None,
        allow_untracked: bool = False,
        per_tuple_mode: str = "auto",
        chunk_size: int | str | None = "auto",
        vmap_chunk_size: int | None = None,
        optimizer: str = "adam",
        momentum: float = 0.0,
        diagnostics: bool = False,
        log_train_metrics: bool = False,
    ) -> None:
        """Build the module (the class docstring describes training and saved models).

        Args:
            encoder: node encoder mapping node inputs to ``[N, d]`` (e.g. :class:`~lightning_dprel.encoders.TextEncoder`),
                or its spec ``{"class_path", "init_args"}`` (how a checkpoint rebuilds it).
            score: ``"dot"`` or ``"cosine"`` (cosine / τ).
            temperature: τ for cosine scores.
            loss: ``"infonce"`` or ``"hinge"``.
            margin: hinge margin γ.
            lr: learning rate of the wrapped optimizer.
            weight_decay: weight decay of the wrapped optimizer.
            clipping: ``"freq"`` (Algorithm 1), ``"standard"`` or ``"none"`` (baseline, needs σ = 0).
            accounting: for FREQ-CLIP, ``"corrected"`` (default, sensitivity profile Δ_freq) or
                ``"paper"`` (Eq. 3); ``"public_negatives"`` for standard clipping over a public node set
                (``PublicVocabularyDataModule``).
            clip_norm: C.
            noise_multiplier: σ (the privacy callback may calibrate it via :meth:`set_noise_multiplier`).
            noise_seed: None (default): the noise comes from a secret keyed CSPRNG stream
                (:class:`~lightning_dprel.core.randomness.KeyedStream`, key from ``os.urandom``, rank 0's under DDP,
                never saved). A seed makes runs reproducible but **voids the guarantee** (anyone who knows it
                regenerates the noise, ε = ∞); a warning says so.
            secure_noise: deprecated and ignored: the noise is always drawn from the keyed CSPRNG stream.
            allow_untracked: a private module refuses to train without a privacy callback in the trainer (one
                whose ``charges_privacy_ledger`` is True, e.g. :class:`callbacks.PrivacyCallback`). True lets it
                train anyway: every step is still recorded in :attr:`privacy_ledger`, with a warning.
            per_tuple_mode: how per-tuple norms and clipped sums are formed (:class:`~lightning_dprel.grad_sample.dispatch.GradSampler`):
                ``"auto"`` (default: ghost clipping where it is exact: a declared slot-wise encoder, every trainable parameter
                covered, run-time checks passed; else vmap), ``"ghost"`` (ghost clipping + book-keeping, vmap only for the
                parameters of layers it does not cover) or ``"vmap"`` (every tuple's gradient formed with torch.func). All
                give the same clipped sums.
            chunk_size: tuples per forward/backward chunk: ``"auto"`` (default: from the free memory), an int, or None
                (the whole slice at once).
            vmap_chunk_size: deprecated alias of ``chunk_size``.
            optimizer: the wrapped optimizer, ``"adam"`` (default), ``"adamw"`` or ``"sgd"``.
            momentum: momentum of ``optimizer="sgd"`` (ignored by Adam).
            diagnostics: keep per-step clipping/noise diagnostics in ``DPOptimizer.last_step_stats`` (norm
                quantiles, cosine between clipped and unclipped sums, clipped-sum / noise / update norms). Computed from
                the private batch without noise, so **outside the guarantee** (a warning says so): for diagnosis only.
            log_train_metrics: log ``train_loss`` and ``train_clipped_fraction``. They are computed from the
                private batch without noise and are **outside the DP guarantee** (a warning says so); default
                False logs nothing computed from the private batch.
        """
        super().__init__()
        if isinstance(encoder, Mapping):
            encoder = build_encoder(encoder)
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"`encoder` must be a torch.nn.Module, got {type(encoder).__name__}.")
        check_loss_options(score=score, temperature=temperature, loss=loss, margin=margin)
        self._setup_privacy(
            clipping=clipping, accounting=accounting, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
            noise_seed=noise_seed, optimizer=optimizer, lr=lr, momentum=momentum, diagnostics=diagnostics,
        )
        if vmap_chunk_size is not None:
            check_int("vmap_chunk_size", vmap_chunk_size, 1, optional=True)
            rank_zero_warn("DPRelationalModule(vmap_chunk_size=...) is deprecated: use chunk_size=.", category=DeprecationWarning)
            chunk_size = vmap_chunk_size
        #: Per-tuple norms and clipped sums (grad_sample's one entry point: ghost where exact, else vmap; the chunk rule).
        self.grad_sampler = GradSampler(per_tuple_mode, chunk_size)
        self.encoder = encoder
        check_bool("log_train_metrics", log_train_metrics)
        if secure_noise is not None:
            rank_zero_warn(
                "DPRelationalModule(secure_noise=...) is deprecated and ignored: the noise always comes from a "
                "keyed CSPRNG stream (lightning_dprel.core.randomness.KeyedStream).",
                category=DeprecationWarning,
            )
        if log_train_metrics:
            rank_zero_warn(
                "DPRelationalModule(log_train_metrics=True) logs train_loss and train_clipped_fraction, computed from "
                "the private batch without noise: these values are outside the differential-privacy guarantee.",
                category=UserWarning,
            )
        self.save_hyperparameters(ignore=["encoder"])
        spec = encoder_spec(encoder)
        if spec is not None:  # what load_from_checkpoint rebuilds the encoder from (its weights are in the state dict)
            self.hparams["encoder"] = spec
            self._hparams_initial = copy.deepcopy(self._hparams)

    # --- model ---------------------------------------------------------------------------------------
    def forward(self, **node_inputs: Tensor) -> Tensor:
        """Node embeddings ``[N, d]``."""
        return self.encoder(**node_inputs)

    def _tuple_head(self, h: Tensor, neg_anchor: Tensor) -> Tensor:
        hp = self.hparams
        return tuple_loss(h, neg_anchor, score=hp.score, temperature=hp.temperature, loss=hp.loss, margin=hp.margin)

    def per_tuple(self, batch: TupleBatch) -> PerTupleResult:
        """Per-tuple norms / clipped sums and losses of a batch, from :attr:`grad_sampler` (``per_tuple_mode``)."""
        projected = self._dp_optimizer is not None and self._dp_optimizer.subspace is not None  # needs tensors (core/subspace.py)
        return self.grad_sampler.tuples(self.encoder, tuple_inputs(batch), self._tuple_head, (batch.neg_anchor.long(),),
                                        materialize=projected)

    # --- public data (never charged: the batch comes from datamodule.public, not the private stream) ---------------
    def public_tuple_grads(self, batch: TupleBatch) -> dict[str, Tensor]:
        """Per-tuple gradients ``[B, *shape]`` of PUBLIC tuples at the current parameters (for the public subspace)."""
        result = self.grad_sampler.tuples(self.encoder, tuple_inputs(batch), self._tuple_head, (batch.neg_anchor.long(),),
                                          materialize=True)
        return dict(result.grads)

    def public_loss(self, batch: TupleBatch) -> Tensor:
        """The mean loss of PUBLIC tuples, differentiable (for non-private public pre-training)."""
        h = self.encoder(**batch.node_inputs)[batch.tuple_nodes.long()]
        return self._tuple_head(h, batch.neg_anchor.long()).mean()

    def configure_optimizers(self) -> DPOptimizer:
        return self.build_dp_optimizer(trainable_parameters(self.encoder))

    def setup(self, stage: str) -> None:
        if self.trainer.datamodule is not None:
            self.input_spec = input_spec_of(self.trainer.datamodule)
            dm = self.trainer.datamodule  # the encoder meets the features here: refuse a mismatch now, not deep in a step
            for what in ("train_inputs", "test_inputs"):
                inputs = getattr(dm, what, None)
                if isinstance(inputs, Mapping) and (what == "train_inputs" or inputs is not getattr(dm, "train_inputs", None)):
                    check_encoder_inputs(self.encoder, inputs, f"the datamodule's {what}")
            public = getattr(self.trainer.datamodule, "public", None)
            if public is not None:
                self.public_data.setdefault("graph", public.describe())

    # --- training ------------------------------------------------------------------------------------
    def training_step(self, batch: TupleBatch, batch_idx: int) -> None:
        if not isinstance(batch, TupleBatch):
            raise TypeError(f"training_step expects a TupleBatch, got {type(batch).__name__}.")
        result = self.per_tuple(batch)
        dp = self.private_step(result.grads, max_freq=batch.max_freq, batch=batch)
        if not self.hparams.get("log_train_metrics", False):
            return  # nothing computed from the private batch leaves the step un-noised
        totals = torch.stack([result.losses.sum().to(torch.float64), torch.tensor(float(result.size), dtype=torch.float64, device=result.losses.device)])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(totals)
        if totals[1] > 0:
            self.log("train_loss", float(totals[0] / totals[1]), prog_bar=True, batch_size=max(int(totals[1]), 1))
        self.log("train_clipped_fraction", dp.last_step_stats.get("clipped_fraction", 0.0), batch_size=1)

    # --- checkpoints ---------------------------------------------------------------------------------
