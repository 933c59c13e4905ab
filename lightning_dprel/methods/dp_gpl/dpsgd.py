"""DP-SGD prompt tuning (Abadi et al. 2016, Alg. 1): DP-GPL's baseline at equal ε on the same labelled private nodes.

Each private labelled node v is one example, its own graph G[V_pub ∪ {v}] (``PromptDataModule(view="public")``), so no
other example sees it: removing v removes one per-example gradient, clipped to C (mechanism ``labelled_node_gaussian``,
the Poisson-subsampled Gaussian). Steps Poisson-sample the m examples at rate γ = b/m from a secret keyed stream; the
frozen Φ's prompt and answer head get clip → sum → N(0, σ²C²I) → ÷ b → Adam / SGD through the library's DPOptimizer.
Per-example gradients come from one forward and one backward: B stacked copies of the shared prompt and head, example
b routed to copy b (``owner``), so the gradient of copy b is example b's own. m is treated as public (as in Abadi et al.).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.data import DataLoader

from lightning_dprel.core.batch import ExampleBatch
from lightning_dprel.core.checks import check_choice, positive_finite
from lightning_dprel.core.datamodule import StepStream, SteppedDataModule
from lightning_dprel.core.private_module import PrivateModule
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.grad_sample.base import MaterializedGrads, trainable_parameters
from lightning_dprel.grad_sample.dispatch import GradSampler
from lightning_dprel.methods.dp_gpl.accounting import LABELLED_NODE
from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule
from lightning_dprel.methods.dp_gpl.egonets import EgoBatch
from lightning_dprel.methods.dp_gpl.pretrain import GraphEncoder, freeze, pretrain
from lightning_dprel.methods.dp_gpl.prompts import PROMPTS
from lightning_dprel.methods.dp_gpl.tuning import PromptedModel, TuningConfig

__all__ = ["PrivateNodeExamples", "DPPromptTuning", "dpsgd_baseline_accuracy"]


class PrivateNodeExamples(SteppedDataModule):
    """Poisson-sampled per-node examples of a :class:`PromptDataModule`'s private labelled nodes (Abadi et al. 2016, Alg. 1).

    Args:
        dm: the DP-GPL datamodule (``view="public"``); its private nodes are the examples, its val/test loaders are reused.
        expected_batch_size: b; each step keeps each of the m examples with probability γ = b/m (b ≤ m).
        sample_seed: None (default, secret keyed sampling); an int makes the batches reproducible (voids the guarantee; warns).
    """

    privacy_unit = LABELLED_NODE.name

    def __init__(self, dm: PromptDataModule, *, expected_batch_size: float = 32.0, sample_seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(dm, PromptDataModule):
            raise TypeError(f"`dm` must be a PromptDataModule, got {type(dm).__name__}.")
        if dm.view != "public":
            raise ValueError(f"DP-SGD per-node examples need view='public' (G[V_pub ∪ {{v}}]); with view={dm.view!r} "
                             "a private node enters other examples and one node is not one example.")
        positive_finite("expected_batch_size", expected_batch_size)
        if sample_seed is not None:
            self.warn_seeded(f"PrivateNodeExamples(sample_seed={sample_seed})")
        self.dm, self.b = dm, float(expected_batch_size)
        self.stream = KeyedStream("dp-gpl/dpsgd-batches", seed=sample_seed, _warn=False)
        self.examples: EgoBatch | None = None
        self._step = 0

    def setup(self, stage: str | None = None) -> None:
        if self.examples is not None:
            return
        self.dm.setup(stage)
        examples, labels, _ = self.dm.teacher_examples()  # the teacher column is DP-GPL's, not ours
        if self.b > examples.size:
            raise ValueError(f"`expected_batch_size` = {self.b:g} exceeds the {examples.size} private labelled nodes.")
        self.examples, self.labels = examples, labels

    @property
    def data(self) -> Any:
        return self.dm.data

    @property
    def num_examples(self) -> int:
        self.setup("fit")
        return self.examples.size

    @property
    def sampling_spec(self) -> SamplingSpec:
        """m labelled nodes, one example each (K = 1, k = 0), rate γ = b/m, unit ``labelled_node``."""
        m = self.num_examples
        q = self.b / m
        return SamplingSpec(population=m, sampling_rate=q, expected_batch_size=q * m,
                            steps_per_epoch=max(1, math.ceil(1.0 / q)), privacy_unit=self.privacy_unit, num_units=m)

    def sampled(self, step: int) -> Tensor:
        """The examples of global step ``step``: each kept with probability γ (Poisson, keyed stream)."""
        m = self.num_examples
        return (self.stream.child(step, "nodes").uniform(m) < self.b / m).nonzero().view(-1)

    def next_batch(self) -> ExampleBatch:
        step, self._step = self._step, self._step + 1
        idx = torch.as_tensor(self.rank_share(self.sampled(step).tolist()), dtype=torch.long)  # sums are all-reduced
        return ExampleBatch(examples=self.examples.select(idx), labels=self.labels[idx],
                            expected_batch_size=self.sampling_spec.expected_batch_size, step=step)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        return DataLoader(StepStream(self), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self.dm.val_dataloader()

    def test_dataloader(self) -> DataLoader:
        return self.dm.test_dataloader()


class DPPromptTuning(PrivateModule):
    """DP-SGD / DP-Adam on one prompt and answer head over a frozen Φ (Abadi et al. 2016, Alg. 1; per-node examples).

    Args:
        encoder: the frozen pre-trained Φ (a :class:`GraphEncoder`); None: built and pre-trained on ``dm.public_graph()``
            in ``setup`` (``hidden_dim``, ``conv``, ``pretraining``, ``pretrain_epochs``, ``pretrain_lr``).
        prompt, num_basis: the prompt (``gpf`` / ``gpf_plus``).
        clipping: ``"standard"`` (each node's gradient clipped to C) or ``"none"`` (non-private, σ = 0).
        clip_norm, noise_multiplier: C and σ (a PrivacyCallback with ``calibrate=True`` sets σ).
        lr, weight_decay, optimizer, momentum: the wrapped optimizer.
        seed: the prompt's and head's initialisation (and pre-training); public.
        noise_seed: None (secret keyed noise) or an int (reproducible; voids the guarantee; warns).
    """

    def __init__(self, encoder: nn.Module | None = None, *, prompt: str = "gpf_plus", num_basis: int = 5, hidden_dim: int = 128,
                 conv: str = "gcn", pretraining: str = "dgi", pretrain_epochs: int = 100, pretrain_lr: float = 1e-3,
                 clipping: str = "standard", clip_norm: float = 1.0, noise_multiplier: float = 1.0, lr: float = 0.01,
                 weight_decay: float = 0.0, optimizer: str = "adam", momentum: float = 0.0, seed: int = 0,
                 noise_seed: int | None = None, allow_untracked: bool = False) -> None:
        super().__init__()
        if encoder is not None and not (isinstance(encoder, nn.Module) and hasattr(encoder, "in_dim") and hasattr(encoder, "out_dim")):
            raise TypeError(f"`encoder` must be a GraphEncoder-like nn.Module (in_dim, out_dim) or None, got {type(encoder).__name__}.")
        check_choice("prompt", prompt, sorted(PROMPTS))
        check_choice("clipping", clipping, ("standard", "none"),
                     " DP-SGD clips each node's gradient to C ('none': no privacy).")
        self._setup_privacy(clipping=clipping, accounting="labelled_node_gaussian", clip_norm=clip_norm,
                            noise_multiplier=noise_multiplier, noise_seed=noise_seed, optimizer=optimizer, lr=lr, momentum=momentum, diagnostics=False)
        self.save_hyperparameters(ignore=["encoder"])
        self.cfg = TuningConfig(prompt, 0, lr, num_basis)
        self.grad_sampler = GradSampler()  # grad_sample's one entry point (here: stacked copies, one backward)
        self.model: PromptedModel | None = None
        self.num_classes: int | None = None
        if encoder is not None:
            self.encoder = freeze(encoder)

    # --- Φ, the prompt and its head -----------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        dm = self.trainer.datamodule
        if not isinstance(dm, PrivateNodeExamples):
            raise TypeError(f"DPPromptTuning needs a PrivateNodeExamples datamodule, got {type(dm).__name__}.")
        dm.setup(stage)
        self.build(dm.dm)

    def build(self, dm: PromptDataModule) -> PromptedModel:
        """Φ (pre-trained on G_pub unless given) and the shared prompt and head, from public data only (once)."""
        if self.model is None:
            hp = self.hparams
            if not hasattr(self, "encoder"):
                x_pub, ei_pub = dm.public_graph()
                enc = GraphEncoder(dm.num_features, hp.hidden_dim, num_layers=dm.hops, conv=hp.conv)
                self.encoder = pretrain(enc, x_pub, ei_pub, method=hp.pretraining, epochs=hp.pretrain_epochs,
                                        lr=hp.pretrain_lr, seed=hp.seed)
            if self.encoder.in_dim != dm.num_features:
                raise ValueError(f"The encoder takes {self.encoder.in_dim} features, the graph has {dm.num_features}.")
            with torch.random.fork_rng():
                torch.manual_seed(int(hp.seed))
                self.model = PromptedModel(self.encoder, dm.num_classes, self.cfg)
            self.model.to(dtype=next(self.encoder.parameters()).dtype)
            self.num_classes = dm.num_classes
        return self.model

    def configure_optimizers(self):
        return self.build_dp_optimizer(trainable_parameters(self.model))

    def forward(self, x: Tensor, examples: EgoBatch) -> Tensor:
        return self.model(x, examples)

    # --- DP-SGD -----------------------------------------------------------------------------------------
    def per_example(self, x: Tensor, examples: EgoBatch, labels: Tensor) -> MaterializedGrads:
        """name → ``[B, *shape]``: each example's gradient of its cross-entropy, from B stacked copies of the shared
        prompt and head (copy b used by example b only), one forward and one backward."""
        owner = torch.arange(examples.size, device=labels.device)  # example b → copy b

        def losses_of(copies: dict[str, Tensor]) -> Tensor:
            return F.cross_entropy(functional_call(self.model, copies, (x, examples, owner)), labels, reduction="none")

        return self.grad_sampler.stacked(trainable_parameters(self.model), losses_of, examples.size).grads

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._features()  # the data's x converted before training: a cache filled mid-fit reads as a moved attribute

    def _features(self) -> Tensor:
        """The datamodule's x on this module's device and dtype, converted once (not on every step)."""
        x, dtype = self.trainer.datamodule.data.x, next(self.encoder.parameters()).dtype
        cached = getattr(self, "_x_cache", None)
        if cached is None or cached[0] is not x or cached[1] != (self.device, dtype):
            self._x_cache = cached = (x, (self.device, dtype), x.to(self.device, dtype))
        return cached[2]

    def training_step(self, batch: ExampleBatch, batch_idx: int) -> None:
        if not isinstance(batch, ExampleBatch):
            raise TypeError(f"training_step expects an ExampleBatch (from PrivateNodeExamples), got {type(batch).__name__}.")
        x = self._features()
        grads = self.per_example(x, batch.examples, batch.labels.to(self.device))
        self.private_step(grads, max_freq=None, batch=batch)

    def _accuracy(self, batch, name: str) -> float:
        examples, labels = batch
        x = self._features()
        acc = float((self.model(x, examples).argmax(-1) == labels.to(self.device)).float().mean()) if examples.size else 0.0
        self.log(name, acc, batch_size=max(1, examples.size), prog_bar=True)
        return acc

    def validation_step(self, batch, batch_idx: int) -> float:
        return self._accuracy(batch, "val_acc")

    def test_step(self, batch, batch_idx: int) -> float:
        return self._accuracy(batch, "test_acc")



def dpsgd_baseline_accuracy(dm: PromptDataModule, encoder: nn.Module, *, target_epsilon: float, delta: float, steps: int,
                            expected_batch_size: float, lr: float, clip_norm: float, seed: int, prompt: str = "gpf_plus",
                            accelerator: str = "cpu") -> dict[str, float]:
    """Fit DP-SGD prompt tuning for ``steps`` steps with σ calibrated to (``target_epsilon``, ``delta``), then test on G_pub.

    Returns ``test_acc``, ``epsilon`` (the ledger's, ≤ target), ``sigma`` and ``steps`` (private steps taken). Sampling and
    noise are secret; ``seed`` fixes the prompt's initialisation only.
    """
    from pytorch_lightning import Trainer

    from lightning_dprel.callbacks import PrivacyCallback

    data = PrivateNodeExamples(dm, expected_batch_size=expected_batch_size)
    module = DPPromptTuning(encoder, prompt=prompt, clip_norm=clip_norm, lr=lr, seed=seed)
    cb = PrivacyCallback(target_epsilon=target_epsilon, delta=delta, calibrate=True)
    trainer = Trainer(max_steps=int(steps), max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator=accelerator, devices=1, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[cb])
    trainer.fit(module, datamodule=data)
    acc = trainer.test(module, datamodule=data, verbose=False)[0]["test_acc"]
    return {"test_acc": float(acc), "epsilon": float(module.privacy_ledger.epsilon(delta)),
            "sigma": float(module.noise_spec.noise_multiplier), "steps": int(module.privacy_ledger.private_steps)}
