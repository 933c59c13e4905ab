"""The facts the accountant needs, as frozen records (one fact, one place).

A datamodule tells the accountant *how it samples* (:class:`SamplingSpec`); a module tells it *how
it clips and noises* (:class:`NoiseSpec`). The privacy callback reads both and never guesses either.

Compatibility rule (after dp_accounting's ``dp_event.py``): fields are never removed and never
change meaning; new fields arrive optional, with a default that keeps the old meaning.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any, ClassVar

from lightning_dprel.core.checks import check_int as _check_int
from lightning_dprel.core.clipping_modes import chosen_mechanism, clipping_mode
from lightning_dprel.core.discovery import MethodRegistry
from lightning_dprel.core.units import EXAMPLE, PRIVACY_UNITS, PrivacyUnit, privacy_unit
from lightning_dprel.core.units import register_privacy_unit

__all__ = [
    "SamplingSpec",
    "SamplingDetail",
    "register_sampling_detail",
    "NoiseSpec",
    "PrivacyUnit",
    "PRIVACY_UNITS",
    "EXAMPLE",
    "privacy_unit",
    "register_privacy_unit",
]


class SamplingDetail:
    """What a sampling adds to :class:`SamplingSpec` beyond the facts every accountant reads; owned
    by its family.

    A frozen dataclass subclass, registered with :func:`register_sampling_detail`. Its fields are
    saved in the record's flat form (:meth:`SamplingSpec.to_dict`) under their own names, after the
    generic facts they stand next to.
    """

    #: The unit a record with this detail is for when it names none (None: the record must name
    #: one).
    default_unit: ClassVar[str | None] = None

    def check(self, spec: "SamplingSpec") -> None:
        """Raise ``ValueError`` where the detail contradicts the generic facts (run when the record
        is built)."""

    def check_draws(self, spec: "SamplingSpec") -> None:
        """Raise ``ValueError`` where one step's draws are impossible (run before a coupled
        mechanism accounts it)."""

    def units(self, spec: "SamplingSpec") -> int | None:
        """How many privacy units the data holds when the record states none (None: one per row)."""
        return None

    def bound(self, spec: "SamplingSpec") -> int:
        """The per-unit bound an accountant may charge: ``contribution_bound``, or a tighter one the
        detail proves."""
        return spec.contribution_bound


#: Detail classes by name: a saved record's extra keys are read back by the one whose fields they
#: are.
SAMPLING_DETAILS: MethodRegistry[type] = MethodRegistry("sampling details")


def register_sampling_detail(cls: type) -> type:
    """Make a :class:`SamplingDetail` dataclass known, so saved records holding its fields load
    (class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, SamplingDetail) and is_dataclass(cls)):
        raise TypeError(f"A sampling detail must be a SamplingDetail dataclass, got {cls!r}.")
    SAMPLING_DETAILS[cls.__name__] = cls
    return cls


#: The flat form's keys, in order (the saved layout, never changed: privacy.json, reports and
#: checkpoints use it); ``population`` and ``contribution_bound`` are saved under their first names.
#: A record without a detail saves one row per unit-slot and no extra draws, as it always has.
_SAVED = {
    "num_nodes": None,
    "num_edges": "population",
    "max_degree": "contribution_bound",
    "sampling_rate": "sampling_rate",
    "neg_per_pos": None,
    "expected_batch_size": "expected_batch_size",
    "steps_per_epoch": "steps_per_epoch",
    "privacy_unit": "privacy_unit",
    "num_units": "num_units",
}
_ROWS_ONLY = {"num_nodes": "population", "neg_per_pos": 0}


@dataclass(frozen=True, init=False, eq=False)
class SamplingSpec:
    """How a datamodule samples one step: the facts every accountant needs, and its family's
    :class:`SamplingDetail`.

    Each step keeps each of the ``population`` rows with probability ``sampling_rate`` γ (Poisson);
    the private step divides by ``expected_batch_size`` b = γ·population, never by the drawn count.
    One unit is in at most ``contribution_bound`` rows. ``SamplingSpec(**spec.to_dict())`` rebuilds
    a record from its saved flat form.

    Args:
        population: the rows the rate draws from (examples, or capped relations of an edge-tuple
            sampling).
        sampling_rate: γ in (0, 1]. expected_batch_size: b = γ·population. steps_per_epoch:
            ceil(1/γ) or as stated.
        contribution_bound: the most rows one unit can be in (K; 1 for one example per unit).
        privacy_unit: the name of the :class:`PrivacyUnit` this sampling is for (the neighbouring
            relation the datamodule samples for); mechanisms proven for another unit are refused.
            None: the detail's default.
        num_units: how many privacy units the private data holds (δ defaults and warnings count
            them); None: the detail's count, else one per row.
        detail: the sampling family's own facts (e.g. the negatives of an edge-tuple sampling), or
            None.
    """

    population: int
    sampling_rate: float
    expected_batch_size: float
    steps_per_epoch: int
    contribution_bound: int
    privacy_unit: str
    num_units: int | None
    detail: SamplingDetail | None

    def __init__(
        self,
        *,
        population: int | None = None,
        sampling_rate: float,
        expected_batch_size: float,
        steps_per_epoch: int,
        contribution_bound: int | None = None,
        privacy_unit: "str | PrivacyUnit | None" = None,
        num_units: int | None = None,
        detail: SamplingDetail | None = None,
        **saved: Any,
    ) -> None:
        if saved:  # the saved flat form: its extra keys are a registered detail's fields
            population, contribution_bound, detail = _from_saved(
                saved, population, contribution_bound, detail
            )
        facts = dict(
            population=population,
            sampling_rate=sampling_rate,
            expected_batch_size=expected_batch_size,
            steps_per_epoch=steps_per_epoch,
            contribution_bound=1 if contribution_bound is None else contribution_bound,
            num_units=num_units,
            detail=detail,
        )
        for key, value in facts.items():
            object.__setattr__(self, key, value)
        if detail is not None and not isinstance(detail, SamplingDetail):
            raise TypeError(f"`detail` must be a SamplingDetail, got {type(detail).__name__}.")
        if privacy_unit is None:
            privacy_unit = None if detail is None else detail.default_unit
            if privacy_unit is None:
                raise ValueError(
                    "A SamplingSpec must name its `privacy_unit` (the unit its data is sampled "
                    "for)."
                )
        object.__setattr__(self, "privacy_unit", _unit_name(privacy_unit))
        self._check()

    def _check(self) -> None:
        _check_int(_name("population", self.detail), self.population, 1)
        _check_int(_name("contribution_bound", self.detail), self.contribution_bound, 1)
        if self.detail is not None:
            self.detail.check(self)
        _check_int("steps_per_epoch", self.steps_per_epoch, 1)
        if not (0.0 < float(self.sampling_rate) <= 1.0):
            raise ValueError(f"`sampling_rate` must be in (0, 1], got {self.sampling_rate}.")
        b, want = self.expected_batch_size, float(self.sampling_rate) * self.population
        if not (float(b) > 0.0) or math.isinf(b):
            raise ValueError(f"`expected_batch_size` must be > 0 and finite, got {b}.")
        if not math.isclose(float(b), want, rel_tol=1e-9):
            raise ValueError(
                f"`expected_batch_size` b = {b} must equal γ·m = {self.sampling_rate} · "
                f"{self.population} = {want}: "
                "the step divides by b and the accountant charges γ, so the two must describe the "
                "same sampling."
            )
        if self.num_units is not None:
            _check_int("num_units", self.num_units, 1)

    @property
    def unit(self) -> PrivacyUnit:
        """The :class:`PrivacyUnit` this sampling is for."""
        return privacy_unit(self.privacy_unit)

    @property
    def units(self) -> int:
        """The number of privacy units (``num_units``, else the detail's count, else one per row):
        what δ is compared with."""
        if self.num_units is not None:
            return self.num_units
        counted = None if self.detail is None else self.detail.units(self)
        return self.population if counted is None else counted

    @property
    def accounted_bound(self) -> int:
        """The per-unit bound the accountant charges (``contribution_bound``, or the detail's
        tighter proven one)."""
        return self.contribution_bound if self.detail is None else self.detail.bound(self)

    # The saved form's names, read-only (records and user code written against them keep working).
    num_edges = property(lambda self: self.population)
    max_degree = property(lambda self: self.contribution_bound)
    num_nodes = property(lambda self: self.to_dict()["num_nodes"])
    neg_per_pos = property(lambda self: self.to_dict()["neg_per_pos"])

    def to_dict(self) -> dict[str, Any]:
        """The flat, saved form (the same keys and values as every saved record): generic facts and
        the detail's."""
        return dict(self._saved_form())

    def _saved_form(self) -> tuple[tuple[str, Any], ...]:
        """:meth:`to_dict`'s items, built once (the spec and its detail are frozen; accountants hash it every step)."""
        form = self.__dict__.get("_saved")
        if form is None:
            flat = {key: (getattr(self, field) if field else None) for key, field in _SAVED.items()}
            flat.update({key: getattr(self, v) if isinstance(v, str) else v for key, v in _ROWS_ONLY.items()})
            if self.detail is not None:
                flat.update(asdict(self.detail))
            form = self.__dict__["_saved"] = tuple(flat.items())
        return form

    def __eq__(self, other: object) -> bool:
        return self is other or isinstance(other, SamplingSpec) and self._saved_form() == other._saved_form()

    def __hash__(self) -> int:
        if "_hash" not in self.__dict__:
            self.__dict__["_hash"] = hash(self._saved_form())
        return self.__dict__["_hash"]

    def __getstate__(self) -> dict[str, Any]:
        """A copy or a pickle carries no cached hash: string hashes differ between processes."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def _unit_name(unit: "str | PrivacyUnit") -> str:
    """A unit object is stored by its name (specs stay plain data); the name must be known."""
    return privacy_unit(unit).name


def _name(field: str, detail: SamplingDetail | None) -> str:
    """A generic fact's name in messages: its saved name where the record came from the saved form's
    family."""
    return {v: k for k, v in _SAVED.items() if v}[field] if detail is not None else field


def _from_saved(
    saved: dict[str, Any], population: Any, bound: Any, detail: Any
) -> tuple[Any, Any, Any]:
    """(population, contribution_bound, detail) of a record given in the saved flat form."""
    population = saved.pop("num_edges", population)
    bound = saved.pop("max_degree", bound)
    if detail is not None and set(saved) <= {f.name for f in fields(detail)}:
        return (
            population,
            bound,
            replace(detail, **saved),
        )  # dataclasses.replace(spec, <a detail field>=...)
    if detail is not None or not saved:
        if saved:
            raise TypeError(
                f"SamplingSpec got both a detail and fields it does not hold: {sorted(saved)}."
            )
        return population, bound, detail
    # the rows-only keys a detail without them saves too (one row per unit-slot, no negatives)
    rows = {k for k, v in _ROWS_ONLY.items() if saved.get(k, ...) == (population if v == "population" else v)}
    for _ in range(2):  # the details registered now, then after discovering the method packages
        names = list(SAMPLING_DETAILS._items) if _ == 0 else list(SAMPLING_DETAILS)
        for name in names:
            held = {f.name for f in fields(SAMPLING_DETAILS[name])}
            if set(saved) <= held or (set(saved) - rows and set(saved) - rows <= held):
                return population, bound, SAMPLING_DETAILS[name](**{k: v for k, v in saved.items() if k in held})
    raise TypeError(
        f"SamplingSpec got unexpected fields {sorted(saved)}: no registered sampling detail holds "
        "them."
    )


@dataclass(frozen=True)
class NoiseSpec:
    """How a private module clips and noises one step (Algorithm 3, lines 4-5).

    The clipped per-row gradients are summed, N(0, σ²C²I) is added once per step (globally, not
    per rank), and the result is divided by the expected batch size b.

    Args:
        noise_multiplier: σ ≥ 0; the noise std on the clipped sum is σ·C.
        clip_norm: C > 0.
        clipping: a registered clipping mode (:mod:`lightning_dprel.core.clipping_modes`): the
            core's ``"standard"`` (every row clipped to C) and ``"none"`` (non-private baseline, σ
            must be 0), or a method's (the relational method's ``"freq"``, FREQ-CLIP).
        accounting: which bound accounts the run; stored as that mechanism's registry name (what
            :meth:`to_dict`, model checkpoints and ``model.json`` say). None (default): the
            clipping's own bound, as its method registered it
            (:func:`~lightning_dprel.core.clipping_modes.register_mechanism_choice`; the relational
            method: FREQ-CLIP's corrected profile, Theorem C.1 for standard clipping); ``"none"``
            whenever the clipping is not private. A method's reading of a clipping (the relational
            ``"corrected"`` / ``"paper"``), or the name of a mechanism registered with
            ``register_mechanism(..., clipping=(clipping,))``.
    """

    noise_multiplier: float
    clip_norm: float
    clipping: str
    accounting: str | None = None

    def __post_init__(self) -> None:
        mode = clipping_mode(self.clipping)
        if self.accounting is not None and (
            not isinstance(self.accounting, str) or not self.accounting
        ):
            raise ValueError(
                "`accounting` must be None, a clipping's reading or a registered mechanism name, "
                f"got {self.accounting!r}."
            )
        if not (float(self.noise_multiplier) >= 0.0) or math.isinf(self.noise_multiplier):
            raise ValueError(
                f"`noise_multiplier` must be >= 0 and finite, got {self.noise_multiplier}."
            )
        if not (float(self.clip_norm) > 0.0) or math.isinf(self.clip_norm):
            raise ValueError(f"`clip_norm` must be > 0 and finite, got {self.clip_norm}.")
        if not mode.private and self.noise_multiplier != 0.0:
            raise ValueError(
                f"`clipping={self.clipping!r}` is the non-private baseline and needs "
                "`noise_multiplier=0`, "
                f"got {self.noise_multiplier}."
            )
        object.__setattr__(self, "accounting", chosen_mechanism(self.clipping, self.accounting))

    @property
    def is_private(self) -> bool:
        return clipping_mode(self.clipping).private and self.noise_multiplier > 0.0

    @property
    def mechanism(self) -> str:
        """The accountant mechanism name (``none`` when not private), checked against the registry
        by the ledger."""
        return self.accounting

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
