"""The ledger layer: a library model that is its own privacy layer, whatever it releases.

:class:`LedgerModule` is a LightningModule and a
:class:`~lightning_dprel.core.privacy_layer.PrivacyLayer` (the ledger, ``charge``, the fit's
sampling, ε; saved in every checkpoint). It adds the keyed noise
stream, the privacy report (``privacy.json``), the CLI's privacy line and :meth:`export`. The
DP-SGD layer (:class:`~lightning_dprel.core.private_module.PrivateModule`) sits on top of it; a
method that releases without optimizer steps (DP-GPL) sits on it directly and declares what it
will release (:meth:`planned_releases`), so that the privacy callback can calibrate and refuse
before the first release.

References:
    dp-accounting ``dp_event.py`` (a release is an event; events compose); Opacus ``PrivacyEngine`` (one accountant
    per model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pytorch_lightning import LightningModule
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.privacy_layer import (
    PrivacyLayer, ledger_bounds, ledger_delta, ledger_epsilon, number as _number, privacy_delta,
)
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["LedgerModule", "privacy_delta", "EXPORT_FORMAT", "ledger_delta", "ledger_epsilon", "ledger_bounds",
           "ledger_report", "write_release"]

#: The format tag of an export folder's ``model.json``.
EXPORT_FORMAT = "lightning_dprel.export/1"


def ledger_report(ledger: PrivacyLedger, delta: float | None, *, epsilon: float, bounds: dict[str, Any] | None,
                  details: dict[str, Any], seeded: bool = False, claims: dict[str, Any] | None = None,
                  public_data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``privacy.json`` of any private model: ε at δ, the unit, the mechanism, what the ledger holds, what was public."""
    from lightning_dprel.accounting.mechanisms import get_mechanism

    details = dict(details)
    mechanism = details.pop("mechanism", None) or ledger.private_mechanism
    unit = None
    if ledger.unit is not None:
        from lightning_dprel.core.specs import privacy_unit

        unit = str(privacy_unit(ledger.unit))
    elif mechanism is not None:
        try:
            unit = get_mechanism(mechanism).privacy_unit
        except ValueError:  # "none" (the non-private baseline) or a method's own label
            unit = None
    return {
        "epsilon": _number(epsilon),
        "delta": delta,
        "epsilon_bounds": bounds,
        "steps": ledger.steps,
        "private_steps": ledger.private_steps,
        "unprotected_steps": ledger.unprotected_steps,
        "noise_multiplier": ledger.last_noise_multiplier,
        "mechanism": mechanism,
        "accounting": _label(mechanism),
        "privacy_unit": unit,
        **details,
        "seeded_noise": seeded,
        "note": "the noise came from a public seed: anyone who knows it can remove it, so no epsilon holds"
        if seeded else "epsilon covers every release in ledger.json (all fits of this model)",
        **({"published_claim": claims} if claims else {}),
        **({"public_data": public_data} if public_data else {}),
    }


def write_release(folder: Path, module: Any, weights: dict[str, Tensor], meta: dict[str, Any], report: dict[str, Any],
                  ledger: PrivacyLedger) -> Path:
    """Write ``weights.safetensors``, ``model.json``, ``privacy.json`` and ``ledger.json`` (no secret) to ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    save_file(weights, str(folder / "weights.safetensors"), metadata={"format": "pt"})
    meta = {"format": EXPORT_FORMAT, "class_path": f"{type(module).__module__}.{type(module).__name__}",
            **meta, "weights": "weights.safetensors", "trainable_parameters": sorted(weights)}
    (folder / "model.json").write_text(json.dumps(meta, indent=2, default=str))
    (folder / "privacy.json").write_text(json.dumps(report, indent=2, default=str))
    (folder / "ledger.json").write_text(json.dumps(ledger.state_dict(), indent=2))
    return folder


class LedgerModule(LightningModule, PrivacyLayer):
    """Base of every private model: ledger, keyed noise, ``charge(event)``, checkpoint keys, report and export.

    Subclasses fill three hooks: :meth:`released_weights` (what :meth:`export` writes), :meth:`privacy_details` (their
    fields of ``privacy.json``) and, for releases that are not optimizer steps, :meth:`planned_releases` and
    :meth:`calibrate_releases` (read by the privacy callback before the first release).
    """

    def _setup_ledger(self, *, noise_seed: int | None, stream: str = "noise") -> None:
        """Create the ledger and the keyed noise stream (call from ``__init__``)."""
        check_int("noise_seed", noise_seed, 0, optional=True)
        self.privacy_ledger = PrivacyLedger()
        self.noise_source = KeyedStream(stream, seed=noise_seed, _warn=False)
        #: How node inputs were made from texts (text encoders; kept in checkpoints), and the δ saved with a checkpoint.
        self.input_spec: dict[str, Any] | None = None
        self._saved_delta: float | None = None
        #: What PUBLIC data shaped the model (never charged): the public graph, warm start, selection; privacy.json names it.
        self.public_data: dict[str, Any] = {}
        if noise_seed is not None:
            rank_zero_warn(
                f"{type(self).__name__}(noise_seed=<int>) makes the noise reproducible: anyone who knows the seed "
                "(or a checkpoint's noise state) can regenerate and remove the noise, which voids the privacy "
                "guarantee unless the seed is kept secret. Use noise_seed=None for private runs.",
                category=UserWarning,
            )

    # --- the fit ---------------------------------------------------------------------------------
    @property
    def owns_clip_norm(self) -> bool:
        """A library model chooses its own C (a privacy callback's clip_norm must agree with it)."""
        return True

    def on_fit_start(self) -> None:
        """Refuse a private fit nothing tracks (before any release); each fit states its sampling anew."""
        self._fit_opened = False
        self._check_tracked()

    def _check_tracked(self) -> None:
        """Refuse a private fit nothing tracks (unless ``allow_untracked``): no callback would check the budget."""
        if not self.is_private or any(getattr(cb, "charges_privacy_ledger", False) for cb in self.trainer.callbacks):
            return
        name = type(self).__name__
        if not self.hparams.get("allow_untracked", False):
            raise RuntimeError(
                f"{name} is private but the trainer has no PrivacyCallback: nothing would check the budget. Add "
                "callbacks.PrivacyCallback(target_epsilon=...) to the trainer, or pass allow_untracked=True to train "
                "anyway (every release is still recorded in module.privacy_ledger)."
            )
        rank_zero_warn(
            f"{name}: private fit without a PrivacyCallback (allow_untracked=True): nothing stops it at a budget; its "
            f"releases are recorded in privacy_ledger ({self.privacy_ledger.private_steps} steps spent so far).",
            category=UserWarning,
        )

    # --- the report ------------------------------------------------------------------------------
    def privacy_details(self) -> dict[str, Any]:
        """This model's own fields of ``privacy.json`` (σ, C, clipping; PATE's queries and thresholds)."""
        return {}

    def privacy_claims(self) -> dict[str, Any]:
        """A labelled reproduction of a published claim (kept apart from ``epsilon``); empty by default."""
        return {}

    def privacy_report(self, *, delta: float | None = None) -> dict[str, Any]:
        """``privacy.json``: ε at δ, the unit, the mechanism, what the ledger holds, and any published claim."""
        delta = self.report_delta(delta)
        return ledger_report(self.privacy_ledger, delta, epsilon=self.epsilon(delta), bounds=self.epsilon_bounds(delta),
                             details=self.privacy_details(), seeded=self.hparams.get("noise_seed") is not None,
                             claims=self.privacy_claims(), public_data=self.public_data)

    def privacy_summary(self, *, target: float | None = None) -> dict[str, Any] | None:
        """The CLI's privacy line (``{"text": ...}`` and the numbers), or None when nothing was released."""
        ledger = self.privacy_ledger
        if not ledger.segments:
            return None
        r = self.privacy_report()
        eps = self.epsilon()
        if ledger.unprotected_steps:
            return {"text": "none (non-private run; no epsilon is claimed)", "epsilon": math.inf}
        bound = (r.get("epsilon_bounds") or {}).get("bound", "rdp").upper()
        text = (f"epsilon = {eps:.4f} (delta = {r['delta']:.3g}, target {target}; {bound} bound), steps = "
                f"{ledger.private_steps}, sigma = {r['noise_multiplier']:.4g}, accounting: {r['accounting']}")
        return {"text": text, "epsilon": eps, "delta": r["delta"], "target": target, "steps": ledger.private_steps,
                "sigma": r["noise_multiplier"], "accounting": r["accounting"], "mechanism": r["mechanism"]}

    # --- export -----------------------------------------------------------------------------------------
    def released_weights(self) -> dict[str, Tensor]:
        """The trained weights :meth:`export` writes (nothing secret: no key, stream state or optimizer state)."""
        raise NotImplementedError(f"{type(self).__name__} does not say which weights it releases.")

    def export_meta(self) -> dict[str, Any]:
        """This model's fields of ``model.json`` (what rebuilds it beside the weights)."""
        return {"hparams": {k: v for k, v in self.hparams.items() if k != "noise_seed"}}

    def export_files(self, folder: Path) -> None:
        """Write any further released file into ``folder`` (e.g. a PEFT adapter); nothing by default."""

    def export(self, folder: str | Path, *, delta: float | None = None) -> Path:
        """Write ``weights.safetensors``, ``model.json``, ``privacy.json`` and ``ledger.json`` (no secret) to ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.export_files(out)
        return write_release(out, self, self.released_weights(), self.export_meta(), self.privacy_report(delta=delta),
                             self.privacy_ledger)

    # --- checkpoints ------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store the ledger (never the noise stream's key) and, for using the model, the input spec, δ and public data."""
        checkpoint.setdefault("lightning_dprel", {})["ledger"] = self.privacy_ledger.state_dict()
        checkpoint["lightning_dprel_usage"] = {
            "class_path": f"{type(self).__module__}.{type(self).__name__}", "input_spec": self.input_spec,
            "delta": privacy_delta(self), "public_data": self.public_data,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        usage = checkpoint.get("lightning_dprel_usage") or {}
        self.input_spec = self.input_spec or usage.get("input_spec")  # a live datamodule's (a resumed fit) comes first
        self._saved_delta = usage.get("delta")
        self.public_data = dict(usage.get("public_data") or {}) or self.public_data
        state = checkpoint.get("lightning_dprel")
        if state is None:
            return
        if "ledger" not in state:
            raise ValueError(
                "This checkpoint predates the privacy ledger (no checkpoint['lightning_dprel']['ledger']), so what it "
                "spent is unknown; retrain, or account it yourself and continue from a fresh module."
            )
        self.privacy_ledger.load_state_dict(state["ledger"])


def _label(mechanism: str | None) -> str | None:
    from lightning_dprel.accounting.mechanisms import get_mechanism

    if mechanism is None:
        return None
    try:
        return get_mechanism(mechanism).label
    except ValueError:
        return mechanism
