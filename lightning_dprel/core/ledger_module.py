"""The ledger layer every private model has, whatever it trains with (DP-SGD steps, PATE answers, released statistics).

:class:`LedgerModule` owns the :class:`~lightning_dprel.core.ledger.PrivacyLedger` (saved in every checkpoint), the
keyed noise stream, :meth:`charge` for releases that are not optimizer steps, the privacy report (``privacy.json``), the
CLI's privacy line and :meth:`export`. The DP-SGD layer (:class:`~lightning_dprel.core.private_module.PrivateModule`)
sits on top of it; a method that releases without optimizer steps (DP-GPL) sits on it directly and declares what it
will release (:meth:`planned_releases`), so that :class:`~lightning_dprel.callbacks.PrivacyCallback` can calibrate and
refuse before the first release.

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

from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["LedgerModule", "privacy_delta", "EXPORT_FORMAT", "ledger_delta", "ledger_epsilon", "ledger_bounds",
           "ledger_report", "write_release"]

#: The format tag of an export folder's ``model.json``.
EXPORT_FORMAT = "lightning_dprel.export/1"


def privacy_delta(module: Any) -> float | None:
    """δ of the module's privacy reports: its trainer's privacy callback's, else the one saved with it, else None."""
    trainer = getattr(module, "_trainer", None)
    for cb in trainer.callbacks if trainer is not None else ():
        if getattr(cb, "charges_privacy_ledger", False) and getattr(cb, "delta", None) is not None:
            return float(cb.delta)
    return getattr(module, "_saved_delta", None)


def _number(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def ledger_delta(ledger: PrivacyLedger, delta: float | None) -> float | None:
    """δ of a ledger's reports: ``delta`` if given, else the unit's default for the last fit's sampling, else None."""
    if delta is not None:
        return float(delta)
    samplings = [s.sampling for s in ledger.segments if s.sampling is not None]
    if not samplings:
        return None
    from lightning_dprel.core.checks import resolve_delta

    last = samplings[-1]
    return resolve_delta(None, last.unit, last.units, population=last.population, warn=False)


def ledger_epsilon(ledger: PrivacyLedger, delta: float | None) -> float:
    """ε of everything in ``ledger`` at δ (``inf`` after an un-noised step; 0 before any release or without a δ)."""
    if delta is None:
        return math.inf if ledger.unprotected_steps else 0.0
    return float(ledger.epsilon(delta))


def ledger_bounds(ledger: PrivacyLedger, delta: float | None) -> dict[str, Any] | None:
    """``privacy.json``'s ``epsilon_bounds``: both valid bounds at δ and which one ε is (None without a δ)."""
    if delta is None:
        return None
    if math.isinf(ledger_epsilon(ledger, delta)):
        return {"bound": "none", "rdp": _number(math.inf), "pld": None}
    b = ledger.epsilon_bounds(delta)
    return {"bound": b["bound"], "rdp": _number(b["rdp"]), "pld": None if b["pld"] is None else _number(b["pld"])}


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


class LedgerModule(LightningModule):
    """Base of every private model: ledger, keyed noise, ``charge(event)``, checkpoint keys, report and export.

    Subclasses fill three hooks: :meth:`released_weights` (what :meth:`export` writes), :meth:`privacy_details` (their
    fields of ``privacy.json``) and, for releases that are not optimizer steps, :meth:`planned_releases` and
    :meth:`calibrate_releases` (read by the privacy callback before the first release).
    """

    def _setup_ledger(self, *, noise_seed: int | None, stream: str = "noise") -> None:
        """Create the ledger and the keyed noise stream (call from ``__init__``)."""
        if noise_seed is not None and (isinstance(noise_seed, bool) or not isinstance(noise_seed, int) or noise_seed < 0):
            raise ValueError(f"`noise_seed` must be a non-negative int or None, got {noise_seed!r}.")
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

    # --- releases ---------------------------------------------------------------------------------------
    def charge(self, event: GaussianRelease) -> None:
        """Charge a release that is not an optimizer step (a noised statistic, a PATE answer) to the ledger."""
        if not isinstance(event, GaussianRelease):
            raise TypeError(
                f"{type(self).__name__}.charge takes a release that is not an optimizer step (GaussianRelease), got "
                f"{type(event).__name__}; optimizer steps are charged by the DP optimizer itself."
            )
        self.privacy_ledger.charge(event)

    def planned_releases(self) -> list[GaussianRelease] | None:
        """The releases this fit will charge before training, at the current σ (None: the fit takes DP-SGD steps)."""
        return None

    def calibrate_releases(self, target_epsilon: float, delta: float) -> None:
        """Set the noise of :meth:`planned_releases` so that, with what was spent, they end at ``target_epsilon``."""
        raise NotImplementedError(f"{type(self).__name__} plans no releases to calibrate.")

    def on_fit_start(self) -> None:
        """Refuse a private fit nothing tracks (before any release); each fit states its sampling anew."""
        self._fit_opened = False
        self._check_tracked()

    @property
    def fit_opened(self) -> bool:
        """Whether this fit's sampling is stated in the ledger (:meth:`open_fit` ran)."""
        return getattr(self, "_fit_opened", False)

    def open_fit(self, sampling: Any, noise: Any = None) -> None:
        """State this fit's sampling in the ledger and check the mechanism for its unit: once per fit, by the privacy
        callback (first) or the module."""
        if self.fit_opened:
            return
        self.privacy_ledger.open(sampling)
        if noise is not None:
            self.privacy_ledger.check_mechanism(noise.mechanism, noise.clipping)
        self._fit_opened = True
        self.charge_data_releases(self.trainer.datamodule)

    def charge_data_releases(self, datamodule: Any) -> None:
        """Charge the releases made on ``datamodule``'s data before training (each once per model)."""
        self.privacy_ledger.charge_data_releases(getattr(datamodule, "data_releases", ()))

    @property
    def is_private(self) -> bool:
        """Whether this model adds noise (a non-private baseline needs no privacy callback)."""
        return True

    @property
    def declared_delta(self) -> float | None:
        """The δ this model was configured for (a release-making model calibrates to it); None: the callback's."""
        return None

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

    # --- what the model spent ---------------------------------------------------------------------------
    def report_delta(self, delta: float | None = None) -> float | None:
        """δ of this model's reports: the argument, else the privacy callback's or the saved one, else the unit's default."""
        return ledger_delta(self.privacy_ledger, delta if delta is not None else privacy_delta(self))

    def epsilon(self, delta: float | None = None) -> float:
        """ε of everything in the ledger at δ (``inf`` after an un-noised step; 0 before any release)."""
        return ledger_epsilon(self.privacy_ledger, self.report_delta(delta))

    def epsilon_bounds(self, delta: float | None = None) -> dict[str, Any] | None:
        """Both valid upper bounds at δ and which one :meth:`epsilon` reports (``privacy.json``'s ``epsilon_bounds``):
        ``{"bound": "pld" | "rdp", "rdp": ε, "pld": ε or None (no proven dominating pair)}``; None without a δ."""
        delta = self.report_delta(delta)
        if delta is not None and math.isinf(self.epsilon(delta)):  # an un-noised release, or a view not covered
            return {"bound": "none", "rdp": _number(math.inf), "pld": None}
        return ledger_bounds(self.privacy_ledger, delta)

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
