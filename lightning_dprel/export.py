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
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dprel.core.private_module import privacy_delta
from lightning_dprel.encoders import encoder_spec
from lightning_dprel.grad_sample.base import trainable_parameters
from lightning_dprel.methods.relational.inference import embed_texts, input_spec_of
from lightning_dprel.core.specs import PRIVACY_UNIT

__all__ = ["embed_texts", "input_spec_of", "privacy_delta", "privacy_report", "export_model", "load_exported", "export_main"]

FORMAT = "lightning_dprel.export/1"
_SCORING = ("score", "temperature", "loss", "margin", "lr", "weight_decay", "optimizer", "momentum")


def _number(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def privacy_report(module: Any, *, delta: float | None = None) -> dict[str, Any]:
    """What the module's privacy ledger says: ε at δ (default: :func:`privacy_delta`, else the unit's default δ), steps, σ, C,
    clipping and accounting. ``epsilon`` is ``"inf"`` when any step ran without noise or without known sampling."""
    from lightning_dprel.callbacks.checks import ACCOUNTING_LABELS, resolve_delta

    ledger, spec = module.privacy_ledger, module.noise_spec
    delta = privacy_delta(module) if delta is None else float(delta)
    samplings = [s.sampling for s in ledger.segments if s.sampling is not None]
    if delta is None and samplings:
        delta = resolve_delta(None, samplings[-1], warn=False)  # the callback's default for the unit
    epsilon = ledger.epsilon(delta) if delta is not None else (math.inf if ledger.unprotected_steps else 0.0)
    mechanism = ledger.private_mechanism or spec.mechanism
    seeded = module.hparams.get("noise_seed") is not None
    return {
        "epsilon": _number(float(epsilon)),
        "delta": delta,
        "steps": ledger.steps,
        "private_steps": ledger.private_steps,
        "unprotected_steps": ledger.unprotected_steps,
        "noise_multiplier": ledger.last_noise_multiplier if ledger.steps else spec.noise_multiplier,
        "clip_norm": spec.clip_norm,
        "clipping": spec.clipping,
        "mechanism": mechanism,
        "accounting": ACCOUNTING_LABELS.get(mechanism, mechanism),
        "privacy_unit": _privacy_unit(mechanism),
        "seeded_noise": seeded,
        "note": "the noise came from a public seed: anyone who knows it can remove it, so no epsilon holds"
        if seeded else "epsilon covers every step in ledger.json (all fits of this model)",
        **_claims(module),
        **({"public_data": module.public_data} if getattr(module, "public_data", None) else {}),
    }


def _claims(module: Any) -> dict[str, Any]:
    """A method's labelled reproduction of a published claim (e.g. AdvSGM's paper mode), kept apart from ``epsilon``."""
    claims = getattr(module, "privacy_claims", None)
    found = claims() if callable(claims) else {}
    return {"published_claim": found} if found else {}


def _privacy_unit(mechanism: str) -> str:
    from lightning_dprel.accounting.mechanisms import get_mechanism

    try:
        return get_mechanism(mechanism).privacy_unit
    except ValueError:  # "none": the non-private baseline
        return PRIVACY_UNIT


def _module_class(class_path: str) -> type:
    """A ``lightning_dprel`` private module class by path (nothing outside the library is imported from a file)."""
    import importlib

    from lightning_dprel.core.private_module import PrivateModule

    module_name, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None) if module_name.startswith("lightning_dprel.") else None
    if not (isinstance(cls, type) and issubclass(cls, PrivateModule)):
        raise ValueError(f"{class_path!r} is not a lightning_dprel private module; load_exported rebuilds only those.")
    return cls


def _public_hparams(module: Any) -> dict[str, Any]:
    hp = module.hparams
    return {**{k: hp[k] for k in _SCORING if k in hp}, **module.noise_spec.to_dict()}


def export_model(module: Any, folder: str | Path, *, delta: float | None = None) -> Path:
    """Write the trained weights, ``model.json``, ``privacy.json`` and ``ledger.json`` to ``folder`` (see the module
    docstring); no key, seed or stream state. Returns the folder."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    encoder = module.encoder
    weights = {name: p.detach().cpu().contiguous() for name, p in trainable_parameters(encoder).items()}
    save_file(weights, str(out / "weights.safetensors"), metadata={"format": "pt"})
    inner = getattr(encoder, "model", None)
    if inner is not None and type(inner).__module__.startswith("peft"):
        inner.save_pretrained(str(out / "peft_adapter"))
    meta = {
        "format": FORMAT,
        "class_path": f"{type(module).__module__}.{type(module).__name__}",
        "encoder": encoder_spec(encoder),
        "module": _public_hparams(module),
        "input_spec": getattr(module, "input_spec", None),
        "weights": "weights.safetensors",
        "trainable_parameters": sorted(weights),
    }
    (out / "model.json").write_text(json.dumps(meta, indent=2))
    (out / "privacy.json").write_text(json.dumps(privacy_report(module, delta=delta), indent=2))
    (out / "ledger.json").write_text(json.dumps(module.privacy_ledger.state_dict(), indent=2))
    return out


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
    import lightning_dprel.methods.relational.module  # noqa: F401 - the private modules a checkpoint may name
    import lightning_dprel.methods.dp_gcn.module  # noqa: F401
    from lightning_dprel.core.private_module import PrivateModule
    from lightning_dprel.methods.dp_gpl.module import DPGPLModule

    import torch

    sniff = torch.load(args.ckpt_path, map_location="cpu", weights_only=False, mmap=True)  # mmap: tensors not read
    if "dims" in (sniff.get("lightning_dprel") or {}):
        out = DPGPLModule.load_from_checkpoint(args.ckpt_path, map_location="cpu").export(args.out)  # PATE: the student only
        print(f"exported {args.ckpt_path} to {out}: epsilon = {json.loads((out / 'privacy.json').read_text())['epsilon']}", flush=True)
        return out
    module = PrivateModule.load_from_checkpoint(args.ckpt_path, map_location="cpu")
    out = export_model(module, args.out, delta=args.delta)
    report = json.loads((out / "privacy.json").read_text())
    print(f"exported {args.ckpt_path} to {out}: epsilon = {report['epsilon']} (delta = {report['delta']}), "
          f"steps = {report['steps']}, accounting: {report['accounting']}", flush=True)
    return out
