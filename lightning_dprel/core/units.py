"""Privacy units: what one unit is and how neighbouring datasets differ, known by name.

The core's own unit is ``example`` (per-example DP-SGD); the package that samples for a unit
registers it (the edge-tuple family's ``entity``, each method's in its ``accounting`` module).
Re-exported by :mod:`lightning_dprel.core.specs`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dprel.core.discovery import MethodRegistry

__all__ = ["PrivacyUnit", "PRIVACY_UNITS", "EXAMPLE", "privacy_unit", "register_privacy_unit"]


@dataclass(frozen=True)
class PrivacyUnit:
    """What one privacy unit is and how neighbouring datasets differ (declared by data, proven by
    mechanisms).

    ``str(unit)`` is its description, so reports print it as before.

    >>> from lightning_dprel.accounting import get_mechanism
    >>> get_mechanism("standard").unit.name, get_mechanism("subgraph_replace").unit.name
    ('entity', 'node_in_subgraph')

    Args:
        rows: each unit is its own rows (examples or tuples) of a batch, so message passing across
            rows mixes units.
        delta_per_row: the default δ is 1/(rows the rate draws from) where that is below 1/(units),
            else 1/(10·units).
    """

    name: str
    description: str
    counted_as: str = "units"
    rows: bool = False
    delta_per_row: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not isinstance(self.description, str):
            raise ValueError(
                f"A PrivacyUnit needs a non-empty name and a description, got {self.name!r}."
            )

    def __str__(self) -> str:
        return self.description


EXAMPLE = PrivacyUnit(
    "example",
    "one training example (add/remove), not an entity: use only for per-example pipelines",
    "examples",
    rows=True,
)
#: The units known by name: the core's per-example unit here; each method package (or the sampling
#: family it shares) registers its own on import (a lookup of a name not registered yet imports the
#: method packages first, see :mod:`lightning_dprel.core.discovery`).
PRIVACY_UNITS: MethodRegistry[PrivacyUnit] = MethodRegistry("privacy units")


def register_privacy_unit(unit: PrivacyUnit) -> PrivacyUnit:
    """Make a user's :class:`PrivacyUnit` known by name (a SamplingSpec names its unit); a taken
    name is refused."""
    if not isinstance(unit, PrivacyUnit):
        raise TypeError(f"`unit` must be a PrivacyUnit, got {type(unit).__name__}.")
    known = PRIVACY_UNITS.peek(unit.name)
    if known is not None and known != unit:
        raise ValueError(
            f"A different privacy unit is already named {unit.name!r}: {known.description!r}."
        )
    PRIVACY_UNITS[unit.name] = unit
    return unit


def privacy_unit(unit: "str | PrivacyUnit") -> PrivacyUnit:
    """The :class:`PrivacyUnit` named ``unit`` (or ``unit`` itself, registered by name), else a
    clear ``ValueError``."""
    if isinstance(unit, PrivacyUnit):
        return register_privacy_unit(unit)
    if not isinstance(unit, str) or unit not in PRIVACY_UNITS:
        raise ValueError(
            f"Unknown privacy unit {unit!r}; known: "
            f"{sorted(PRIVACY_UNITS)}{PRIVACY_UNITS.failures()} (register yours "
            "with register_privacy_unit, from the package of the method that declares it)."
        )
    return PRIVACY_UNITS[unit]


register_privacy_unit(EXAMPLE)
