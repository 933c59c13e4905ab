"""Public data in the loop: warm start on the public graph, and the public gradient subspace (issue 24).

Both read ``trainer.datamodule.public`` (:class:`~lightning_dprel.datamodules.edge_tuples.public.PublicRelations`)
and nothing private, so neither is charged: the warm start is pre-training (it changes θ_0, which every private
step then starts from), and the subspace is a function of public tuples at parameters already released. Each
records what it did in ``module.public_data``, which ``privacy.json`` reports.

References:
    Yu, Zhang, Chen, Yin, Liu. Gradient Embedding Perturbation (ICLR 2021), Algorithm 1.
    Kerrigan, Slack, Tuyls. Differentially Private Language Models Benefit from Public Pre-training (2020).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks.callback import Callback
from pytorch_lightning.utilities import move_data_to_device

from lightning_dprel.core.checks import check_int, positive_finite
from lightning_dprel.core.update_watch import public_update
from lightning_dprel.core.subspace import GradientSubspace
from lightning_dprel.progress import ProgressLog

__all__ = ["PublicWarmStart", "PublicGradientSubspace", "PublicInterleave"]


def _public(trainer: pl.Trainer, who: str) -> Any:
    public = getattr(trainer.datamodule, "public", None)
    if public is None:
        raise ValueError(f"{who} needs public data: pass `public=` to the datamodule (e.g. RelationalDataModule(..., public=WordNetLarge())).")
    return public


def _neg_per_pos(trainer: pl.Trainer) -> int:
    return int(getattr(trainer.datamodule, "neg_per_pos", 1))


class PublicWarmStart(Callback):
    """Train the module non-privately on the public graph before the first private step (public pre-training).

    Plain Adam on the mean public tuple loss for ``steps`` steps of ``batch_size`` public relations; its optimizer
    is discarded afterwards (the private run's optimizer starts fresh). Runs once: not again on a resumed fit. While
    it runs it logs its progress (:class:`~lightning_dprel.progress.ProgressLog`: a line at every tenth of the steps
    and at least every 30 s, with the time left).

    Args:
        steps: public training steps (0 disables it).
        lr: Adam's learning rate.
        batch_size: public relations per step.
        progress: log progress lines (default True).
    """

    def __init__(self, steps: int = 300, lr: float = 3e-3, batch_size: int = 1024, progress: bool = True) -> None:
        check_int("steps", steps, 0)
        positive_finite("lr", lr)
        check_int("batch_size", batch_size, 1)
        self.steps, self.lr, self.batch_size, self.progress = steps, float(lr), batch_size, bool(progress)
        self.done = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.done or self.steps == 0 or int(trainer.global_step) > 0:
            return
        public = _public(trainer, "PublicWarmStart")
        for cb in trainer.callbacks:  # e.g. ValidationSelection keeps the untouched base model as a candidate
            hook = getattr(cb, "on_before_public_warm_start", None)
            if callable(hook):
                hook(trainer, pl_module)
        log = ProgressLog(f"PublicWarmStart on {public.name} (public, not charged)", self.steps, unit="non-private steps",
                          every=30.0, fraction=0.1, enabled=self.progress)
        warm_start(pl_module, public, steps=self.steps, lr=self.lr, batch_size=self.batch_size,
                   neg_per_pos=_neg_per_pos(trainer), directed=bool(getattr(trainer.datamodule, "directed", True)), log=log)
        log.close()
        record_public(pl_module, "warm_start", {"steps": self.steps, "lr": self.lr, "batch_size": self.batch_size})
        self.done = True

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = bool(state_dict.get("done", False))


class PublicInterleave(Callback):
    """After every ``every_n_steps`` private steps, take one non-private step on a public batch (its own Adam, kept
    across steps), so that fine-tuning keeps learning from the public graph while the private steps add what it lacks.

    Args:
        every_n_steps: one public step per this many private steps.
        lr: the public steps' Adam learning rate.
        batch_size: public relations per step.
    """

    def __init__(self, every_n_steps: int = 1, lr: float = 1e-3, batch_size: int = 1024) -> None:
        check_int("every_n_steps", every_n_steps, 1)
        positive_finite("lr", lr)
        check_int("batch_size", batch_size, 1)
        self.every_n_steps, self.lr, self.batch_size = every_n_steps, float(lr), batch_size
        self._opt: torch.optim.Optimizer | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step % self.every_n_steps:
            return
        public = _public(trainer, "PublicInterleave")
        if self._opt is None:
            self._opt = torch.optim.Adam([p for p in pl_module.parameters() if p.requires_grad], lr=self.lr)
        warm_start(pl_module, public, steps=1, lr=self.lr, batch_size=self.batch_size, neg_per_pos=_neg_per_pos(trainer),
                   directed=bool(getattr(trainer.datamodule, "directed", True)), first_step=2_000_000 + step, optimizer=self._opt)
        record_public(pl_module, "interleave", {"every_n_steps": self.every_n_steps, "lr": self.lr, "batch_size": self.batch_size})


def record_public(module: Any, key: str, value: Any) -> None:
    """``module.public_data[key] = value``: what public data shaped the model, for ``privacy.json`` (not a release); a
    plain module made private keeps it with what its data declared public."""
    from lightning_dprel.core.attached import record_attached_public
    from lightning_dprel.core.privacy_layer import PrivacyLayer

    if not isinstance(module, PrivacyLayer):  # a plain module: its attached layer's record
        return record_attached_public(module, key, value)
    with public_update(module):
        module.public_data[key] = value


def warm_start(module: Any, public: Any, *, steps: int, lr: float, batch_size: int, neg_per_pos: int, directed: bool = True,
               first_step: int = 0, optimizer: torch.optim.Optimizer | None = None, log: ProgressLog | None = None) -> None:
    """``steps`` steps of Adam on ``module.public_loss`` over public batches ``first_step, first_step + 1, …`` (each
    reported to ``log``, if given)."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = optimizer if optimizer is not None else torch.optim.Adam(params, lr=lr)
    device = params[0].device if params else torch.device("cpu")
    with torch.enable_grad(), public_update(module):  # public data only: the update watch takes it as its base
        for step in range(first_step, first_step + steps):
            batch = move_data_to_device(public.sample(batch_size, neg_per_pos=neg_per_pos, step=step, directed=directed), device)
            opt.zero_grad(set_to_none=True)
            module.public_loss(batch).backward()
            opt.step()
            if log is not None:
                log.update(step - first_step + 1)
    for p in params:
        p.grad = None


class PublicGradientSubspace(Callback):
    """Every ``every_n_steps`` steps, estimate the top-k gradient subspace from public tuples at the current parameters
    and have the DP optimizer clip and noise only the k projected coordinates (GEP, :mod:`~lightning_dprel.core.subspace`).

    Args:
        k: the subspace dimension (the number of noised coordinates).
        every_n_steps: refresh period (the basis is also computed before the first step, and again on resume).
        num_tuples: public relations per estimate (at least ``k``).
    """

    def __init__(self, k: int = 32, every_n_steps: int = 50, num_tuples: int = 1024) -> None:
        check_int("k", k, 1)
        check_int("every_n_steps", every_n_steps, 1)
        check_int("num_tuples", num_tuples, 1)
        if num_tuples < k:
            raise ValueError(f"`num_tuples` ({num_tuples}) must be >= k ({k}): k directions need at least k public gradients.")
        self.k, self.every_n_steps, self.num_tuples = k, every_n_steps, num_tuples
        self.refreshes = 0
        self._refreshed_at: int | None = None  # the step of the subspace in use (a resume at a refresh step fits once)

    def _refresh(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        public = _public(trainer, "PublicGradientSubspace")
        step = int(trainer.global_step)
        if step == self._refreshed_at:
            return
        batch = public.sample(self.num_tuples, neg_per_pos=_neg_per_pos(trainer), step=1_000_000 + step,
                              directed=bool(getattr(trainer.datamodule, "directed", True)))
        device = next(pl_module.parameters()).device
        grads = pl_module.public_tuple_grads(move_data_to_device(batch, device))
        subspace = GradientSubspace.fit(grads, self.k)
        dp = _dp_optimizer(trainer)
        dp.set_subspace(subspace)
        self.refreshes += 1
        self._refreshed_at = step
        record_public(pl_module, "subspace", {"k": self.k, "every_n_steps": self.every_n_steps, "num_tuples": self.num_tuples})

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._refresh(trainer, pl_module)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if int(trainer.global_step) % self.every_n_steps == 0:
            self._refresh(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _dp_optimizer(trainer).set_subspace(None)
        self._refreshed_at = None


def _dp_optimizer(trainer: pl.Trainer) -> Any:
    from lightning_dprel.core.optim import DPOptimizer

    for opt in trainer.optimizers:
        dp = getattr(opt, "optimizer", opt)
        if isinstance(dp, DPOptimizer):
            return dp
    raise ValueError("PublicGradientSubspace needs a module that trains with the library's DPOptimizer.")
