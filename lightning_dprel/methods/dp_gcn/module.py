"""DP-GCN (Igamberdiev & Habernal 2022): node classification with per-subgraph clipping and one noise draw per step.

Each sampled subgraph example (an :class:`~lightning_dprel.core.batch.ExampleBatch`'s) gives one gradient — the mean
cross-entropy of its nodes through the GNN on the example's own edges — which the shared
:class:`~lightning_dprel.core.optim.DPOptimizer` clips to C (standard clipping), sums, noises once with N(0, σ²C²I), divides
by b = q·s and applies with Adam / SGD (DP-Adam / DP-SGD). Accounting (``accounting=``): ``"subgraph_replace"``
(default; provable, node-level, replace-one) or ``"gcn_paper"`` (the published add/remove reading; does not hold).
The privacy unit is one node with its features, label and edges (node-level DP).

Validation / test accuracy and macro-F1 are computed on the whole graph (outside the guarantee).

References:
    Igamberdiev, Habernal. Privacy-Preserving Graph Convolutional Networks for Text Classification, LREC 2022
    (Section 4: random graph splits; Appendix E: moments accountant). Kipf & Welling 2017 (GCN).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from lightning_dprel.core.batch import ExampleBatch
from lightning_dprel.core.checks import check_choice
from lightning_dprel.methods.dp_gcn.batch import NodeEvalBatch
from lightning_dprel.encoders import build_encoder, encoder_spec
from lightning_dprel.grad_sample.base import MaterializedGrads, trainable_parameters
from lightning_dprel.grad_sample.dispatch import GradSampler
from lightning_dprel.core.private_module import PrivateModule

__all__ = ["DPNodeModule"]


class DPNodeModule(PrivateModule):
    """DP-SGD / DP-Adam for a GNN node classifier on subgraph examples.

    Args:
        encoder: a node classifier ``(x, edge_index) → logits`` (e.g. :class:`~lightning_dprel.methods.dp_gcn.gnn.GNNClassifier`), or
            its spec ``{"class_path", "init_args"}``.
        clipping: ``"standard"`` (per-subgraph clipping to C) or ``"none"`` (non-private, σ = 0).
        accounting: ``"subgraph_replace"`` (provable) or ``"gcn_paper"`` (as published, does not hold).
        clip_norm: C.
        noise_multiplier: σ (a PrivacyCallback may calibrate it).
        lr, weight_decay, optimizer, momentum: the wrapped optimizer (``"adam"`` = DP-Adam, ``"sgd"`` = DP-SGD).
        noise_seed: None (default, secret keyed noise) or a seed (reproducible; voids the guarantee; warns).
        allow_untracked: train privately without a PrivacyCallback (steps still recorded in the ledger).
    """

    report_metrics = (("test_acc", "accuracy"), ("test_macro_f1", "macro-F1"))
    report_title = "Node classification on"
    report_rows = ("untrained (random init)", "trained")

    def __init__(self, encoder: nn.Module, *, clipping: str = "standard", accounting: str = "subgraph_replace",
                 clip_norm: float = 1.0, noise_multiplier: float = 1.0, lr: float = 0.01, weight_decay: float = 0.0,
                 optimizer: str = "adam", momentum: float = 0.0, noise_seed: int | None = None,
                 allow_untracked: bool = False) -> None:
        super().__init__()
        if isinstance(encoder, Mapping):
            encoder = build_encoder(encoder)
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"`encoder` must be a torch.nn.Module, got {type(encoder).__name__}.")
        check_choice("clipping", clipping, ("standard", "none"),
                     " DP-GCN clips each subgraph's gradient to C ('none': no privacy).")
        self._setup_privacy(clipping=clipping, accounting=accounting, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                            noise_seed=noise_seed, optimizer=optimizer, lr=lr, momentum=momentum, diagnostics=False)
        self.encoder = encoder
        self.save_hyperparameters(ignore=["encoder"])
        spec = encoder_spec(encoder)
        if spec is not None:
            self.hparams["encoder"] = spec
            self._hparams_initial = copy.deepcopy(self._hparams)
        self.grad_sampler = GradSampler()  # grad_sample's one entry point (here: one backward per subgraph)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.encoder(x, edge_index)

    def configure_optimizers(self):
        return self.build_dp_optimizer(trainable_parameters(self.encoder))

    def example_loss(self, x: Tensor, edge_index: Tensor, y: Tensor, mask: Tensor) -> Tensor | None:
        """One example's loss: the mean cross-entropy of its masked nodes on its own graph (None: no node to fit)."""
        x, edge_index, y, mask = (t.to(self.device) for t in (x, edge_index, y, mask))
        if not bool(mask.any()):
            return None
        return F.cross_entropy(self.encoder(x, edge_index)[mask], y[mask])

    def per_example(self, batch: ExampleBatch) -> MaterializedGrads:
        """Each example's gradient of its nodes' mean cross-entropy (its own forward pass): name → ``[B, *shape]``."""
        losses = (self.example_loss(*example) for example in batch.examples)  # one example's graph alive at a time
        return self.grad_sampler.loop(trainable_parameters(self.encoder), losses).grads

    def training_step(self, batch: ExampleBatch, batch_idx: int) -> None:
        if not isinstance(batch, ExampleBatch):
            raise TypeError(
                f"training_step expects an ExampleBatch (from NodeSplitDataModule without as_pyg_batches), got "
                f"{type(batch).__name__}. as_pyg_batches=True is for your own LightningModule with PrivacyCallback."
            )
        self.private_step(self.per_example(batch), max_freq=None, batch=batch)

    def _evaluate(self, batch: NodeEvalBatch, prefix: str) -> dict[str, float]:
        logits = self.encoder(batch.x.to(self.device), batch.edge_index.to(self.device))
        mask = batch.mask.to(self.device)
        pred, target = logits[mask].argmax(-1), batch.y.to(self.device)[mask]
        classes = int(logits.shape[-1])
        out = {f"{prefix}_acc": float(multiclass_accuracy(pred, target, num_classes=classes, average="micro")),
               f"{prefix}_macro_f1": float(multiclass_f1_score(pred, target, num_classes=classes, average="macro"))}
        for k, v in out.items():
            self.log(k, v, prog_bar=k.endswith("acc"), batch_size=int(mask.sum()))
        return out

    def validation_step(self, batch: NodeEvalBatch, batch_idx: int) -> dict[str, float]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: NodeEvalBatch, batch_idx: int) -> dict[str, float]:
        return self._evaluate(batch, "test")
