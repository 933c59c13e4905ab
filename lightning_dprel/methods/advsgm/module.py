"""Private skip-gram node embeddings (AdvSGM, Zhang et al.): a provable mode by default, the published one labelled.

Provable mode (spec ``shared/spec/advsgm.md``, "Provable mode"): each tuple (an edge of the K-capped graph with k
negatives from the public id universe) has loss L_sgm (+ λ·L_adv against the generator's fakes, constants made from
released state); its whole gradient — every row of W_in and W_out it touches — is clipped to C (ghost clipping on the
two embedding tables), the clipped sum gets N(0, σ²C²) on **every** coordinate of both tables (one release, one
DP optimizer), divided by b. Unit ``node_public_ids`` with the ``skipgram_public_ids`` accounting (Theorem C.1, j ≡ 0),
``entity`` with ``standard`` when the node set is private, or ``edge`` with ``skipgram_edge`` (one relation, Δ = C).

Paper-faithful mode (``mode="paper"``): the authors' Algorithm 3 — fixed-size batches, a positive update then a
negative update per iteration (Eq. 24), per-example ξ ~ N(0, C²σ²I) inside the constrained sigmoid S (Algorithm 1),
λ = 1, no clipping, the code's generator, the negative update the mean over its B·k pairs (as the code weighs it).
Its steps carry no noise from the library's view (the ξ terms protect nothing: spec items 1–4), so the ledger says
ε = ∞; the paper's Theorem 7 ε only decides when it stops
(:class:`~lightning_dprel.methods.advsgm.paper.PaperStop`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics.classification import BinaryAUROC

from lightning_dprel.core.checks import check_choice, non_negative
from lightning_dprel.methods.advsgm.accounting import ADVSGM_PAPER_WARNING
from lightning_dprel.core.private_module import PrivateModule
from lightning_dprel.core.update_watch import public_update
from lightning_dprel.datamodules.edge_tuples.batch import RankingBatch, TupleBatch, tuple_inputs
from lightning_dprel.datamodules.edge_tuples.rows import slice_rows
from lightning_dprel.encoders import build_encoder, encoder_spec
from lightning_dprel.grad_sample.base import PerTupleResult, trainable_parameters
from lightning_dprel.grad_sample.dispatch import GradSampler
from lightning_dprel.methods.advsgm.adversarial import FakeNeighbours
from lightning_dprel.methods.advsgm.encoder import NodeIdEmbedding
from lightning_dprel.methods.advsgm.evaluation import _pair_keys  # the sorted keys min·n + max of a graph's pairs
from lightning_dprel.methods.advsgm.losses import adversarial_loss, sgns_loss

__all__ = ["DPSkipGramModule", "MODES"]

MODES = ("provable", "paper")


def _provable_head(h: Tensor, neg_anchor: Tensor, *fakes: Tensor, adversarial: float) -> Tensor:
    loss = sgns_loss(h, neg_anchor)
    return loss + adversarial * adversarial_loss(h, fakes[0]) if fakes else loss


def _paper_positive_head(h: Tensor, neg_anchor: Tensor, fakes: Tensor, xi: Tensor) -> Tensor:
    pos = sgns_loss(h, neg_anchor, symmetric=False, part="positive", sigmoid="constrained")
    return pos + adversarial_loss(h, fakes, noise=xi, sigmoid="constrained", symmetric=False)  # λ = 1 (the code)


def _paper_negative_head(h: Tensor, neg_anchor: Tensor, *label: Tensor) -> Tensor:
    """Eq. 24's negative update weighted as the code: the mean over the tuple's k negatives (÷ B in the step: over B·k)."""
    return sgns_loss(h, neg_anchor, symmetric=False, part="negative", sigmoid="constrained", negatives="mean",
                     neg_label=label[0] if label else None)


class DPSkipGramModule(PrivateModule):
    """Skip-gram (LINE, second order) node embeddings with an optional adversarial regulariser, trained privately.

    Args:
        encoder: a :class:`~lightning_dprel.methods.advsgm.encoder.NodeIdEmbedding` (or its spec); None builds one
            with ``num_nodes`` rows (or the datamodule's id count at setup) and width ``dim``.
        num_nodes, dim, init_std: the tables built when ``encoder`` is None.
        mode: ``"provable"`` (default) or ``"paper"`` (the published pipeline; warns; provable ε = ∞).
        adversarial: λ of the adversarial terms in provable mode (0: plain DP skip-gram).
        generator_steps, generator_lr, generator_noise, generator_batch: the generator's steps after each step, its
            Adam learning rate, the scale of its keyed perturbation, and the public ids per generator step.
        paper_sigma: the paper's σ of ξ ~ N(0, C²σ²I) (``mode="paper"``; C = ``clip_norm``).
        paper_rounds: n_D, the discriminator iterations per epoch after which the paper's generator takes
            ``paper_generator_steps`` (n_G) steps.
        edge_labelled_negatives: as the authors' code, a sampled negative pair that is a training edge gets label +1
            (``mode="paper"`` only: it reads E outside the tuple, which no provable mode may).
        lr, weight_decay, optimizer, momentum: the wrapped optimizer (the paper's code: Adam, 0.1).
        clipping: ``"standard"`` (provable) or ``"none"`` (non-private baseline, needs σ = 0; paper mode forces it).
        accounting: ``"skipgram_public_ids"`` (node level, ids public), ``"standard"`` (node set private) or
            ``"skipgram_edge"`` (edge level, :class:`~lightning_dprel.methods.advsgm.datamodule.EdgeSkipGramDataModule`).
        clip_norm, noise_multiplier, noise_seed, allow_untracked, diagnostics: as for every private module.
        per_tuple_mode: ``"auto"``/``"ghost"`` (the tables' ghost norms, exact here) or ``"vmap"``
            (:class:`~lightning_dprel.grad_sample.dispatch.GradSampler`).
        chunk_size: tuples per forward/backward pass (None: all).
    """

    report_metrics = (("test_auc", "link AUC"),)
    report_title = "Link prediction (held-out edges vs random pairs) on"
    report_rows = ("initial tables", "trained")

    def __init__(
        self, encoder: nn.Module | Mapping | None = None, *, num_nodes: int | None = None, dim: int = 128, init_std: float = 1.0,
        mode: str = "provable", adversarial: float = 0.0, generator_steps: int = 1, generator_lr: float = 0.01,
        generator_noise: float = 0.1, generator_batch: int = 256, paper_sigma: float = 5.0, paper_rounds: int = 15,
        paper_generator_steps: int = 5, edge_labelled_negatives: bool = False, lr: float = 0.01, weight_decay: float = 0.0,
        optimizer: str = "adam", momentum: float = 0.0, clipping: str = "standard", accounting: str = "skipgram_public_ids",
        clip_norm: float = 1.0, noise_multiplier: float = 1.0, noise_seed: int | None = None, allow_untracked: bool = False,
        per_tuple_mode: str = "auto", chunk_size: int | None = None, diagnostics: bool = False,
    ) -> None:
        super().__init__()
        check_choice("mode", mode, MODES)
        self.grad_sampler = GradSampler(per_tuple_mode, chunk_size)  # grad_sample's one entry point (validates both)
        non_negative("adversarial (λ)", adversarial)
        if edge_labelled_negatives and mode != "paper":
            raise ValueError("`edge_labelled_negatives` reads the training edges outside each tuple: paper mode only.")
        if mode == "paper":
            rank_zero_warn(ADVSGM_PAPER_WARNING, category=UserWarning)
            clipping, noise_multiplier = "none", 0.0  # nothing is accounted: the NoiseSpec names mechanism "none"
        check_choice("clipping", clipping, ("standard", "none"),
                     " 'none' is the non-private baseline.")
        self._setup_privacy(
            clipping=clipping, accounting=accounting, clip_norm=clip_norm,
            noise_multiplier=noise_multiplier, noise_seed=noise_seed, optimizer=optimizer, lr=lr, momentum=momentum,
            diagnostics=diagnostics,
        )
        if isinstance(encoder, Mapping):
            encoder = build_encoder(encoder)
        if encoder is not None and not isinstance(encoder, NodeIdEmbedding):
            raise TypeError(f"`encoder` must be a NodeIdEmbedding (two id tables), got {type(encoder).__name__}.")
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder: NodeIdEmbedding | None = None
        self.generator: FakeNeighbours | None = None
        if encoder is not None or num_nodes is not None:
            self._build(encoder if encoder is not None else NodeIdEmbedding(int(num_nodes), dim, init_std=init_std))
        self.val_auc, self.test_auc = BinaryAUROC(), BinaryAUROC()
        #: The paper's nominal claim for this run (set by :class:`~lightning_dprel.methods.advsgm.paper.PaperStop`).
        self.paper_claim: dict[str, Any] = {}
        self._edge_keys: Tensor | None = None  # sorted training-edge keys (edge_labelled_negatives only)

    def _build(self, encoder: NodeIdEmbedding) -> None:
        self.encoder = encoder
        n, r = encoder.node_vectors.num_embeddings, encoder.dim
        self.hparams["encoder"] = encoder_spec(encoder)
        self.hparams["num_nodes"] = n
        self._hparams_initial = copy.deepcopy(self._hparams)
        hp = self.hparams
        if hp.mode == "paper" or hp.adversarial > 0:
            self.generator = FakeNeighbours(n, r, noise_std=hp.generator_noise, lr=hp.generator_lr)

    # --- the facts -----------------------------------------------------------------------------------
    @property
    def node_vectors(self) -> Tensor:
        """W_in ``[n, r]``: the embeddings used downstream (the paper's v_i)."""
        return self.encoder.node_vectors.weight.detach()

    @property
    def context_vectors(self) -> Tensor:
        """W_out ``[n, r]`` (the paper's c_i)."""
        return self.encoder.context_vectors.weight.detach()

    def forward(self, node_id: Tensor) -> Tensor:
        """Node vectors v of ``node_id``."""
        return self.encoder.node_vectors(node_id.long())

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.encoder is None:
            n = getattr(dm, "num_nodes", None)
            if n is None:
                raise ValueError("DPSkipGramModule needs `num_nodes` (or `encoder`), or a SkipGramDataModule to read n from.")
            hp = self.hparams
            self._build(NodeIdEmbedding(int(n), hp.dim, init_std=hp.init_std))
        if dm is not None and getattr(dm, "num_nodes", self.encoder.node_vectors.num_embeddings) != self.encoder.node_vectors.num_embeddings:
            raise ValueError(
                f"The datamodule has {dm.num_nodes} node ids but the tables have {self.encoder.node_vectors.num_embeddings} rows."
            )
        if self.hparams.get("edge_labelled_negatives") and stage == "fit":
            if getattr(dm, "train_edges", None) is None:
                raise ValueError("`edge_labelled_negatives` needs a datamodule with `train_edges` (AdvSGMPaperDataModule).")
            self._edge_keys = _pair_keys(dm.train_edges.long().cpu(), self.encoder.node_vectors.num_embeddings)

    def configure_optimizers(self):
        return self.build_dp_optimizer(trainable_parameters(self.encoder))

    # --- per-tuple gradients -------------------------------------------------------------------------
    def per_tuple(self, batch: TupleBatch, head: Any, args: tuple[Tensor, ...]) -> PerTupleResult:
        """Per-tuple norms and clipped sums of ``head`` over the batch: ghost clipping on the two tables (exact), or vmap."""
        return self.grad_sampler.tuples(self.encoder, tuple_inputs(batch), head, args)

    def _tuple_normal(self, batch: TupleBatch, what: str, std: float = 1.0) -> Tensor:
        """``[B, 2, r]`` keyed normals, one block per tuple of the *global* batch, this rank's rows: each tuple's draw is
        its own (i.i.d. across tuples and ranks), so removing a tuple leaves the others' distribution unchanged."""
        r, total = self.encoder.dim, int(batch.global_size)
        trainer = self._trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return self._keyed_normal(batch, what, (total, 2, r), std)[slice_rows(total, rank, world)]

    def _keyed_normal(self, batch: TupleBatch, what: str, shape: tuple[int, ...], std: float = 1.0) -> Tensor:
        """Randomness of the adversary (not the privacy noise): a child of the keyed noise stream per step."""
        n = 1
        for s in shape:
            n *= s
        return self.noise_source.child("adversary", batch.step, what).normal(n, std).view(shape).to(self.device)

    # --- training ------------------------------------------------------------------------------------
    def training_step(self, batch: TupleBatch, batch_idx: int) -> None:
        if not isinstance(batch, TupleBatch):
            raise TypeError(f"training_step expects a TupleBatch, got {type(batch).__name__}.")
        if self.hparams.mode == "paper":
            return self._paper_step(batch)
        hp, anchor = self.hparams, batch.neg_anchor.long()
        args: tuple[Tensor, ...] = (anchor,)
        if hp.adversarial > 0:
            ids = batch.pos.long().to(self.device)
            args = (anchor, self.generator.fakes(ids, self._tuple_normal(batch, "fakes")))
        result = self.per_tuple(batch, partial(_provable_head, adversarial=float(hp.adversarial)), args)
        self.private_step(result.grads, max_freq=batch.max_freq, batch=batch)
        if hp.adversarial > 0:
            self._fit_generator_released(batch)

    def _fit_generator_released(self, batch: TupleBatch) -> None:
        """Post-processing: the generator learns from the released tables and public ids only (never from E)."""
        hp, n, r = self.hparams, self.encoder.node_vectors.num_embeddings, self.encoder.dim
        with public_update(self):  # reads released values and public ids only: no new release to charge
            for s in range(int(hp.generator_steps)):
                ids = self.noise_source.child("adversary", batch.step, "ids", s).randint(n, int(hp.generator_batch))
                noise = self._keyed_normal(batch, f"generator{s}", (ids.numel(), r))
                self.generator.fit_released(self.node_vectors, self.context_vectors, ids.to(self.device), noise)

    def _paper_step(self, batch: TupleBatch) -> None:
        """Algorithm 3 (the code): a positive update with ξ inside S (Eq. 24), then a negative update; no clipping."""
        hp, anchor = self.hparams, batch.neg_anchor.long()
        ids = batch.pos.long().to(self.device)
        fakes = self.generator.fakes(ids, normalised=True)  # [B, 2, r]: (v'_i, v'_j)
        xi = self._tuple_normal(batch, "xi", std=float(hp.clip_norm) * float(hp.paper_sigma))
        negative = (anchor,) if self._edge_keys is None else (anchor, self._negative_labels(batch))
        for head, args in ((_paper_positive_head, (anchor, fakes, xi)), (_paper_negative_head, negative)):
            result = self.per_tuple(batch, head, args)
            self.private_step(result.grads, max_freq=batch.max_freq, batch=batch)
        if (batch.step + 1) % int(hp.paper_rounds) == 0:  # end of an epoch's n_D rounds: n_G generator steps on E
            for _ in range(int(hp.paper_generator_steps)):
                self.generator.fit_edges(self.node_vectors, self.context_vectors, ids)

    def _pair_key(self, a: Tensor, b: Tensor) -> Tensor:
        n = self.encoder.node_vectors.num_embeddings
        a, b = a.long().cpu(), b.long().cpu()
        return torch.minimum(a, b) * n + torch.maximum(a, b)

    def _negative_labels(self, batch: TupleBatch) -> Tensor:
        """y_j = +1 where the negative pair (w_j, z_j) is a training edge, else −1 (the code's relabelling)."""
        w = torch.where(batch.neg_anchor.bool(), batch.pos[:, 1:2], batch.pos[:, 0:1])
        is_edge = torch.isin(self._pair_key(w.expand_as(batch.neg), batch.neg), self._edge_keys)
        return (is_edge.double() * 2 - 1).to(self.device)

    # --- evaluation: link prediction AUC of v_u·v_v (Section VI) ---------------------------------------
    def _auc_update(self, batch: RankingBatch, metric: BinaryAUROC) -> None:
        if batch.candidates is None:
            raise ValueError("DPSkipGramModule scores held-out edges against random pairs: set the datamodule's `eval_candidates` (e.g. 1).")
        v = self.encoder.node_vectors(batch.node_inputs["node_id"].long().to(self.device))
        q = v[batch.query]
        pos = (q * v[batch.target]).sum(-1)
        neg = (q[:, None, :] * v[batch.candidates[:, 1:]]).sum(-1).flatten()
        scores = torch.cat([pos, neg])
        metric.update(scores, torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]).long())

    def validation_step(self, batch: RankingBatch, batch_idx: int) -> None:
        self._auc_update(batch, self.val_auc)
        self.log("val_auc", self.val_auc, on_epoch=True, batch_size=batch.size)

    def test_step(self, batch: RankingBatch, batch_idx: int) -> None:
        self._auc_update(batch, self.test_auc)
        self.log("test_auc", self.test_auc, on_epoch=True, batch_size=batch.size)

    def privacy_claims(self) -> dict[str, Any]:
        """What the paper would claim beside what holds (for ``privacy.json``): the paper mode's labels."""
        if self.hparams.mode != "paper":
            return {}
        return {"mode": "paper", "provable_epsilon": "inf", "warning": ADVSGM_PAPER_WARNING, **self.paper_claim}
