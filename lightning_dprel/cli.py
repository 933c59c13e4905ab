"""Command line: ``python -m lightning_dprel fit|validate|test --config configs/<name>.yaml``.

``fit`` is the main job: it tests the encoder *before* fine-tuning (the base encoder), trains, tests again
and prints PREC@1 / MRR of both side by side on the held-out graph, with the privacy spent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytorch_lightning import LightningDataModule, LightningModule
from pytorch_lightning.cli import LightningCLI

__all__ = ["DPRelCLI", "main", "format_report"]

_METRICS = (("test_prec1", "PREC@1"), ("test_mrr", "MRR"))


def _metrics(results: list[dict[str, float]]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for r in results:
        merged.update({k: float(v) for k, v in r.items()})
    return merged


def format_report(
    base: dict[str, float] | None,
    tuned: dict[str, float],
    privacy: dict[str, Any] | None,
    title: str,
    selection: dict[str, Any] | None = None,
) -> str:
    """The main job's closing table: base vs fine-tuned PREC@1 / MRR, the privacy spent, and the checkpoint choice."""
    lines = [title, f"{'encoder':<28}{'PREC@1':>10}{'MRR':>10}"]
    rows = ([("base (no fine-tuning)", base)] if base is not None else []) + [("fine-tuned", tuned)]
    for name, m in rows:
        lines.append(f"{name:<28}" + "".join(f"{m.get(k, float('nan')):>10.4f}" for k, _ in _METRICS))
    if privacy:
        lines.append(
            "privacy: epsilon = {epsilon:.4f} (delta = {delta:.3g}, target {target}), steps = {steps}, "
            "sigma = {sigma:.4g}, accounting: {accounting}".format(**privacy)
        )
    else:
        lines.append("privacy: none (non-private run; no epsilon is claimed)")
    if selection:
        chosen = "the base encoder" if selection["step"] == 0 else f"step {selection['step']}"
        lines.append(
            f"checkpoint: {chosen}, chosen on the validation graph (val {selection['monitor']} {selection['score']:.4f}, "
            f"base {selection['base']:.4f}); the test graph was not used for any choice"
        )
    return "\n".join(lines)


class DPRelCLI(LightningCLI):
    """LightningCLI whose ``fit`` also reports the base encoder and the privacy spent.

    Any LightningModule / LightningDataModule can be configured (``class_path`` + ``init_args``).
    Extra arguments: ``--compare_base`` (test before fine-tuning, default true) and ``--results_json``
    (write the metrics and ε as JSON).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--compare_base", type=bool, default=True, help="Test the encoder before fine-tuning too.")
        parser.add_argument("--results_json", type=str | None, default=None, help="Write metrics and epsilon here.")

    def _sub(self, key: str) -> Any:
        return self.config[self.subcommand].get(key) if self.subcommand else None

    def before_fit(self) -> None:
        self._base = None
        if self._sub("compare_base"):
            self._base = _metrics(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))

    def after_fit(self) -> None:
        tuned = _metrics(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))
        privacy = self._privacy_summary()
        source = getattr(self.datamodule, "source", None)
        name = repr(source) if source is not None else type(self.datamodule).__name__
        report = format_report(self._base, tuned, privacy, f"Zero-shot relation prediction on: {name}", self._selection_summary())
        if self.trainer.is_global_zero:
            print("\n" + report, flush=True)
            out = self._sub("results_json")
            if out:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                Path(out).write_text(
                    json.dumps({"base": self._base, "tuned": tuned, "privacy": privacy, "selection": self._selection_summary()}, indent=2)
                )

    def _selection_summary(self) -> dict[str, Any] | None:
        """The checkpoint chosen by a ValidationSelection callback, if any (duck-typed)."""
        for cb in self.trainer.callbacks:
            history = getattr(cb, "history", None)
            if getattr(cb, "best_step", None) is not None and history:
                base = next((h[cb.monitor] for h in history if h["step"] == 0), float("nan"))
                return {"step": int(cb.best_step), "monitor": cb.monitor, "score": float(cb.best_score), "base": float(base)}
        return None

    def _privacy_summary(self) -> dict[str, Any] | None:
        """ε, δ, steps, σ and accounting from the first callback that keeps an accountant (duck-typed)."""
        for cb in self.trainer.callbacks:
            if getattr(cb, "accountant", None) is not None and getattr(cb, "steps", 0) > 0:
                from lightning_dprel.callbacks.privacy import ACCOUNTING_LABELS

                return {
                    "epsilon": float(cb.epsilon),
                    "delta": float(cb.delta),
                    "target": getattr(cb, "target_epsilon", None),
                    "steps": int(cb.steps),
                    "sigma": float(cb.noise_multiplier),
                    "accounting": ACCOUNTING_LABELS.get(cb.mechanism, cb.mechanism),
                    "mechanism": cb.mechanism,
                }
        return None


def main(args: list[str] | None = None) -> DPRelCLI:
    """Entry point of ``python -m lightning_dprel`` and the ``lightning-dprel`` script."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return DPRelCLI(args=args)
