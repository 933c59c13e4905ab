"""Checkpoint selection on public validation data, the untouched base model included as a candidate.

Every iterate θ_0, θ_1, …, θ_T of a private run is already covered by the run's (ε, δ) (DP-SGD's guarantee is
for the whole sequence of noised updates). Choosing one of them with a score computed on *public* validation
data is post-processing and costs no privacy. θ_0 is the base model, so a run that does not help on
validation returns the base model instead of a worse one. Selecting on the test domain would be a defect:
the datamodule must have a validation graph (``RelationalDataModule.has_validation_graph``). A restored candidate is
recorded in ``module.public_data["selection"]`` (step, candidate, monitor, score, the validation graph), so
``privacy.json`` and the checkpoint say which iterate was released and on what it was chosen.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks.callback import Callback
from pytorch_lightning.utilities.rank_zero import rank_zero_info

from lightning_dprel.core.checks import check_choice, check_int
from lightning_dprel.callbacks.public import record_public
from lightning_dprel.core.update_watch import public_update

__all__ = ["ValidationSelection"]

_MONITORS = ("mrr", "prec1", "map", "recall@20")


def validation_graph_name(dm: Any) -> str:
    """The graph a RelationalDataModule validates on: its ``val_source``, else its source's own validation graph."""
    named = getattr(dm, "validation_name", None)
    if named:
        return str(named)
    val = getattr(dm, "val_source", None)
    return repr(val) if val is not None else f"the validation graph of {getattr(dm, 'source', dm)!r}"


class ValidationSelection(Callback):
    """Evaluate on the validation graph at step 0 and every ``every_n_steps``; keep and restore the best.

    Args:
        every_n_steps: validate after every this many optimizer steps (and always after the last one).
        monitor: ``"mrr"`` (default) or ``"prec1"``; higher is better.
        include_base: the model before the first step is a candidate (default True).
        restore_best: load the best candidate's trainable parameters into the module at the end of fit, and record the
            choice in ``module.public_data["selection"]`` (``privacy.json``).
        require_validation_graph: refuse a datamodule whose validation queries are its test queries.

    Attributes:
        history: ``[{"step", "prec1", "mrr"}]`` for every validation made.
        best_step: the step of the selected candidate (0 = the base model, or the public warm start).
        best_candidate: ``"base"`` (the untouched base model), ``"step 0"`` (after :class:`PublicWarmStart`) or ``"step N"``.
    """

    #: It scores the datamodule's public validation data itself (its ``monitor`` is not a logged training metric).
    monitors_public_data = True

    def __init__(
        self,
        every_n_steps: int = 50,
        monitor: str = "mrr",
        *,
        include_base: bool = True,
        restore_best: bool = True,
        require_validation_graph: bool = True,
    ) -> None:
        check_int("every_n_steps", every_n_steps, 1)
        check_choice("monitor", monitor, _MONITORS)
        self.every_n_steps = every_n_steps
        self.monitor = monitor
        self.include_base = bool(include_base)
        self.restore_best = bool(restore_best)
        self.require_validation_graph = bool(require_validation_graph)
        self.history: list[dict[str, float]] = []
        self.best_step: int | None = None
        self.best_score = float("-inf")
        self._best_state: dict[str, torch.Tensor] | None = None
        self._last_step = -1
        self._warm = False
        #: ``"base"``, ``"step 0"`` (the warm-started model) or ``"step N"``.
        self.best_candidate: str | None = None

    @staticmethod
    def _trainable(pl_module: pl.LightningModule) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in pl_module.named_parameters() if p.requires_grad}

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, log: bool = True, candidate: str | None = None) -> None:
        step = int(trainer.global_step)
        if candidate is None and step == self._last_step:
            return
        if candidate is None:
            self._last_step = step
        with public_update(pl_module):  # the public validation graph (its embeddings may be cached on the module)
            metrics = pl_module.ranking_metrics(trainer.datamodule.val_dataloader())
        if self.monitor not in metrics:
            raise ValueError(f"ValidationSelection(monitor={self.monitor!r}): {type(pl_module).__name__}.ranking_metrics "
                             f"gives {sorted(metrics)}; monitor one of them.")
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        if candidate is not None:
            record["candidate"] = candidate
        self.history.append(record)
        if log:  # Lightning allows no self.log in on_train_end
            pl_module.log(f"selection_val_{self.monitor}", record[self.monitor], batch_size=1)
        if record[self.monitor] > self.best_score:
            self.best_score, self.best_step = record[self.monitor], step
            self.best_candidate = record.get("candidate", "base" if step == 0 and not self._warm else f"step {step}")
            self._best_state = self._trainable(pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if dm is None or not hasattr(pl_module, "ranking_metrics"):
            raise ValueError("ValidationSelection needs a datamodule with val_dataloader() and a module with ranking_metrics().")
        if self.require_validation_graph and not getattr(dm, "has_validation_graph", False):
            raise ValueError(
                "ValidationSelection: the datamodule has no validation graph, so selecting would use the test "
                "queries. Pass `val_source` to RelationalDataModule (or use HPOLarge / WordNetLarge), or set "
                "require_validation_graph=False knowingly."
            )
        if self.include_base and int(trainer.global_step) == 0:
            self._evaluate(trainer, pl_module)

    def on_before_public_warm_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called by :class:`~lightning_dprel.callbacks.PublicWarmStart` before it changes θ_0: the untouched base model
        stays a candidate (``candidate="base"``); step 0 is then the warm-started model."""
        if self.include_base:
            self._evaluate(trainer, pl_module, log=False, candidate="base")
        self._warm = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step > 0 and trainer.global_step % self.every_n_steps == 0:
            self._evaluate(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluate(trainer, pl_module, log=False)  # the last step, when it is not a multiple of every_n_steps
        if self.restore_best and self._best_state is not None:
            params = dict(pl_module.named_parameters())
            with torch.no_grad(), public_update(pl_module):  # a released iterate (or the public base): post-processing
                for name, value in self._best_state.items():
                    params[name].copy_(value.to(params[name].device))
            self._record(trainer, pl_module)
        rank_zero_info(
            f"ValidationSelection: selected {self.best_candidate} (validation {self.monitor} = {self.best_score:.4f}; "
            f"{ {'base': 'the base model', 'step 0': 'the public warm start'}.get(self.best_candidate, 'a fine-tuned iterate')})."
        )

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """What was released: the selected candidate and the (public) graph it was chosen on, for ``privacy.json``."""
        dm = trainer.datamodule
        record_public(pl_module, "selection", {
            "step": self.best_step, "candidate": self.best_candidate, "monitor": self.monitor, "score": self.best_score,
            "candidates": len(self.history), "validation_graph": validation_graph_name(dm),
            "validation_public": bool(getattr(dm, "has_validation_graph", False)),  # False: the test queries chose
        })

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": list(self.history),
            "best_step": self.best_step,
            "best_candidate": self.best_candidate,
            "warm": self._warm,
            "best_score": self.best_score,
            "best_state": self._best_state,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.best_step = state_dict.get("best_step")
        self.best_candidate = state_dict.get("best_candidate")
        self._warm = bool(state_dict.get("warm", False))
        self.best_score = float(state_dict.get("best_score", float("-inf")))
        self._best_state = state_dict.get("best_state")
