"""Small private Lightning classes for tests and examples (as Lightning's ``demos/boring_classes.py``).

:func:`quiet_trainer` is a CPU Trainer that prints and saves nothing; :class:`BoringPrivateModule` is a one-weight
PrivateModule taking one DP optimizer step per training batch; :class:`SpecDataModule` exposes a SamplingSpec (from
:func:`~lightning_dprel.demos.specs.make_spec`) after setup, or none; :func:`tiny_relational_dm` and
:func:`tiny_prompt_dm` are a RelationalDataModule and a PromptDataModule on small seeded graphs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprel.core.private_module import PrivateModule
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.core.update_watch import public_update
from lightning_dprel.demos.specs import make_spec

__all__ = [
    "quiet_trainer", "make_spec", "BoringPrivateModule", "SpecDataModule", "tiny_relational_dm", "tiny_prompt_dm",
    "InterruptAt", "rank_zero_messages",
]


def quiet_trainer(callbacks=(), **kwargs) -> pl.Trainer:
    """A one-device CPU Trainer with no logger, progress bar, model summary, checkpoints or validation (sanity steps
    included); ``kwargs`` override any of these (``limit_val_batches=1.0`` to validate) and set the limits."""
    options = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0)
    return pl.Trainer(callbacks=list(callbacks), **{**options, **kwargs})


class BoringPrivateModule(PrivateModule):
    """A one-weight PrivateModule: one DP optimizer step per training batch on the loss (w·x + c)², per-example
    gradients in closed form (a cheap stand-in for a real model in callback tests)."""

    def __init__(self, *, sigma=1.0, clipping="freq", accounting="corrected", clip_norm=1.0, lr=0.01, optimizer="sgd"):
        super().__init__()
        self._setup_privacy(clipping=clipping, accounting=accounting if clipping == "freq" else None, clip_norm=clip_norm,
                            noise_multiplier=sigma, noise_seed=None, optimizer="sgd", lr=0.01, momentum=0.0,
                            diagnostics=False)
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(1, 1)
        self.optimizer_steps = 0

    @property
    def sigma(self) -> float:
        return self.noise_spec.noise_multiplier

    def training_step(self, batch, batch_idx):
        x = batch[0].view(-1).float()
        r = 2.0 * (self.layer.weight.view(()) * x + self.layer.bias.view(()))  # d(w·x + c)²/d(w·x + c)
        grads = {"weight": (r * x).detach().view(-1, 1, 1), "bias": r.detach().view(-1, 1)}
        self.private_step(grads, max_freq=torch.ones(x.numel()))
        with public_update(self):  # a count of steps is public
            self.optimizer_steps += 1

    def configure_optimizers(self):
        return self.build_dp_optimizer(dict(self.layer.named_parameters()))


class SpecDataModule(pl.LightningDataModule):
    """Exposes ``sampling_spec`` after setup (None: a datamodule without the fact)."""

    def __init__(self, spec: SamplingSpec | None, *, expose: bool = True):
        super().__init__()
        self.spec, self.expose = spec, expose

    def setup(self, stage: str) -> None:
        if self.expose:
            self.sampling_spec = self.spec

    def train_dataloader(self):
        n = self.spec.steps_per_epoch if self.spec is not None else 8
        return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=1)


def tiny_relational_dm(source=None, *, stage: str | None = "fit", **kwargs):
    """A RelationalDataModule on ``random_feature_graph(200, 600, seed=1)`` (or ``source``) with b = 8, k = 2, public seed
    3 and 4 steps an epoch (``kwargs`` override), set up for ``stage`` (None: not set up)."""
    from lightning_dprel.datamodules.datasets.generators import random_feature_graph
    from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule

    options = {"expected_batch_size": 8, "neg_per_pos": 2, "seed": 3, "steps_per_epoch": 4, **kwargs}
    dm = RelationalDataModule(random_feature_graph(200, 600, seed=1) if source is None else source, **options)
    if stage is not None:
        dm.setup(stage)
    return dm


def tiny_prompt_dm(source=None, **kwargs):
    """A PromptDataModule on ``SyntheticNodes(300, 3, dim=8, avg_degree=6.0, feature_noise=1.0, seed=2)`` (or
    ``source``) with 8 teachers, 30 queries and fanout 5 (``kwargs`` override); not set up."""
    from lightning_dprel.datamodules.datasets.nodes import SyntheticNodes
    from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule

    source = SyntheticNodes(300, 3, dim=8, avg_degree=6.0, feature_noise=1.0, seed=2) if source is None else source
    return PromptDataModule(source, **{"num_teachers": 8, "num_queries": 30, "fanout": 5, **kwargs})


class InterruptAt(pl.Callback):
    """Presses Ctrl-C (raises ``KeyboardInterrupt``) after training step ``step``, once: a ``flag_file`` remembers it."""

    def __init__(self, step: int, flag_file: str) -> None:
        self.step, self.flag_file = int(step), flag_file

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import os

        if trainer.global_step >= self.step and not os.path.exists(self.flag_file):
            open(self.flag_file, "w").close()
            raise KeyboardInterrupt


class _Collect(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.INFO)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def rank_zero_messages() -> Iterator[list[str]]:
    """The lines Lightning's rank-zero logger says (INFO and up) inside the block, where the library logs progress."""
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    messages: list[str] = []
    handler, level = _Collect(messages), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
