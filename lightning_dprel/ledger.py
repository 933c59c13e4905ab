"""The privacy ledger: what every private step spent, run-length encoded, held by the model (Algorithm 3).

The optimizer emits one :class:`StepRecord` per step — the σ and C the noise was actually drawn with, the
clipping, the expected batch — and the module charges it here together with the fit's
:class:`~lightning_dprel.specs.SamplingSpec`. The ledger is part of the module's checkpoint, so a second
``fit``, a resume, or a fit without the privacy callback continues from what was spent; the accountant
composes the ledger (RDP adds over segments with different σ, C or sampling). A step without noise is
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
from lightning_dprel.accounting.mechanisms import check_accounting_choice, check_module_mechanism
from lightning_dprel.specs import NoiseSpec, SamplingSpec

__all__ = ["StepRecord", "Segment", "PrivacyLedger"]


@dataclass(frozen=True)
class StepRecord:
    """One private step as the optimizer ran it (Algorithm 3, lines 4-6).

    Attributes:
        mechanism: the accountant mechanism of the module's clipping and accounting (``"none"``: baseline).
        noise_multiplier: σ; the noise drawn had std ``noise_std`` = σ·C (0 when σ = 0).
        clip_norm: C. clipping: ``"freq"``, ``"standard"`` or ``"none"``.
        noise_std: the standard deviation the Gaussian was drawn with.
        expected_batch_size: the b the clipped, noised sum was divided by.
    """

    mechanism: str
    noise_multiplier: float
    clip_norm: float
    clipping: str
    noise_std: float
    expected_batch_size: float

    @classmethod
    def from_spec(cls, spec: NoiseSpec, expected_batch_size: float) -> "StepRecord":
        """The record of a step that drew N(0, (σC)²I) per ``spec`` (for modules with their own optimizer)."""
        std = spec.noise_multiplier * spec.clip_norm if spec.noise_multiplier > 0.0 else 0.0
        return cls(spec.mechanism, spec.noise_multiplier, spec.clip_norm, spec.clipping, std, float(expected_batch_size))


@dataclass(frozen=True)
class Segment:
    """``steps`` consecutive steps with the same facts."""

    mechanism: str
    sampling: SamplingSpec | None
    noise_multiplier: float
    clip_norm: float
    clipping: str
    steps: int

    def same_run(self, other: "Segment") -> bool:
        return (self.mechanism, self.sampling, self.noise_multiplier, self.clip_norm, self.clipping) == (
            other.mechanism, other.sampling, other.noise_multiplier, other.clip_norm, other.clipping
        )


class PrivacyLedger:
    """Every step's (σ, C, clipping, sampling), in order; the one record of what a model has spent.

    ``open(sampling)`` states how the current fit samples; ``charge(record)`` appends a step. Changing σ, C
    or the sampling starts a new segment; changing the clipping mechanism after private steps is refused
    (one accountant composes one mechanism's bound). A private step charged while no sampling is stated
    (an untracked fit without a datamodule SamplingSpec) is kept with ``sampling=None`` and makes ε infinite.
    """

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._cache: dict[tuple, tuple[Accountant, int, int]] = {}  # (mechanism, orders) → (acc, segment, steps done)
        self.sampling: SamplingSpec | None = None

    # --- writing -------------------------------------------------------------------------------------
    def open(self, sampling: SamplingSpec | None) -> None:
        """Set the sampling of the steps charged from now on (each fit states it before its first step)."""
        if sampling is not None and not isinstance(sampling, SamplingSpec):
            raise TypeError(f"`sampling` must be a SamplingSpec or None, got {type(sampling).__name__}.")
        self.sampling = sampling

    def check_mechanism(self, mechanism: str, clipping: str) -> None:
        """Refuse a run whose mechanism differs from the private steps already in the ledger."""
        if mechanism != "none":
            check_module_mechanism(mechanism, clipping)
        spent = self.private_mechanism
        if spent is not None and mechanism not in ("none", spent):
            raise ValueError(
                f"This model already spent {self.private_steps} private steps accounted with {spent!r}; it cannot "
                f"continue with {mechanism!r} (clipping={clipping!r}). Keep the clipping and accounting of the "
                "earlier fits, or start from a fresh model."
            )

    def charge(self, record: StepRecord) -> None:
        """Append one step. Raises if the record contradicts itself or the ledger's sampling."""
        if not isinstance(record, StepRecord):
            raise TypeError(f"`record` must be a StepRecord, got {type(record).__name__}.")
        private = record.mechanism != "none" and record.noise_multiplier > 0.0
        drawn = record.noise_multiplier * record.clip_norm if record.noise_multiplier > 0.0 else 0.0
        if not math.isclose(record.noise_std, drawn, rel_tol=1e-12, abs_tol=0.0):
            raise RuntimeError(
                f"Step record: noise drawn with std {record.noise_std} but σ·C = {drawn}; the accountant would charge "
                "a σ the noise did not have."
            )
        sampling = self.sampling
        last = self._segments[-1] if self._segments else None
        if private:
            if last is None or (last.mechanism, last.clipping) != (record.mechanism, record.clipping):
                self.check_mechanism(record.mechanism, record.clipping)  # once per new run of steps
            if sampling is not None and not math.isclose(record.expected_batch_size, sampling.expected_batch_size, rel_tol=1e-9):
                raise RuntimeError(
                    f"The step divided by b = {record.expected_batch_size}, the SamplingSpec says "
                    f"b = {sampling.expected_batch_size}; batches and accounting must come from the same datamodule."
                )
        seg = Segment(
            record.mechanism if private else "none", sampling if private else None,
            float(record.noise_multiplier), float(record.clip_norm), record.clipping, 1,
        )
        if last is not None and last.same_run(seg):
            self._segments[-1] = replace(last, steps=last.steps + 1)
        else:
            self._segments.append(seg)

    # --- reading -------------------------------------------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(self._segments)

    @property
    def steps(self) -> int:
        """Every step taken by this model, private or not (the one step counter of a private run)."""
        return sum(s.steps for s in self._segments)

    @property
    def private_steps(self) -> int:
        return sum(s.steps for s in self._segments if s.mechanism != "none")

    @property
    def unprotected_steps(self) -> int:
        """Steps without noise, or whose sampling is unknown (an untracked fit without a SamplingSpec): any makes ε infinite."""
        return sum(s.steps for s in self._segments if s.mechanism == "none" or s.sampling is None)

    @property
    def private_mechanism(self) -> str | None:
        names = {s.mechanism for s in self._segments if s.mechanism != "none"}
        return next(iter(names)) if names else None

    @property
    def last_noise_multiplier(self) -> float | None:
        return self._segments[-1].noise_multiplier if self._segments else None

    def _mechanism_name(self, mechanism: str | None) -> str:
        spent = self.private_mechanism
        name = mechanism or spent or "freq_corrected"
        if spent is not None and name != spent:
            check_accounting_choice(spent, name)
        return name

    def accountant(self, *, mechanism: str | None = None, orders: object = None) -> Accountant:
        """A fresh :class:`Accountant` holding every accountable private step (``mechanism`` may name a stand-in)."""
        acc = Accountant(self._mechanism_name(mechanism), orders=orders)
        self._replay(acc, 0, 0)
        return acc

    def composed(self, *, mechanism: str | None = None, orders: object = None) -> Accountant:
        """Like :meth:`accountant`, but one cached accountant brought up to date with the steps charged since the
        last call (the callback asks after every step). Read it; do not step it."""
        name = self._mechanism_name(mechanism)
        key = (name, None if orders is None else tuple(float(a) for a in orders))
        acc, index, done = self._cache.get(key) or (Accountant(name, orders=orders), 0, 0)
        self._cache[key] = (acc, *self._replay(acc, index, done))
        return acc

    def _replay(self, acc: Accountant, index: int, done: int) -> tuple[int, int]:
        """Step ``acc`` through segments[index:], of which ``done`` steps of the first are in it already."""
        for i in range(index, len(self._segments)):
            seg, skip = self._segments[i], (done if i == index else 0)
            if seg.mechanism != "none" and seg.sampling is not None and seg.steps > skip:
                acc.step(seg.sampling, seg.noise_multiplier, seg.steps - skip)
        return (len(self._segments) - 1, self._segments[-1].steps) if self._segments else (0, 0)

    def epsilon(self, delta: float, *, mechanism: str | None = None, orders: object = None) -> float:
        """ε of everything spent at δ (``inf`` if any step ran without noise, 0 before any step)."""
        if self.unprotected_steps:
            return math.inf
        if not self.private_steps:
            return 0.0
        return float(self.composed(mechanism=mechanism, orders=orders).get_epsilon(delta))

    # --- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python (SamplingSpecs as dicts): safe to store in a checkpoint; holds no secret."""
        return {
            "version": 1,
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
            segments.append(Segment(raw["mechanism"], sampling, float(raw["noise_multiplier"]), float(raw["clip_norm"]),
                                    raw["clipping"], int(raw["steps"])))
        self._segments = segments
        self._cache.clear()

    def __repr__(self) -> str:
        return f"PrivacyLedger(steps={self.steps}, private={self.private_steps}, segments={len(self._segments)})"


def _fields(seg: Segment) -> dict[str, Any]:
    """A segment's fields, the SamplingSpec kept as is (``dataclasses.asdict`` would convert it)."""
    return {f: getattr(seg, f) for f in ("mechanism", "sampling", "noise_multiplier", "clip_norm", "clipping", "steps")}

