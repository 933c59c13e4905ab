"""The facts the accountant needs, as frozen records (one fact, one place).

A datamodule tells the accountant *how it samples* (:class:`SamplingSpec`); a module tells it *how it
clips and noises* (:class:`NoiseSpec`). The privacy callback reads both and never guesses either.

Compatibility rule (after dp_accounting's ``dp_event.py``): fields are never removed and never change
meaning; new fields arrive optional, with a default that keeps the old meaning.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithm 3 (coupled sampling), Eq. 3 and Theorem C.1 (accounting).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lightning_dprel.core.checks import check_int as _check_int
from lightning_dprel.core.discovery import MethodRegistry

__all__ = [
    "SamplingSpec", "NoiseSpec", "CLIPPING_MODES", "ACCOUNTING_MODES", "PRIVACY_UNIT", "PrivacyUnit", "PRIVACY_UNITS",
    "ENTITY", "EXAMPLE", "privacy_unit", "register_privacy_unit",
]

#: The privacy unit of the relational method (the entity): what neighbouring graphs differ by.
PRIVACY_UNIT = (
    "one entity: a node together with all of its relations (edges); neighbouring graphs differ by "
    "adding or removing one node and its at most K capped edges (node-level DP, add/remove)"
)


@dataclass(frozen=True)
class PrivacyUnit:
    """What one privacy unit is and how neighbouring datasets differ (declared by data, proven by mechanisms).

    ``str(unit)`` is its description, so reports print it as before.

    >>> from lightning_dprel.accounting import get_mechanism
    >>> get_mechanism("standard").unit.name, get_mechanism("subgraph_replace").unit.name
    ('entity', 'node_in_subgraph')
    """

    name: str
    description: str
    counted_as: str = "units"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not isinstance(self.description, str):
            raise ValueError(f"A PrivacyUnit needs a non-empty name and a description, got {self.name!r}.")

    def __str__(self) -> str:
        return self.description


ENTITY = PrivacyUnit("entity", PRIVACY_UNIT, "entities")
EXAMPLE = PrivacyUnit(
    "example", "one training example (add/remove), not an entity: use only for per-example pipelines", "examples"
)
#: The units known by name: the core's two here; each method package registers its own on import (a lookup of a
#: name not registered yet imports the method packages first, see :mod:`lightning_dprel.core.discovery`).
PRIVACY_UNITS: MethodRegistry[PrivacyUnit] = MethodRegistry("privacy units")


def register_privacy_unit(unit: PrivacyUnit) -> PrivacyUnit:
    """Make a user's :class:`PrivacyUnit` known by name (a SamplingSpec names its unit); a taken name is refused."""
    if not isinstance(unit, PrivacyUnit):
        raise TypeError(f"`unit` must be a PrivacyUnit, got {type(unit).__name__}.")
    known = PRIVACY_UNITS.peek(unit.name)
    if known is not None and known != unit:
        raise ValueError(f"A different privacy unit is already named {unit.name!r}: {known.description!r}.")
    PRIVACY_UNITS[unit.name] = unit
    return unit


def privacy_unit(unit: "str | PrivacyUnit") -> PrivacyUnit:
    """The :class:`PrivacyUnit` named ``unit`` (or ``unit`` itself, registered by name), else a clear ``ValueError``."""
    if isinstance(unit, PrivacyUnit):
        return register_privacy_unit(unit)
    if not isinstance(unit, str) or unit not in PRIVACY_UNITS:
        raise ValueError(
            f"Unknown privacy unit {unit!r}; known: {sorted(PRIVACY_UNITS)}{PRIVACY_UNITS.failures()} (register yours "
            "with register_privacy_unit, from the package of the method that declares it)."
        )
    return PRIVACY_UNITS[unit]


register_privacy_unit(ENTITY)
register_privacy_unit(EXAMPLE)


CLIPPING_MODES = ("freq", "standard", "none")
ACCOUNTING_MODES = ("corrected", "paper")


@dataclass(frozen=True)
class SamplingSpec:
    """How a relational datamodule samples one step (Algorithm 3, lines 1-3).

    Each step draws positives E⁺ by Poisson sampling of the ``num_edges`` capped edges Ē at rate
    ``sampling_rate`` γ = b / |Ē|, then ``neg_per_pos`` · |E⁺| negative nodes *without replacement*,
    uniformly from all ``num_nodes`` nodes, independent of which positives were drawn (Algorithm 2,
    NEG-SAMPLE-WOR). After degree capping every node has at most ``max_degree`` capped edges.

    Args:
        num_nodes: n = |V|.
        num_edges: m = |Ē|, undirected edges after degree capping.
        max_degree: K, the cap on every node's degree in Ē.
        sampling_rate: γ in (0, 1], the Poisson rate of positives.
        neg_per_pos: k ≥ 0, negatives per positive tuple.
        expected_batch_size: b = γ·m; the private step divides by b, never by |E⁺|.
        steps_per_epoch: ceil(1/γ).
        privacy_unit: the name of the :class:`PrivacyUnit` this sampling is for (the neighbouring relation the
            datamodule samples for); mechanisms proven for another unit are refused.
        num_units: how many privacy units the private data holds (δ defaults and warnings count them); None: n.
    """

    num_nodes: int
    num_edges: int
    max_degree: int
    sampling_rate: float
    neg_per_pos: int
    expected_batch_size: float
    steps_per_epoch: int
    privacy_unit: str = "entity"
    num_units: int | None = None

    def __post_init__(self) -> None:
        _check_int("num_nodes", self.num_nodes, 1)
        _check_int("num_edges", self.num_edges, 1)
        _check_int("max_degree", self.max_degree, 1)
        _check_int("neg_per_pos", self.neg_per_pos, 0)
        _check_int("steps_per_epoch", self.steps_per_epoch, 1)
        if not (0.0 < float(self.sampling_rate) <= 1.0):
            raise ValueError(f"`sampling_rate` must be in (0, 1], got {self.sampling_rate}.")
        if not (float(self.expected_batch_size) > 0.0) or math.isinf(self.expected_batch_size):
            raise ValueError(f"`expected_batch_size` must be > 0 and finite, got {self.expected_batch_size}.")
        if not math.isclose(float(self.expected_batch_size), float(self.sampling_rate) * self.num_edges, rel_tol=1e-9):
            raise ValueError(
                f"`expected_batch_size` b = {self.expected_batch_size} must equal γ·m = {self.sampling_rate} · "
                f"{self.num_edges} = {float(self.sampling_rate) * self.num_edges}: the step divides by b and the "
                "accountant charges γ, so the two must describe the same sampling."
            )
        if isinstance(self.privacy_unit, PrivacyUnit):  # a unit object is stored by its name (specs stay plain data)
            object.__setattr__(self, "privacy_unit", privacy_unit(self.privacy_unit).name)
        privacy_unit(self.privacy_unit)
        if self.num_units is not None:
            _check_int("num_units", self.num_units, 1)

    @property
    def unit(self) -> PrivacyUnit:
        """The :class:`PrivacyUnit` this sampling is for."""
        return privacy_unit(self.privacy_unit)

    @property
    def units(self) -> int:
        """The number of privacy units (``num_units``, else n): what δ is compared with."""
        return self.num_units if self.num_units is not None else self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NoiseSpec:
    """How a private module clips and noises one step (Algorithm 3, lines 4-5).

    The clipped per-tuple gradients are summed, N(0, σ²C²I) is added once per step (globally, not
    per rank), and the result is divided by the expected batch size b.

    Args:
        noise_multiplier: σ ≥ 0; the noise std on the clipped sum is σ·C.
        clip_norm: C > 0.
        clipping: ``"freq"`` (Algorithm 1, FREQ-CLIP: tuple i clipped to C / (2·max-freq_i)),
            ``"standard"`` (every tuple clipped to C), or ``"none"`` (non-private baseline, σ must be 0).
        accounting: which bound accounts the run; stored as that mechanism's registry name (what :meth:`to_dict`, model
            checkpoints and ``model.json`` say). None (default): the clipping's own bound, ``"freq_corrected"`` for
            FREQ-CLIP (sensitivity profile Δ_freq(i, j) = C(1/2 + 3j/4 + i(1+k)/4), which holds) and ``"standard"``
            (Theorem C.1) for standard clipping; ``"none"`` whenever ``clipping="none"`` (nothing is accounted).
            ``"corrected"`` / ``"paper"``: FREQ-CLIP's two readings (``"paper"``: Eq. 3 as published, Δ ≡ C; rests on
            Proposition 4.1, which does not hold as stated); for standard clipping both name ``"standard"``. Any
            clipping: the name of a mechanism registered with ``register_mechanism(..., clipping=(clipping,))``.
    """

    noise_multiplier: float
    clip_norm: float
    clipping: str = "freq"
    accounting: str | None = None

    def __post_init__(self) -> None:
        if self.clipping not in CLIPPING_MODES:
            raise ValueError(f"`clipping` must be one of {CLIPPING_MODES}, got {self.clipping!r}.")
        if self.accounting is not None and (not isinstance(self.accounting, str) or not self.accounting):
            raise ValueError(
                f"`accounting` must be None, one of {ACCOUNTING_MODES} or a registered mechanism name, got {self.accounting!r}."
            )
        if not (float(self.noise_multiplier) >= 0.0) or math.isinf(self.noise_multiplier):
            raise ValueError(f"`noise_multiplier` must be >= 0 and finite, got {self.noise_multiplier}.")
        if not (float(self.clip_norm) > 0.0) or math.isinf(self.clip_norm):
            raise ValueError(f"`clip_norm` must be > 0 and finite, got {self.clip_norm}.")
        if self.clipping == "none" and self.noise_multiplier != 0.0:
            raise ValueError(
                "`clipping='none'` is the non-private baseline and needs `noise_multiplier=0`, "
                f"got {self.noise_multiplier}."
            )
        object.__setattr__(self, "accounting", _mechanism_name(self.clipping, self.accounting))

    @property
    def is_private(self) -> bool:
        return self.clipping != "none" and self.noise_multiplier > 0.0

    @property
    def mechanism(self) -> str:
        """The accountant mechanism name: ``freq_corrected``, ``freq_paper``, ``standard``, ``none``, or the
        registered mechanism named by ``accounting`` (checked against the registry by the ledger)."""
        return self.accounting

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mechanism_name(clipping: str, accounting: str | None) -> str:
    """The registry name a (clipping, accounting) pair selects (see :class:`NoiseSpec`)."""
    if clipping == "none":
        return "none"
    if accounting is not None and accounting not in ACCOUNTING_MODES:
        return accounting  # a registered mechanism, by name
    return f"freq_{accounting or 'corrected'}" if clipping == "freq" else "standard"
