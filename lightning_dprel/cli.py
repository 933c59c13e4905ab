"""Command line: ``python -m lightning_dprel fit|validate|test --config configs/<name>.yaml`` and ``export``.

``fit`` is the main job: it tests the encoder *before* fine-tuning (the base encoder), trains, tests again
and prints PREC@1 / MRR of both side by side on the held-out graph, with the privacy spent. The model it reports
(the selected checkpoint when a ``ValidationSelection`` chose one) is kept in ``<default_root_dir>/model.ckpt``
(``--final_ckpt_path``); ``python -m lightning_dprel export --ckpt_path <model.ckpt> --out <folder>`` writes its
trained weights, privacy report and ledger (:mod:`lightning_dprel.export`).

Refused before any work, with one plain line and exit code 2 (:mod:`lightning_dprel.cli_errors`): a bad value, an
abbreviated or unknown option, a config file that is no valid YAML, a GPU accelerator without a GPU, LightningCLI's
``--optimizer`` / ``--lr_scheduler`` for a module that builds its own DP optimizer; and, once built, a datamodule
tokenizer that does not match the text encoder (by default the datamodule takes the encoder's own). With progress bars on, the bar counts steps (:mod:`lightning_dprel.progress`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import LightningDataModule, LightningModule, Trainer
from pytorch_lightning.callbacks.progress.progress_bar import ProgressBar
from pytorch_lightning.cli import LightningCLI

from lightning_dprel.callbacks.resume import ResumeHint, checkpoint_problem
from lightning_dprel.cli_errors import PlainParser, accelerator_problem, yaml_problem
from lightning_dprel.cli_report import baseline_rows, callback_privacy, reference_row, unit_text, write_report
from lightning_dprel.progress import step_progress_bar

__all__ = ["DPRelCLI", "main", "format_report", "report_title"]

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
    checkpoint: str | None = None,
    metrics: tuple[tuple[str, str], ...] = _METRICS,
    rows: tuple[str, str] = ("base (no fine-tuning)", "fine-tuned"),
    baselines: list[tuple[str, dict[str, float]]] = (),
    references: list[tuple[str, dict[str, float]]] = (),
    unit: str | None = None,
) -> str:
    """The main job's closing table: base vs trained metrics (PREC@1 / MRR by default) with any baselines and
    references, the privacy spent and its unit, the checkpoint."""
    table = ([(rows[0], base)] if base is not None else []) + list(baselines) + [(rows[1], tuned)] + list(references)
    width = max([28] + [len(name) + 2 for name, _ in table])
    lines = [title, f"{'model':<{width}}" + "".join(f"{label:>10}" for _, label in metrics)]
    for name, m in table:
        lines.append(f"{name:<{width}}" + "".join(f"{m.get(k, float('nan')):>10.4f}" for k, _ in metrics))
    if privacy and "text" in privacy:
        lines.append(f"privacy: {privacy['text']}")
    elif privacy:
        lines.append(
            "privacy: epsilon = {epsilon:.4f} (delta = {delta:.3g}, target {target}), steps = {steps}, "
            "sigma = {sigma:.4g}, accounting: {accounting}".format(**privacy)
        )
    else:
        lines.append("privacy: none (non-private run; no epsilon is claimed)")
    if unit:
        lines.append(f"unit: {unit}")
    if selection:
        candidate = selection.get("candidate") or ("base" if selection["step"] == 0 else f"step {selection['step']}")
        chosen = {"base": "the base encoder", "step 0": "the public warm start (step 0)"}.get(candidate, candidate)
        lines.append(
            f"checkpoint: {chosen}, chosen on {selection.get('on') or 'the validation graph'} (val {selection['monitor']} "
            f"{selection['score']:.4f}, base {selection['base']:.4f}); the test "
            + (f"{selection['test']} were" if selection.get("test") else "graph was") + " not used for any choice"
        )
    if checkpoint:
        lines.append(f"model: {checkpoint} (export: python -m lightning_dprel export --ckpt_path {checkpoint} --out <folder>)")
    return "\n".join(lines)


def report_title(model: Any, datamodule: Any) -> str:
    """The report's title: the model's own (``report_title``), else relation prediction named by the datamodule's
    split: zero-shot on a separate test graph, or on relations held out of the training graph (``held_out_test``)."""
    own = getattr(model, "report_title", None)
    if own:
        return own
    held_out = getattr(datamodule, "held_out_test", None)
    if held_out is None:
        return "Relation prediction on"
    return "Relation prediction on held-out relations of" if held_out else "Zero-shot relation prediction on"


def _unchanged(before: dict[str, torch.Tensor] | None, model: LightningModule) -> bool:
    """True when every parameter of ``model`` still equals the snapshot ``before``."""
    if before is None:
        return False
    now = dict(model.named_parameters())
    return now.keys() == before.keys() and all(torch.equal(now[n].detach().cpu(), v) for n, v in before.items())


def _cli_optimizer_problem(model: Any, optimizer: Any, lr_scheduler: Any) -> str | None:
    """LightningCLI's automatic ``--optimizer`` / ``--lr_scheduler`` would replace the DP optimizer that a module on the
    DP-SGD layer (:class:`~lightning_dprel.core.private_module.PrivateModule`) builds itself. A plain LightningModule
    keeps them: the privacy callback wraps whatever optimizer it has."""
    if optimizer is None and lr_scheduler is None:
        return None
    path = getattr(model, "class_path", None) if model is not None else None
    from lightning_dprel.core.private_module import PrivateModule

    name = "the module"
    if isinstance(path, str):
        module_name, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            return None  # the parser names a missing module itself
        if not (isinstance(cls, type) and issubclass(cls, PrivateModule)):
            return None
    if optimizer is not None:
        return (
            f"--optimizer {getattr(optimizer, 'class_path', optimizer)} would replace the module's optimizer, but "
            f"{name} builds its own DPOptimizer (clipping, one noise draw per step, the privacy ledger) around Adam, "
            "AdamW or SGD: remove --optimizer (and --lr_scheduler) and set --model.init_args.optimizer adam|adamw|sgd "
            "with --model.init_args.lr (and momentum) instead."
        )
    return (
        f"--lr_scheduler {getattr(lr_scheduler, 'class_path', lr_scheduler)} is not supported: {name} steps its "
        "DPOptimizer by hand, so a scheduler given here would not be stepped; remove it and keep a constant "
        "--model.init_args.lr."
    )


_HELP_DESCRIPTION = (
    "lightning_dprel: differentially private relational learning. Subcommands: fit | validate | test | predict "
    "(LightningCLI, below) and export (write a trained checkpoint's weights, privacy report and ledger)."
)
_HELP_USAGE = "python -m lightning_dprel [-h] [-c CONFIG] [--print_config[=flags]] {fit,validate,test,predict,export} ..."
_HELP_EPILOG = (
    "export: python -m lightning_dprel export --ckpt_path <model.ckpt> --out <folder> [--delta D] writes the trained "
    "weights, privacy.json and ledger.json, without secrets (python -m lightning_dprel export --help)."
)


class DPRelCLI(LightningCLI):
    """LightningCLI whose ``fit`` also reports the base encoder and the privacy spent.

    Any LightningModule / LightningDataModule can be configured (``class_path`` + ``init_args``).
    Extra arguments: ``--compare_base`` (test before fine-tuning, default true; an unchanged model reuses that
    result instead of testing again), ``--results_json`` (write the metrics and ε as JSON) and
    ``--final_ckpt_path`` (default ``model.ckpt``, under ``trainer.default_root_dir`` unless absolute; null: none).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args", args[0] if args else None)
        self._argv = [str(a) for a in (sys.argv[1:] if given is None else given)]  # for the resume hint on Ctrl-C
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("parser_class", PlainParser)  # plain one-line errors; no abbreviated options
        kwargs["parser_kwargs"] = {"description": _HELP_DESCRIPTION, "epilog": _HELP_EPILOG, "prog": "python -m lightning_dprel",
                                   **(kwargs.get("parser_kwargs") or {})}
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)

    def setup_parser(self, *args: Any, **kwargs: Any) -> None:
        super().setup_parser(*args, **kwargs)
        if "usage" not in self.parser_kwargs:  # set after the subcommands, whose usage lines start from the main prog
            self.parser.usage = _HELP_USAGE

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--compare_base", type=bool, default=True, help="Test the encoder before fine-tuning too.")
        parser.add_argument("--results_json", type=str | None, default=None, help="Write metrics and epsilon here.")
        parser.add_argument(
            "--final_ckpt_path", type=str | None, default="model.ckpt",
            help="After fit, save the reported model (the selected one) here; relative to trainer.default_root_dir; null: none.",
        )
        parser.add_argument("--reference_json", type=str | None, default=None,
                            help="A committed benchmark summary whose row --reference_row is printed as a reference (not trained).")
        parser.add_argument("--reference_row", type=str, default="non-private", help="The reference row's name.")

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: Any) -> None:
        helps = {
            "optimizer": "Refused for the DP-SGD modules (relational, DP-GCN, AdvSGM), which build their own DPOptimizer: "
            "use --model.init_args.optimizer adam|adamw|sgd (with lr, momentum) instead. A plain LightningModule keeps it.",
            "lr_scheduler": "Refused for the DP-SGD modules (a scheduler would not be stepped); keep a constant "
            "--model.init_args.lr.",
        }
        for action in parser._actions:
            if action.dest in helps:
                action.help = helps[action.dest]
        LightningCLI.link_optimizers_and_lr_schedulers(parser)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse, refusing with one plain line and exit code 2, before any work: a config file that is no valid YAML, a
        GPU accelerator without a GPU, ``--optimizer`` / ``--lr_scheduler`` for a module that builds its own DP
        optimizer, and a ``--ckpt_path`` that is missing or no checkpoint (e.g. a YAML config)."""
        if not isinstance(args, dict):
            problem = yaml_problem(self._argv)
            if problem:
                parser.error(problem)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        ckpt_path = config.get("ckpt_path")
        problem = (
            accelerator_problem(config.get("trainer.accelerator"))
            or _cli_optimizer_problem(config.get("model"), config.get("optimizer"), config.get("lr_scheduler"))
            or (checkpoint_problem(ckpt_path) if ckpt_path else None)
        )
        if problem:
            parser.error(problem)

    def after_instantiate_classes(self) -> None:
        match = getattr(self.datamodule, "match_encoder", None)  # default the tokenizer to the encoder's; refuse a mismatch
        if callable(match):
            match(getattr(self.model, "encoder", None))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured trainer, with a progress bar that counts steps (no "Epoch 0/-2") when bars are on, and a
        :class:`~lightning_dprel.callbacks.ResumeHint` that prints the resume command on Ctrl-C."""
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        sub = [self.subcommand] if self.subcommand and self._argv[:1] != [self.subcommand] else []
        extra = [ResumeHint([*sub, *self._argv])]
        if config.get("enable_progress_bar") is not False and not any(isinstance(cb, ProgressBar) for cb in callbacks):
            extra.append(step_progress_bar())
        kwargs["callbacks"] = [*callbacks, *extra]
        return super().instantiate_trainer(**kwargs)

    def _sub(self, key: str) -> Any:
        return self.config[self.subcommand].get(key) if self.subcommand else None

    def before_fit(self) -> None:
        self._base = self._base_params = None
        if self._sub("compare_base"):
            self._base_params = {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()}
            self._base = _metrics(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))

    def after_fit(self) -> None:
        checkpoint = self._save_final_checkpoint()
        if self._base is not None and _unchanged(self._base_params, self.model):
            tuned = dict(self._base)  # the model is the base one (no step, or the base was selected): no second test
        else:
            tuned = _metrics(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))
        self._base_params = None
        privacy = self._privacy_summary() or callback_privacy(self.trainer)
        source = getattr(self.datamodule, "source", None)
        name = repr(source) if source is not None else type(self.datamodule).__name__
        selection = self._selection_summary()
        title = report_title(self.model, self.datamodule)
        metrics = tuple(getattr(self.model, "report_metrics", _METRICS))
        rows = tuple(getattr(self.model, "report_rows", ("base (no fine-tuning)", "fine-tuned")))
        ledger = next((cb.ledger for cb in self.trainer.callbacks if getattr(cb, "charges_privacy_ledger", False)), None)
        baselines = baseline_rows(self.datamodule, privacy, ledger) if self.trainer.is_global_zero else []
        ref = reference_row(self._sub("reference_json"), self._sub("reference_row"), metrics)
        unit = unit_text(self.datamodule)
        report = format_report(self._base, tuned, privacy, f"{title}: {name}", selection, checkpoint, metrics, rows,
                               [(b["name"], b["metrics"]) for b in baselines], [(ref["name"], ref["metrics"])] if ref else [],
                               unit)
        for b in baselines:
            if b.get("epsilon_with_the_model") is not None:
                report += (f"\nnote: {b['name']} is a release of its own (epsilon = {b['epsilon']:.4f}); the model and it "
                           f"together spend epsilon = {b['epsilon_with_the_model']:.4f} at the same delta")
        if self.trainer.is_global_zero:
            table = ([{"name": rows[0], "metrics": self._base}] if self._base is not None else []) + baselines + [
                {"name": rows[1], "metrics": tuned, "selection": selection}] + ([ref] if ref else [])
            extra = {"title": f"{title}: {name}", "checkpoint": checkpoint}
            if checkpoint:
                report += f"\nreport: {write_report(Path(checkpoint).with_name('report.json'), table, privacy, unit, extra)}"
            print("\n" + report, flush=True)
            out = self._sub("results_json")
            if out:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                Path(out).write_text(json.dumps(
                    {"base": self._base, "tuned": tuned, "privacy": privacy, "selection": selection, "checkpoint": checkpoint,
                     "baselines": baselines, "reference": ref, "unit": unit}, indent=2
                ))

    def _save_final_checkpoint(self) -> str | None:
        """Save the model as it is after fit (the selected iterate when a selection callback restored one)."""
        path = self._sub("final_ckpt_path")
        if not path:
            return None
        target = Path(path) if Path(path).is_absolute() else Path(self.trainer.default_root_dir) / path
        self.trainer.save_checkpoint(str(target), weights_only=False)  # the whole state: ledger, optimizer, callbacks
        return str(target)

    def _selection_summary(self) -> dict[str, Any] | None:
        """The checkpoint chosen by a ValidationSelection callback, if any (duck-typed)."""
        for cb in self.trainer.callbacks:
            history = getattr(cb, "history", None)
            if getattr(cb, "best_step", None) is not None and history:
                base = next((h[cb.monitor] for h in history if h["step"] == 0), float("nan"))  # the first: the base
                return {"step": int(cb.best_step), "monitor": cb.monitor, "score": float(cb.best_score), "base": float(base),
                        "candidate": getattr(cb, "best_candidate", None),
                        "on": getattr(self.datamodule, "validation_name", None),
                        "test": getattr(self.datamodule, "test_name", None)}
        return None

    def _privacy_summary(self) -> dict[str, Any] | None:
        """The model's privacy line (every private model has one: the ledger layer's), with the callback's target."""
        target = next((cb.target_epsilon for cb in self.trainer.callbacks if getattr(cb, "charges_privacy_ledger", False)), None)
        summary = getattr(self.model, "privacy_summary", None)
        return summary(target=target) if callable(summary) else None


def main(args: list[str] | None = None) -> Any:
    """Entry point of ``python -m lightning_dprel`` and the ``lightning-dprel`` script.

    ``fit|validate|test ...`` run :class:`DPRelCLI` (returned); ``export --ckpt_path C --out D`` runs
    :func:`lightning_dprel.export.export_main` (returns the folder).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] == "export":
        from lightning_dprel.export import export_main

        return export_main(argv[1:])
    with warnings.catch_warnings():  # args given in Python (tests, scripts) win over sys.argv: Lightning's hint is moot
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run from within Python")
        return DPRelCLI(args=args)
