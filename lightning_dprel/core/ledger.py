"""The privacy ledger: every release a model made, run-length encoded, held by the model (Algorithm 3).

The optimizer emits one :class:`~lightning_dprel.core.events.StepRecord` per noised release — the σ and C the noise was
actually drawn with, the clipping, the expected batch — and the module charges it here together with the fit's
:class:`~lightning_dprel.core.specs.SamplingSpec`. Releases charged with the same ``sample`` token (two optimizers, or two
steps, on one batch) are one :class:`~lightning_dprel.core.events.SampledGaussianStep` with σ_eff = (Σσ_r⁻²)^(-1/2);
releases that are not optimizer steps (:class:`~lightning_dprel.core.events.GaussianRelease`) are charged as themselves.
Every event must be for one privacy unit: the datamodule's (:class:`~lightning_dprel.core.specs.PrivacyUnit`), which the
mechanism must be proven for. The ledger is part of the module's checkpoint, so a second
``fit``, a resume, or a fit without the privacy callback continues from what was spent; the accountant
composes the ledger (RDP adds over segments with different σ, C or sampling; PLDs compose by convolution). A step without noise is
recorded too, and makes ε infinite.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 and Theorem D.1. Opacus ``accountants/accountant.py`` (history of steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from lightning_dprel.accounting import Accountant
from lightning_dprel.accounting.mechanisms import (
    check_accounting_choice, check_fit_sampling, check_module_mechanism, check_unit, get_mechanism,
)
from lightning_dprel.core.events import GaussianRelease, SampledGaussianStep, StepRecord
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["StepRecord", "Segment", "PrivacyLedger"]


@dataclass(frozen=True)
class Segment:
    """``steps`` consecutive events with the same facts (``noise_multiplier`` is the σ charged: σ_eff of the
    ``releases`` noised sums of one sample; ``unit`` the privacy unit they are charged for)."""

    mechanism: str
    sampling: SamplingSpec | None
    noise_multiplier: float
    clip_norm: float
    clipping: str
    steps: int
    releases: int = 1
    unit: str | None = None

    def same_run(self, other: "Segment") -> bool:
        return _key(self) == _key(other)


class PrivacyLedger:
    """Every event's (σ, C, clipping, sampling, unit), in order; the one record of what a model has spent.

    ``open(sampling)`` states how the current fit samples; ``charge(record, sample=token)`` appends a release (those
    with the token of the previous one merge into one step on one sample); ``charge(GaussianRelease(...))`` appends a
    release that is not an optimizer step. Changing σ, C or the sampling starts a new segment; changing the clipping
    mechanism of optimizer steps after private steps is refused, and so is any event for another privacy unit. A
    private step charged while no sampling is stated (an untracked fit without a datamodule SamplingSpec) is kept
    with ``sampling=None`` and makes ε infinite.
    """

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._cache: dict[tuple, tuple[Accountant, int, int]] = {}  # (mechanism, orders) → (acc, segment, steps done)
        self._reads: dict[Any, Any] = {}  # reads (composed()'s accountant, step counts) until the next charge
        self._names: dict[str | None, str] = {}  # composed()'s checked mechanism, until a new kind of segment
        self.sampling: SamplingSpec | None = None
        self._sample: object = None  # token of the sample the last release was made on
        self._sample_records: list[StepRecord] = []
        self._checked: tuple[str, str] | None = None  # (mechanism, clipping) checked for this fit's sampling
        self._release_ids: set[str] = set()  # data releases already charged (they travel with the data)

    # --- writing -------------------------------------------------------------------------------------
    def open(self, sampling: SamplingSpec | None) -> None:
        """Set the sampling of the steps charged from now on (each fit states it before its first step)."""
        if sampling is not None and not isinstance(sampling, SamplingSpec):
            raise TypeError(f"`sampling` must be a SamplingSpec or None, got {type(sampling).__name__}.")
        unit = self.unit
        if sampling is not None and unit is not None and sampling.privacy_unit != unit:
            raise ValueError(
                f"Privacy unit mismatch: this model's ledger charged releases for the unit {unit!r}; the new data is "
                f"sampled for {sampling.privacy_unit!r}. One ledger composes releases for one unit only."
            )
        spent = self.private_mechanism
        if spent is not None and get_mechanism(spent).compositions is not None:  # composed per run (⌈n/b⌉): one fit
            raise ValueError(
                f"This model already took {self.private_steps} steps accounted with {spent!r}, whose steps compose per "
                "run (banded correlated noise: the sampler's partitions and the noise start afresh in each fit), so a "
                "second fit or a resume is refused. Train it in one fit, or start from a fresh model."
            )
        self.sampling = sampling
        self._sample, self._sample_records = None, []
        self._checked = None

    def check_mechanism(self, mechanism: str, clipping: str) -> None:
        """Refuse a run whose mechanism differs from the private steps already in the ledger, or is proven for
        another privacy unit than the stated sampling's."""
        if mechanism != "none":
            check_module_mechanism(mechanism, clipping)
            if self.sampling is not None:
                check_fit_sampling(mechanism, self.sampling)
        spent = self.private_mechanism
        if spent is not None and mechanism not in ("none", spent):
            raise ValueError(
                f"This model already spent {self.private_steps} private steps accounted with {spent!r}; it cannot "
                f"continue with {mechanism!r} (clipping={clipping!r}). Keep the clipping and accounting of the "
                "earlier fits, or start from a fresh model."
            )
        self._checked = (mechanism, clipping)

    def charge(self, event: "StepRecord | GaussianRelease", *, sample: object = None) -> None:
        """Append one release. A :class:`StepRecord` with the same non-None ``sample`` token as the previous one is
        merged with it into one :class:`SampledGaussianStep`. Raises if the event contradicts itself or the ledger."""
        if isinstance(event, GaussianRelease):
            return self._charge_release(event)
        if not isinstance(event, StepRecord):
            raise TypeError(f"`event` must be a StepRecord or GaussianRelease, got {type(event).__name__}.")
        event.check()
        if sample is not None and sample == self._sample and self._sample_records:
            step = SampledGaussianStep((*self._sample_records, event))
            self._undo_last_step()
        else:
            step = SampledGaussianStep((event,))
        self._charge_step(step)
        self._sample, self._sample_records = sample, list(step.records)

    def charge_once(self, event: GaussianRelease, release_id: str) -> bool:
        """Charge a release made on the data (it travels with the data) unless this ledger already holds its id."""
        if release_id in self._release_ids:
            return False
        self.charge(event)
        self._release_ids.add(str(release_id))
        return True

    def charge_data_releases(self, releases: Any) -> None:
        """Charge the releases made on a datamodule's data ((id, event) pairs that travel with it), each once."""
        for release_id, event in releases:
            self.charge_once(event, release_id)

    def _charge_step(self, step: SampledGaussianStep) -> None:
        sampling = self.sampling
        record = step.records[-1]
        if step.is_private:
            if (record.mechanism, record.clipping) != self._checked:
                self.check_mechanism(record.mechanism, record.clipping)  # once per fit (open() forgets the check)
            if sampling is not None and not math.isclose(record.expected_batch_size, sampling.expected_batch_size, rel_tol=1e-9):
                raise RuntimeError(
                    f"The step divided by b = {record.expected_batch_size}, the SamplingSpec says "
                    f"b = {sampling.expected_batch_size}; batches and accounting must come from the same datamodule."
                )
        private = step.is_private
        self._append(Segment(
            step.mechanism, sampling if private else None, float(step.noise_multiplier if private else record.noise_multiplier),
            float(record.clip_norm), record.clipping, 1, step.releases, sampling.privacy_unit if private and sampling else None,
        ))

    def _charge_release(self, event: GaussianRelease) -> None:
        unit = self.unit or (self.sampling.privacy_unit if self.sampling is not None else None)
        if unit is not None and event.unit != unit:
            raise ValueError(
                f"Privacy unit mismatch: a GaussianRelease for the unit {event.unit!r} cannot be charged to a ledger of "
                f"releases for {unit!r}."
            )
        name = event.mechanism
        self._append(Segment(name, None, float(event.noise_multiplier), 1.0, name, event.count, 1, event.unit))

    def _append(self, seg: Segment) -> None:
        last = self._segments[-1] if self._segments else None
        self._reads.clear()
        if last is not None and last.same_run(seg):  # one more step of the same run: its mechanism checks still hold
            self._segments[-1] = replace(last, steps=last.steps + seg.steps)
        else:
            self._segments.append(seg)
            self._names.clear()

    def _undo_last_step(self) -> None:
        """Take the last optimizer step back (it is charged again merged with a new release on the same sample); RDP
        composition does not depend on order, so releases charged after it may stay where they are."""
        i = max(j for j, seg in enumerate(self._segments) if _is_step(seg))
        seg = self._segments[i]
        if seg.steps > 1:
            self._segments[i] = replace(seg, steps=seg.steps - 1)
        else:
            del self._segments[i]
        self._cache.clear()
        self._reads.clear()
        self._names.clear()
        self._checked = None

    # --- reading -------------------------------------------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(self._segments)

    def _read(self, name: str, compute: Any) -> Any:
        """``compute()``, kept until the next charge (the callback reads these after every step)."""
        if name not in self._reads:
            self._reads[name] = compute()
        return self._reads[name]

    @property
    def steps(self) -> int:
        """Every step taken by this model, private or not (the one step counter of a private run)."""
        return self._read("steps", lambda: sum(s.steps for s in self._segments if _is_step(s)))

    @property
    def private_steps(self) -> int:
        return self._read("private", lambda: sum(s.steps for s in self._segments if s.mechanism != "none" and _is_step(s)))

    @property
    def unprotected_steps(self) -> int:
        """Steps without noise, or whose sampling is unknown (an untracked fit without a SamplingSpec): any makes ε infinite."""
        return self._read("unprotected", lambda: sum(s.steps for s in self._segments
                                                     if s.mechanism == "none" or (s.sampling is None and _is_step(s))))

    @property
    def private_mechanism(self) -> str | None:
        """The mechanism of the private optimizer steps (None before any)."""
        names = {s.mechanism for s in self._segments if s.mechanism != "none" and _is_step(s)}
        return next(iter(names)) if names else None

    @property
    def unit(self) -> str | None:
        """The privacy unit every charged release is for (None before any accountable release)."""
        return next((s.unit for s in self._segments if s.unit is not None), None)

    @property
    def last_noise_multiplier(self) -> float | None:
        """σ charged for the last step (σ_eff when several noised sums were released on its sample)."""
        return self._segments[-1].noise_multiplier if self._segments else None

    @property
    def last_releases(self) -> int:
        """Noised sums released on the last step's sample (1 for one optimizer step per batch)."""
        return self._segments[-1].releases if self._segments else 1

    @property
    def accountable(self) -> bool:
        """Whether any accounted release (a noised step or event) was charged."""
        return self._read("accountable", lambda: any(s.mechanism != "none" for s in self._segments))

    def _mechanism_name(self, mechanism: str | None) -> str:
        spent = self.private_mechanism
        name = mechanism or spent or next((s.mechanism for s in self._segments if s.mechanism != "none"), None)
        if name is None:
            raise ValueError("The ledger holds no accountable release yet: name the `mechanism` to account with.")
        if spent is not None and name != spent:
            check_accounting_choice(spent, name)
        if self.unit is not None and (spent is not None or mechanism is not None):
            check_unit(name, self.unit)
        return name

    def accountant(self, *, mechanism: str | None = None, orders: object = None, accountant: str = "pld") -> Accountant:
        """A fresh :class:`Accountant` holding every accountable private step (``mechanism`` may name a stand-in;
        ``accountant`` "pld" reports the smaller of the PLD and RDP bounds, "rdp" the RDP bound only)."""
        acc = Accountant(self._mechanism_name(mechanism), orders=orders, accountant=accountant)
        self._replay(acc, 0, 0)
        return acc

    def composed(self, *, mechanism: str | None = None, orders: object = None, accountant: str = "pld") -> Accountant:
        """Like :meth:`accountant`, but one cached accountant brought up to date with the steps charged since the
        last call (the callback asks after every step). Read it; do not step it."""
        asked = (mechanism, None if orders is None else tuple(float(a) for a in orders), accountant)
        if asked in self._reads:  # nothing charged since it was answered (the callback asks twice per step)
            return self._reads[asked]
        name = self._names.get(mechanism) or self._names.setdefault(mechanism, self._mechanism_name(mechanism))
        key = (name, *asked[1:])
        acc, index, done = self._cache.get(key) or (Accountant(name, orders=orders, accountant=accountant), 0, 0)
        self._cache[key] = (acc, *self._replay(acc, index, done))
        self._reads[asked] = acc
        return acc

    def _replay(self, acc: Accountant, index: int, done: int) -> tuple[int, int]:
        """Step ``acc`` through segments[index:], of which ``done`` steps of the first are in it already (each event
        by its own mechanism; the optimizer steps' by ``acc.mechanism``, which is theirs or stands in for it)."""
        for i in range(index, len(self._segments)):
            seg, skip = self._segments[i], (done if i == index else 0)
            step = _is_step(seg)
            accountable = seg.mechanism != "none" and (seg.sampling is not None or not step)
            if accountable and seg.steps > skip:
                name = acc.mechanism if step else seg.mechanism
                acc.step(seg.sampling, seg.noise_multiplier, seg.steps - skip, mechanism=name)
        return (len(self._segments) - 1, self._segments[-1].steps) if self._segments else (0, 0)

    def epsilon_bounds(self, delta: float, *, mechanism: str | None = None, orders: object = None,
                       accountant: str = "pld") -> dict[str, Any]:
        """Both bounds at δ (``{"epsilon", "bound", "rdp", "pld"}``; ε infinite after an un-noised step, 0 before any)."""
        if self.unprotected_steps:
            return {"epsilon": math.inf, "bound": "none", "rdp": math.inf, "pld": None}
        if not self.accountable:
            return {"epsilon": 0.0, "bound": "none", "rdp": 0.0, "pld": None}
        return self.composed(mechanism=mechanism, orders=orders, accountant=accountant).epsilon_bounds(delta)

    def epsilon(self, delta: float, *, mechanism: str | None = None, orders: object = None, accountant: str = "pld",
                live: bool = False, target: float | None = None) -> float:
        """ε of everything spent at δ (``inf`` if any step ran without noise, 0 before any step): the smaller valid
        bound. ``live``: an upper bound on it that is cheap after every step (:meth:`Accountant.live_epsilon`, which
        takes the budget ``target``)."""
        if live and not self.unprotected_steps and self.accountable:
            acc = self.composed(mechanism=mechanism, orders=orders, accountant=accountant)
            return float(acc.live_epsilon(delta, target=target))
        return float(self.epsilon_bounds(delta, mechanism=mechanism, orders=orders, accountant=accountant)["epsilon"])

    def after(self, events: "list[GaussianRelease]") -> "PrivacyLedger":
        """A copy of this ledger with ``events`` charged too (what spending them would cost; this ledger is unchanged)."""
        copy = PrivacyLedger()
        copy.load_state_dict(self.state_dict())  # ids included
        for event in events:
            copy.charge(event)
        return copy

    # --- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python (SamplingSpecs as dicts): safe to store in a checkpoint; holds no secret."""
        return {
            "version": 2,
            "data_releases": sorted(self._release_ids),
            "segments": [
                {**_fields(s), "sampling": None if s.sampling is None else s.sampling.to_dict()}
                for s in self._segments
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or "segments" not in state:
            raise ValueError("PrivacyLedger.load_state_dict needs the dict from state_dict() (with 'segments').")
        segments = []
        for raw in state["segments"]:
            sampling = None if raw["sampling"] is None else SamplingSpec(**raw["sampling"])
            unit = raw.get("unit", sampling.privacy_unit if sampling is not None else None)
            segments.append(Segment(raw["mechanism"], sampling, float(raw["noise_multiplier"]), float(raw["clip_norm"]),
                                    raw["clipping"], int(raw["steps"]), int(raw.get("releases", 1)), unit))
        self._segments = segments
        self._release_ids = set(state.get("data_releases", ()))
        self._checked = None  # the loaded releases are checked anew against the next record
        self._cache.clear()
        self._reads.clear()
        self._names.clear()
        self._sample, self._sample_records = None, []

    def __repr__(self) -> str:
        return f"PrivacyLedger(steps={self.steps}, private={self.private_steps}, segments={len(self._segments)})"


def _fields(seg: Segment) -> dict[str, Any]:
    """A segment's fields, the SamplingSpec kept as is (``dataclasses.asdict`` would convert it)."""
    return {f: getattr(seg, f) for f in _FIELDS}


_FIELDS = ("mechanism", "sampling", "noise_multiplier", "clip_norm", "clipping", "steps", "releases", "unit")


def _is_step(seg: Segment) -> bool:
    """Optimizer steps (and un-noised ones) need a sampling; releases without sampling (a noised statistic) do not."""
    return seg.mechanism == "none" or get_mechanism(seg.mechanism).needs_sampling


def _key(seg: Segment) -> tuple:
    return tuple(getattr(seg, f) for f in _FIELDS if f != "steps")

