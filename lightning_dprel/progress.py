"""Progress display: a training bar that counts steps, and progress while a long evaluation embeds its nodes.

Lightning's bars describe training as ``Epoch e/(max_epochs - 1)``, which reads "Epoch 0/-2" for a step-limited
run (``max_epochs: -1`` with ``max_steps``, how every config here trains). :func:`step_progress_bar` gives the same
bar (rich when installed, else tqdm) with ``Epoch e`` and a ``step t/T`` field instead; the CLI installs it
whenever progress bars are on. :func:`chunk_progress` shows a sub-task on the trainer's bar while
:meth:`~lightning_dprel.methods.relational.module.DPRelationalModule.embed` encodes many nodes chunk by chunk (a test graph, a
validation graph, new texts), and nothing when progress bars are off.

A bar redraws itself on a terminal only: when stdout is piped or logged, :func:`step_progress_bar` gives
:class:`StepLogProgressBar` instead, which logs a plain line (step t/T, ε when logged, time left) at every tenth of
the steps and at least every 10 s. :class:`ProgressLog` writes those lines, also for long phases outside the trainer
(embedding texts, preparing graphs, the public warm start).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
from pytorch_lightning.callbacks.progress.progress_bar import ProgressBar

from lightning_dprel.core.checks import check_probability

__all__ = [
    "StepRichProgressBar", "StepTQDMProgressBar", "StepLogProgressBar", "step_progress_bar", "chunk_progress", "ProgressLog",
]


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


def step_progress_bar(stream: IO[str] | None = None) -> ProgressBar:
    """The bar the CLI installs: on a terminal rich when ``rich`` is installed (as Lightning's default), else tqdm; when
    ``stream`` (default: stdout, where the bars draw) is not a terminal, :class:`StepLogProgressBar`'s plain lines."""
    from pytorch_lightning.callbacks.progress.rich_progress import _RICH_AVAILABLE

    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        return StepLogProgressBar()
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
    if bar is None or isinstance(bar, StepLogProgressBar) or len(starts) < 2:  # no sub-task lines in a log
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
    """Log lines with an estimate for a long phase (embedding texts, preparing graphs, warm start, training when piped).

    One line at the start, then one at most every ``every`` seconds with done/total, elapsed time and an estimate of
    what is left (and, with ``fraction``, also one each time another ``fraction`` of ``total`` is done), and one at the
    end. Lines go through Lightning's rank-zero logger (shown by the CLI; nothing on other ranks). ``enabled=False``
    makes every call a no-op.

    Args:
        what, total, unit: the phase, its size and what it counts (``"embedding texts", 12_000, unit="texts"``).
        every: seconds between lines at most.
        enabled: False: say nothing.
        work: the cost the estimate scales with (e.g. tokens; default ``total``).
        first: how many were done before this phase started (a resumed fit): counts include them, the estimate of
            the time left uses the rate of this phase only.
        fraction: also a line at every multiple of ``fraction · total`` (0.1: every tenth), however soon.
        clock: seconds, monotonic (default :func:`time.monotonic`; tests pass their own).
        write: where each line goes instead of Lightning's logger (e.g. straight to stderr where that logger is
            muted, as in the audit command).
    """

    def __init__(self, what: str, total: int, *, unit: str = "items", every: float = 5.0, enabled: bool = True,
                 work: float | None = None, first: int = 0, fraction: float | None = None,
                 clock: Callable[[], float] | None = None, write: Callable[[str], None] | None = None) -> None:
        if fraction is not None:
            check_probability("fraction", fraction, one=True)
        self.what, self.total, self.unit, self.every, self.enabled = what, int(total), unit, float(every), bool(enabled)
        self.first = int(first)
        self.work = float(work) if work is not None else float(self.total - self.first)
        self.fraction = None if fraction is None else float(fraction)
        self._write = write
        self._clock = clock if clock is not None else (lambda: time.monotonic())  # looked up per call: patchable
        self._mark = self._share(self.first)
        self.start = self.last = self._clock()
        resumed = f" (from {self.first:,})" if self.first else ""
        self._say(f"{what}: {self.total:,} {unit}{resumed} …")

    def _share(self, done: int) -> int:
        """How many whole ``fraction``s of ``total`` ``done`` covers (0 without ``fraction``)."""
        if self.fraction is None or self.total <= 0:
            return 0
        return math.floor(done / (self.fraction * self.total) + 1e-9)

    def _say(self, line: str) -> None:
        if self.enabled and self._write is not None:
            self._write(line)
        elif self.enabled:
            from pytorch_lightning.utilities.rank_zero import rank_zero_info

            rank_zero_info(line)

    def update(self, done: int, work_done: float | None = None, *, note: str = "") -> None:
        """Report ``done`` of ``total`` if ``every`` seconds passed since the last line (or another ``fraction`` was
        done); the estimate of the time left scales with ``work_done`` of ``work`` when given (items of unequal cost),
        else with the count done in this phase. ``note`` (e.g. ``"ε = 1.2"``) goes after the percentage."""
        now, mark = self._clock(), self._share(done)
        if done <= self.first or done >= self.total or (now - self.last < self.every and mark <= self._mark):
            return
        self.last, self._mark, elapsed = now, mark, now - self.start
        spent = float(done - self.first if work_done is None else work_done)
        left = elapsed * max(self.work - spent, 0.0) / max(spent, 1e-12)
        note = f", {note}" if note else ""
        self._say(f"{self.what}: {done:,}/{self.total:,} {self.unit} ({100 * done / self.total:.0f} %){note}, "
                  f"{elapsed:.0f} s elapsed, ~{left:.0f} s left")

    def close(self, done: int | None = None) -> None:
        """The closing line with the total time (and ``done``/``total`` when ``done`` is given: where it stopped)."""
        count = f"{self.total:,}" if done is None else f"{done:,}/{self.total:,}"
        self._say(f"{self.what}: {count} {self.unit} done in {self._clock() - self.start:.1f} s")


class StepLogProgressBar(ProgressBar):
    """The training "bar" for piped or logged output: plain :class:`ProgressLog` lines, since a bar redraws only on a
    terminal. During fit, one line at every ``fraction`` of the steps and at least every ``every`` seconds: step t/T,
    ε when a callback logs ``epsilon`` to the bar (:class:`~lightning_dprel.callbacks.PrivacyCallback` does), elapsed
    time and the time left; one at the end. Validation and test say nothing. T is ``max_steps`` (else Lightning's
    estimate of the steps); without a finite T there are no lines.

    Args:
        every: seconds between lines at most (default 10: piped output is never silent longer while steps run).
        fraction: a line at every multiple of this share of the steps (default 0.1; None: by time only).
        clock: seconds, monotonic (default :func:`time.monotonic`).
        what: the phase the lines name (default ``"training"``).
        write: where each line goes (default: Lightning's logger; see :class:`ProgressLog`).
    """

    def __init__(self, every: float = 10.0, fraction: float | None = 0.1, clock: Callable[[], float] | None = None, *,
                 what: str = "training", write: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.every, self.fraction, self.clock, self.what, self.write = float(every), fraction, clock, what, write
        self._enabled = True
        self._log: ProgressLog | None = None

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        total = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        self._log = None
        if self._enabled and isinstance(total, (int, float)) and math.isfinite(total) and total > trainer.global_step:
            self._log = ProgressLog(self.what, int(total), unit="steps", every=self.every, fraction=self.fraction,
                                    first=int(trainer.global_step), clock=self.clock, write=self.write)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._log is None:
            return
        epsilon = trainer.progress_bar_metrics.get("epsilon")
        self._log.update(int(trainer.global_step), note="" if epsilon is None else f"ε = {float(epsilon):.4g}")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._log is not None:
            self._log.close(int(trainer.global_step))
        self._log = None
