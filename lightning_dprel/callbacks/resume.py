"""On Ctrl-C, say what was kept and the one command that resumes exactly (after Lightning's ``on_exception``); and
say why a ``--ckpt_path`` cannot be loaded (missing, a folder, a YAML config) before anything is done with it."""

from __future__ import annotations

import shlex
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

__all__ = ["ResumeHint", "resume_command", "checkpoint_problem"]

_WHERE = ("a fit keeps the reported model in <default_root_dir>/model.ckpt and, with checkpointing on, the last "
          "checkpoint in <default_root_dir>/checkpoints/last.ckpt (e.g. outputs/relational/model.ckpt)")


def checkpoint_problem(path: str) -> str | None:
    """Why ``--ckpt_path path`` cannot be a checkpoint, as an argparse error line (None: it may be one).

    Lightning's names (``last``, ``best``, ``hpc``, ``registry…``) and URLs are left to Lightning. A file is a
    checkpoint candidate when it is a zip archive (what ``torch.save`` and ``Trainer.save_checkpoint`` write) or a
    legacy pickle; a YAML config, a folder or a missing path is named as such, with where checkpoints are.
    """
    text = str(path)
    if text in ("last", "best", "hpc") or text.startswith("registry") or "://" in text:
        return None
    file = Path(text)
    if not file.exists():
        return f"--ckpt_path {text}: no such file; {_WHERE}."
    if file.is_dir():
        return f"--ckpt_path {text} is a folder, not a checkpoint file; {_WHERE}."
    if zipfile.is_zipfile(file):
        return None
    with open(file, "rb") as fh:
        head = fh.read(2)
    if head[:1] == b"\x80":  # a pickle (torch.save's legacy format)
        return None
    kind = "a YAML config, not a checkpoint (a config goes to --config)" if file.suffix in (".yaml", ".yml") else "not a checkpoint"
    return f"--ckpt_path {text} is {kind}: checkpoints are the .ckpt files torch.save writes; {_WHERE}."


def resume_command(argv: Sequence[str], ckpt_path: str) -> str:
    """``python -m lightning_dprel <argv>`` with ``--ckpt_path`` set to ``ckpt_path`` (an earlier one replaced)."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--ckpt_path":
            skip = True
            continue
        if a.startswith("--ckpt_path="):
            continue
        args.append(a)
    return shlex.join(["python", "-m", "lightning_dprel", *args, "--ckpt_path", ckpt_path])


class ResumeHint(Callback):
    """Prints, when a fit is interrupted (Ctrl-C), the last checkpoint and the command that resumes from it.

    A checkpoint written by ``ModelCheckpoint`` after a step holds the model, the privacy ledger (every step it spent),
    the optimizer and noise-stream positions and the callbacks' state, so the resumed fit continues exactly: same ε
    after the same steps. Nothing is saved at the interrupt itself: a half-finished step could hold parameters the
    ledger has not charged yet.

    Args:
        argv: the command line of this fit (without ``python -m lightning_dprel``).
    """

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.message: str | None = None

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or not trainer.is_global_zero:
            return
        saved = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
        path = next((p for cb in saved for p in (cb.last_model_path, cb.best_model_path) if p), None)
        from lightning_dprel.core.privacy_layer import PrivacyLayer

        layer = pl_module if isinstance(pl_module, PrivacyLayer) else None
        steps = trainer.global_step if layer is None else layer.privacy_ledger.private_steps
        if path:
            self.message = (
                f"Interrupted after {steps} private steps. The last checkpoint ({path}) holds the model and its privacy "
                f"ledger; resume exactly with:\n  {resume_command(self.argv, path)}"
            )
        elif saved:
            every = max((getattr(cb, "_every_n_train_steps", 0) for cb in saved), default=0)
            self.message = (
                f"Interrupted after {steps} private steps, before the first checkpoint (every {every} steps): nothing "
                "to resume from; rerun the same command."
            )
        else:
            self.message = (
                f"Interrupted after {steps} private steps with checkpointing off (trainer.enable_checkpointing: false): "
                "nothing was kept. Turn it on (configs/relational.yaml does) to resume after an interrupt."
            )
        print("\n" + self.message, flush=True)
