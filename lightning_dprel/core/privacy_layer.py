"""The privacy layer every private model has: one protocol, for a library model and a user's own.

A library model IS its layer (:class:`~lightning_dprel.core.ledger_module.LedgerModule`, and the
DP-SGD :class:`~lightning_dprel.core.private_module.PrivateModule` on it); a plain LightningModule
gets one attached by the privacy callback (:class:`~lightning_dprel.core.attached.AttachedDPSGD`).
:class:`PrivacyLayer` states and implements what both share, and the callback reads nothing else:
the ledger, ``charge``, the noise spec and σ, the fit's sampling (``open_fit``), the releases made
on the data, the planned releases, ε.

References:
    Opacus ``PrivacyEngine`` (one accountant per model, the noise in the optimizer);
    dp-accounting ``dp_event.py`` (a release is an event; events compose).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec

__all__ = ["PrivacyLayer", "sample_token", "privacy_delta", "ledger_delta", "ledger_epsilon",
           "ledger_bounds", "number"]


def sample_token(trainer: Any) -> object:
    """The training batch being processed (None outside training): releases charged with one token
    are one step on one sample. Lightning's batch counter: a model may step several DP optimizers
    on one batch without passing it along, and no subclass hook can skip the counter."""
    if trainer is None or not trainer.training:
        return None
    return (id(trainer), trainer.fit_loop.epoch_loop.batch_progress.total.ready)


def privacy_delta(model: Any) -> float | None:
    """δ of a model's reports: its trainer's privacy callback's, else the one saved with it."""
    trainer = getattr(model, "_trainer", None)
    for cb in trainer.callbacks if trainer is not None else ():
        if getattr(cb, "charges_privacy_ledger", False) and getattr(cb, "delta", None) is not None:
            return float(cb.delta)
    return getattr(model, "_saved_delta", None)


def number(x: float) -> float | str:
    """A float for JSON: ``"inf"`` for an infinite one."""
    return x if math.isfinite(x) else "inf"


def ledger_delta(ledger: PrivacyLedger, delta: float | None) -> float | None:
    """δ of a ledger's reports: ``delta``, else the unit's default for the last fit's sampling."""
    if delta is not None:
        return float(delta)
    samplings = [s.sampling for s in ledger.segments if s.sampling is not None]
    if not samplings:
        return None
    from lightning_dprel.core.checks import resolve_delta

    last = samplings[-1]
    return resolve_delta(None, last.unit, last.units, population=last.population, warn=False)


def ledger_epsilon(ledger: PrivacyLedger, delta: float | None) -> float:
    """ε of ``ledger`` at δ (``inf`` after an un-noised step; 0 before any release or without δ)."""
    if delta is None:
        return math.inf if ledger.unprotected_steps else 0.0
    return float(ledger.epsilon(delta))


def ledger_bounds(ledger: PrivacyLedger, delta: float | None) -> dict[str, Any] | None:
    """``privacy.json``'s ``epsilon_bounds``: both bounds at δ and which one ε is (None: no δ)."""
    if delta is None:
        return None
    if math.isinf(ledger_epsilon(ledger, delta)):
        return {"bound": "none", "rdp": number(math.inf), "pld": None}
    b = ledger.epsilon_bounds(delta)
    pld = None if b["pld"] is None else number(b["pld"])
    return {"bound": b["bound"], "rdp": number(b["rdp"]), "pld": pld}


class PrivacyLayer(ABC):
    """What every private model has: its ledger, charges, noise spec and σ, fit sampling and ε.

    A layer that takes DP-SGD steps keeps its noise spec in its DP optimizer (``_dp_optimizer``;
    ``_noise_spec`` until one is built) and charges each step with :meth:`_charge`; a layer that
    releases otherwise (PATE answers) has no noise spec and declares its releases
    (:meth:`planned_releases`).
    """

    #: Noised releases one training batch makes on its sample (e.g. 2 for two tables stepped apart).
    releases_per_sample: int = 1
    privacy_ledger: PrivacyLedger
    _trainer: Any = None
    _dp_optimizer: Any = None
    _noise_spec: NoiseSpec | None = None
    _fit_opened: bool = False
    _saved_delta: float | None = None

    # --- σ and C ---------------------------------------------------------------------------------
    @property
    def noise_spec(self) -> NoiseSpec | None:
        """σ, C, clipping, accounting: the DP optimizer's once built; None without DP-SGD steps."""
        dp = self._dp_optimizer
        return dp.noise_spec if dp is not None else self._noise_spec

    def set_noise_multiplier(self, sigma: float) -> None:
        """Set σ for the next steps (the callback calibrates it); steps taken keep theirs."""
        if self._dp_optimizer is not None:
            self._dp_optimizer.set_noise_multiplier(float(sigma))
        elif self._noise_spec is not None:
            self._noise_spec = replace(self._noise_spec, noise_multiplier=float(sigma))
        else:
            raise ValueError(f"{type(self).__name__} takes no DP-SGD steps, so it has no σ to set; "
                             "calibrate its releases with calibrate_releases(target, delta).")

    @property
    def is_private(self) -> bool:
        """Whether this model adds noise (a non-private baseline needs no privacy callback)."""
        spec = self.noise_spec
        return True if spec is None else spec.is_private

    @property
    @abstractmethod
    def owns_clip_norm(self) -> bool:
        """Whether the model chose C itself; False when the privacy callback chose it."""

    # --- releases --------------------------------------------------------------------------------
    def charge(self, event: GaussianRelease) -> None:
        """Charge a release that is not an optimizer step (a noised statistic, a PATE answer)."""
        if not isinstance(event, GaussianRelease):
            raise TypeError(
                f"{type(self).__name__}.charge takes a release that is not an optimizer step "
                f"(GaussianRelease), got {type(event).__name__}; optimizer steps are charged by "
                "the DP optimizer itself."
            )
        self.privacy_ledger.charge(event)

    def _charge(self, record: Any) -> None:
        """Charge one optimizer release; those of one training batch are one step on one sample."""
        self.privacy_ledger.charge(record, sample=sample_token(self._trainer))

    def planned_releases(self) -> list[GaussianRelease] | None:
        """The releases this fit will charge, at the current σ (None: it takes DP-SGD steps)."""
        return None

    def calibrate_releases(self, target_epsilon: float, delta: float) -> None:
        """Set the noise of :meth:`planned_releases` so that they end at ``target_epsilon``."""
        raise NotImplementedError(f"{type(self).__name__} plans no releases to calibrate.")

    @property
    def declared_delta(self) -> float | None:
        """The δ this model was configured for (its releases calibrate to it), else None."""
        return None

    # --- the fit ---------------------------------------------------------------------------------
    @property
    def fit_opened(self) -> bool:
        """Whether this fit's sampling is stated in the ledger (:meth:`open_fit` ran)."""
        return self._fit_opened

    def open_fit(self, sampling: SamplingSpec | None, noise: NoiseSpec | None = None) -> None:
        """State this fit's sampling in the ledger, check the mechanism for its unit and charge the
        releases made on the data (each once per model): once per fit, by the callback (first) or
        the model."""
        if self._fit_opened:
            return
        self.privacy_ledger.open(sampling)
        if noise is not None:
            self.privacy_ledger.check_mechanism(noise.mechanism, noise.clipping)
        banded = getattr(self._dp_optimizer, "correlation", None)
        if banded is not None and sampling is not None:  # the sampler's partitions must be the noise's bands
            from lightning_dprel.accounting.mechanisms.banded import check_cyclic_sampling

            check_cyclic_sampling(sampling, banded.bands)
        self._fit_opened = True
        self.charge_data_releases(self._trainer.datamodule)

    def charge_data_releases(self, datamodule: Any) -> None:
        """Charge the releases made on ``datamodule``'s data before training (once per model)."""
        self.privacy_ledger.charge_data_releases(getattr(datamodule, "data_releases", ()))

    def save_layer(self, checkpoint: dict[str, Any]) -> None:
        """Write what a checkpoint keeps of the layer that the model does not save itself."""

    def close_fit(self, *, failed: bool = False) -> None:
        """End of a fit (``failed``: after an error); the ledger stays readable."""

    # --- what the model spent --------------------------------------------------------------------
    def report_delta(self, delta: float | None = None) -> float | None:
        """δ of the reports: the argument, else the callback's or the saved one, else the unit's."""
        given = delta if delta is not None else privacy_delta(self)
        return ledger_delta(self.privacy_ledger, given)

    def epsilon(self, delta: float | None = None) -> float:
        """ε of everything in the ledger at δ (``inf`` after an un-noised step; 0 before any)."""
        return ledger_epsilon(self.privacy_ledger, self.report_delta(delta))

    def epsilon_bounds(self, delta: float | None = None) -> dict[str, Any] | None:
        """Both valid upper bounds at δ and which one :meth:`epsilon` reports:
        ``{"bound": "pld" | "rdp", "rdp": ε, "pld": ε or None (no proven dominating pair)}``."""
        return ledger_bounds(self.privacy_ledger, self.report_delta(delta))
