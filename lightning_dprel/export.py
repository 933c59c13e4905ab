"""Using a trained model: embed new texts as training did, report its privacy, export it without its secrets.

:func:`export_model` writes a folder that is all a user of the trained model needs, and nothing that could
regenerate the training noise or the sampled batches:

* ``weights.safetensors``: the trained (trainable) parameters of the encoder: the adapter, the LoRA matrices, or
  every weight under full fine-tuning. Frozen parts are public (a pretrained model, a fixed seeded init) and are
  rebuilt from ``model.json``.
* ``peft_adapter/`` (LoRA text encoders): the same LoRA weights as a PEFT adapter (``PeftModel.from_pretrained``).
* ``model.json``: the encoder's spec (``class_path`` + ``init_args``), the scoring hyper-parameters, the noise spec
  and how node inputs were made from texts (tokenizer, ``max_length``, frozen :class:`~lightning_dprel.transforms.EmbedText`).
* ``privacy.json``: ε at δ, steps, σ, C, clipping and accounting, from the model's privacy ledger.
* ``ledger.json``: the ledger itself (:meth:`~lightning_dprel.core.ledger.PrivacyLedger.state_dict`).

Never written: the noise stream's or the sampler's key, seed or position, optimizer states, the datamodule state.
``python -m lightning_dprel export --ckpt_path <model.ckpt> --out <folder> [--delta D]`` runs :func:`export_main`;
:func:`load_exported` rebuilds the module (``DPRelationalModule``, ``DPNodeModule``, any ``lightning_dprel`` private module) from it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dprel.core.ledger_module import EXPORT_FORMAT as FORMAT
from lightning_dprel.core.ledger_module import privacy_delta
from lightning_dprel.grad_sample.base import trainable_parameters
from lightning_dprel.methods.relational.inference import embed_texts, input_spec_of

__all__ = ["embed_texts", "input_spec_of", "privacy_delta", "privacy_report", "export_model", "load_exported", "export_main"]



def privacy_report(module: Any, *, delta: float | None = None) -> dict[str, Any]:
    """``privacy.json`` of any private model (:meth:`~lightning_dprel.core.ledger_module.LedgerModule.privacy_report`)."""
    return module.privacy_report(delta=delta)


def _made_private_class(class_path: str) -> type:
    """The LightningModule class a checkpoint of a private fit names (its ledger saved beside it)."""
    import importlib

    import pytorch_lightning as pl

    module_name, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None) if module_name else None
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningModule)):
        raise ValueError(f"{class_path!r} is not a LightningModule class.")
    return cls


def _module_class(class_path: str) -> type:
    """A ``lightning_dprel`` private module class by path (nothing outside the library is imported from a file)."""
    import importlib

    from lightning_dprel.core.ledger_module import LedgerModule

    module_name, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None) if module_name.startswith("lightning_dprel.") else None
    if not (isinstance(cls, type) and issubclass(cls, LedgerModule)):
        raise ValueError(f"{class_path!r} is not a lightning_dprel private module; load_exported rebuilds only those.")
    return cls


def export_model(module: Any, folder: str | Path, *, delta: float | None = None) -> Path:
    """Write any private model's release to ``folder``: a lightning_dprel model's
    (:meth:`~lightning_dprel.core.ledger_module.LedgerModule.export`), or a plain LightningModule that PrivacyCallback
    made private (all its parameters and buffers, with the same ``privacy.json`` and ``ledger.json``)."""
    from lightning_dprel.core.ledger_module import LedgerModule

    if isinstance(module, LedgerModule):
        return module.export(folder, delta=delta)
    return _export_made_private(module, Path(folder), delta)


def _export_made_private(module: Any, folder: Path, delta: float | None) -> Path:
    from lightning_dprel.core.attached import attached_ledger, attached_public_data, released_unchanged
    from lightning_dprel.core.ledger_module import ledger_bounds, ledger_delta, ledger_epsilon, ledger_report, write_release

    ledger = attached_ledger(module)
    if ledger is None or not ledger.segments:
        raise ValueError(
            f"{type(module).__name__} has no privacy ledger: it was never trained with PrivacyCallback (or is not a "
            "lightning_dprel model), so no ε can be reported for it. Train it with PrivacyCallback, then export."
        )
    if not released_unchanged(module):
        raise ValueError(
            f"The weights of {type(module).__name__} changed after its last private fit (a fit without PrivacyCallback, "
            "or an edit after fit): its ledger does not describe them, so no ε can be reported. Export right after "
            "the private fit, or fit again with PrivacyCallback (the ledger continues)."
        )
    delta = ledger_delta(ledger, delta if delta is not None else privacy_delta(module))
    epsilon = ledger_epsilon(ledger, delta)
    steps = [seg for seg in ledger.segments if seg.sampling is not None]
    details = {"noise_multiplier": steps[-1].noise_multiplier, "clip_norm": steps[-1].clip_norm,
               "clipping": steps[-1].clipping} if steps else {}
    report = ledger_report(ledger, delta, epsilon=epsilon, bounds=ledger_bounds(ledger, delta), details=details,
                           public_data=attached_public_data(module))
    weights = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    meta = {"made_private_by": "lightning_dprel.PrivacyCallback",
            "buffers": sorted(n for n, _ in module.named_buffers())}
    return write_release(folder, module, weights, meta, report, ledger)


def load_exported(folder: str | Path) -> Any:
    """A :class:`~lightning_dprel.methods.relational.module.DPRelationalModule` rebuilt from an :func:`export_model` folder (weights,
    input spec, ledger and δ), ready for :meth:`embed_texts`, ``embed`` or ``trainer.predict``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / "model.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder} is not a lightning_dprel export ({FORMAT}); got format {meta.get('format')!r}.")
    if meta["encoder"] is None:
        raise ValueError(
            "The exported encoder has no spec (a custom encoder without `init_args`): build it yourself and load "
            f"{folder / meta['weights']} into it."
        )
    module = _module_class(meta.get("class_path", "lightning_dprel.methods.relational.module.DPRelationalModule"))(meta["encoder"], **meta["module"])
    weights = load_file(str(folder / meta["weights"]))
    trainable = set(trainable_parameters(module.encoder))
    if set(weights) != trainable:
        raise ValueError(f"{meta['weights']} holds {sorted(set(weights) ^ trainable)[:5]}… that the rebuilt encoder does not train.")
    module.encoder.load_state_dict(weights, strict=False)
    module.privacy_ledger.load_state_dict(json.loads((folder / "ledger.json").read_text()))
    module.input_spec = meta["input_spec"]
    module._saved_delta = json.loads((folder / "privacy.json").read_text()).get("delta")
    return module.eval()


def export_main(argv: Sequence[str] | None = None) -> Path:
    """``python -m lightning_dprel export --ckpt_path <model.ckpt> --out <folder> [--delta D]``."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dprel export",
        description="Export a trained private module's checkpoint: trained weights, privacy report and ledger (no secrets).",
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint, e.g. <default_root_dir>/model.ckpt of a fit")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--delta", type=float, default=None, help="δ of the report (default: the fit's, else 1/m)")
    args = parser.parse_args(argv)
    from lightning_dprel.callbacks.resume import checkpoint_problem

    problem = checkpoint_problem(args.ckpt_path)  # missing, a folder, a YAML config: usage + the reason, exit code 2
    if problem:
        parser.error(problem)
    import torch

    saved = torch.load(args.ckpt_path, map_location="cpu", weights_only=False, mmap=True)  # mmap: tensors not read
    usage = saved.get("lightning_dprel_usage") or {}
    class_path = usage.get("class_path") or (saved.get("hyper_parameters") or {}).get("_class_path")
    if class_path is None:
        raise ValueError(f"{args.ckpt_path} names no lightning_dprel private model (no class path saved with it).")
    from lightning_dprel.core.attached import LEDGER_KEY, restore_attached

    attached = saved.get(LEDGER_KEY)  # a plain module made private by PrivacyCallback: its ledger travels beside it
    cls = _made_private_class(class_path) if attached is not None else _module_class(class_path)
    module = cls.load_from_checkpoint(args.ckpt_path, map_location="cpu")
    if attached is not None:
        restore_attached(module, attached)
    out = export_model(module, args.out, delta=args.delta)
    report = json.loads((out / "privacy.json").read_text())
    print(f"exported {args.ckpt_path} to {out}: epsilon = {report['epsilon']} (delta = {report['delta']}), "
          f"steps = {report['steps']}, accounting: {report['accounting']}", flush=True)
    return out
