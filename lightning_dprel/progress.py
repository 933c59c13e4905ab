"""Progress display: a training bar that counts steps, and progress while a long evaluation embeds its nodes.

Lightning's bars describe training as ``Epoch e/(max_epochs - 1)``, which reads "Epoch 0/-2" for a step-limited
run (``max_epochs: -1`` with ``max_steps``, how every config here trains). :func:`step_progress_bar` gives the same
bar (rich when installed, else tqdm) with ``Epoch e`` and a ``step t/T`` field instead; the CLI installs it
whenever progress bars are on. :func:`chunk_progress` shows a sub-task on the trainer's bar while
:meth:`~lightning_dprel.methods.relational.module.DPRelationalModule.embed` encodes many nodes chunk by chunk (a test graph, a
validation graph, new texts), and nothing when progress bars are off.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
from pytorch_lightning.callbacks.progress.progress_bar import ProgressBar

__all__ = ["StepRichProgressBar", "StepTQDMProgressBar", "step_progress_bar", "chunk_progress", "ProgressLog"]


class _CountsSteps:
    """Adds ``step: t/T`` to the bar's fields during fit when the trainer is limited by ``max_steps``."""

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        if trainer.state.fn == "fit" and trainer.max_steps is not None and trainer.max_steps > 0:
            items["step"] = f"{trainer.global_step}/{trainer.max_steps}"
        return items


class StepRichProgressBar(_CountsSteps, RichProgressBar):
    """:class:`RichProgressBar` that never shows a negative epoch total (``max_epochs=-1``) and counts steps."""

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs > 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        width = len(self.validation_description)
        return f"{description:{width}}" if width > len(description) else description


class StepTQDMProgressBar(_CountsSteps, TQDMProgressBar):
    """:class:`TQDMProgressBar` with a ``step: t/T`` field for step-limited runs."""


def step_progress_bar() -> ProgressBar:
    """The bar the CLI installs: rich when ``rich`` is installed (as Lightning's default), else tqdm."""
    from pytorch_lightning.callbacks.progress.rich_progress import _RICH_AVAILABLE

    return StepRichProgressBar() if _RICH_AVAILABLE else StepTQDMProgressBar()


def _shown_bar(module: Any) -> ProgressBar | None:
    trainer = getattr(module, "_trainer", None)
    if trainer is None or not trainer.is_global_zero:
        return None
    bar = trainer.progress_bar_callback
    return bar if bar is not None and bar.is_enabled else None


def chunk_progress(module: Any, total: int, chunk: int, description: str = "embedding nodes") -> Iterator[int]:
    """Start offsets ``0, chunk, 2·chunk, …`` below ``total``; while they are consumed, a ``description`` sub-task
    (nodes done / ``total``) on the module's trainer's progress bar, if it shows one and there are several chunks."""
    starts = range(0, total, chunk)
    bar = _shown_bar(module)
    if bar is None or len(starts) < 2:
        yield from starts
        return
    live = getattr(bar, "progress", None) if isinstance(bar, RichProgressBar) and not bar._progress_stopped else None
    if live is not None:
        task = live.add_task(description, total=total)
        try:
            for start in starts:
                yield start
                live.update(task, advance=min(chunk, total - start))
                live.refresh()
        finally:
            live.remove_task(task)
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=description, unit="node", leave=False, dynamic_ncols=True, file=sys.stdout) as shown:
        for start in starts:
            yield start
            shown.update(min(chunk, total - start))


class ProgressLog:
    """Log lines with an estimate for a long phase outside the trainer's bar (embedding texts, preparing graphs).

    One line at the start, then one at most every ``every`` seconds with done/total, elapsed time and an estimate of
    what is left, and one at the end. Lines go through Lightning's rank-zero logger (shown by the CLI; nothing on
    other ranks). ``enabled=False`` makes every call a no-op.
    """

    def __init__(self, what: str, total: int, *, unit: str = "items", every: float = 5.0, enabled: bool = True,
                 work: float | None = None) -> None:
        self.what, self.total, self.unit, self.every, self.enabled = what, int(total), unit, float(every), bool(enabled)
        self.work = float(work) if work is not None else float(total)  # the cost the estimate scales with (e.g. tokens)
        self.start = self.last = time.monotonic()
        self._say(f"{what}: {self.total:,} {unit} …")

    def _say(self, line: str) -> None:
        if self.enabled:
            from pytorch_lightning.utilities.rank_zero import rank_zero_info

            rank_zero_info(line)

    def update(self, done: int, work_done: float | None = None) -> None:
        """Report ``done`` of ``total`` if ``every`` seconds passed since the last line; the estimate of the time left
        scales with ``work_done`` of ``work`` when given (items of unequal cost), else with ``done``."""
        now = time.monotonic()
        if now - self.last < self.every or done <= 0 or done >= self.total:
            return
        self.last, elapsed = now, now - self.start
        spent = float(done if work_done is None else work_done)
        left = elapsed * max(self.work - spent, 0.0) / max(spent, 1e-12)
        self._say(f"{self.what}: {done:,}/{self.total:,} {self.unit} ({100 * done / self.total:.0f} %), "
                  f"{elapsed:.0f} s elapsed, ~{left:.0f} s left")

    def close(self) -> None:
        """The closing line with the total time."""
        self._say(f"{self.what}: {self.total:,} {self.unit} done in {time.monotonic() - self.start:.1f} s")
