"""The mechanism registry: name → pure function (SamplingSpec, σ, orders) → per-step RDP, and its checks.

The :class:`~lightning_dprel.accounting.accountant.Accountant` only composes what these functions return, so a new
mechanism is one :func:`register_mechanism` call, which states the :class:`~lightning_dprel.core.specs.PrivacyUnit` its
bound is proven for (a run whose data is sampled for another unit is refused by :func:`check_unit`). Per-step curves
are cached per (mechanism, SamplingSpec, σ, orders): after the first call a lookup costs microseconds. The generic
mechanisms live in :mod:`lightning_dprel.accounting.mechanisms`; each method registers its own from its package (its
``accounting`` module), and a name not registered yet is found by importing the method packages
(:mod:`lightning_dprel.core.discovery`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from lightning_dprel.core.checks import check_int
from lightning_dprel.accounting.orders import DEFAULT_ORDERS, as_orders
from lightning_dprel.core.discovery import MethodRegistry
from lightning_dprel.core.specs import PrivacyUnit, SamplingSpec
from lightning_dprel.core.specs import privacy_unit as as_unit  # `privacy_unit` is also register_mechanism's argument

__all__ = [
    "Mechanism", "RdpFunction", "register_mechanism", "get_mechanism", "registered_mechanisms",
    "check_module_mechanism", "check_unit", "check_fit_sampling", "check_accounting_choice", "check_step_count", "check_noise_multiplier",
    "check_sampling", "per_step_rdp", "step_pld", "SIGMA_FLOOR",
]

#: (sampling, noise_multiplier, orders) → per-step RDP at those orders.
RdpFunction = Callable[[SamplingSpec, float, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Mechanism:
    """A registered accounting mechanism.

    Attributes:
        name: registry key.
        rdp: pure function (SamplingSpec, σ, orders) → per-step RDP (array like orders, ≥ 0).
        description: one line naming the bound (and its equation) for reports.
        unit: the :class:`~lightning_dprel.core.specs.PrivacyUnit` the bound is proven for (what neighbouring datasets
            differ by); ``None`` only for a release whose event states its unit (a Gaussian release of a statistic).
        coupled: True if it needs the sampling's draws to be possible (its detail's
            ``check_draws``: for coupled edge tuples, Algorithm 2's constraint k·γ·m ≤ n).
        label: the short name reports print next to an ε.
        clipping: the module clipping modes (``NoiseSpec.clipping``) whose sensitivity this bound covers;
            empty for mechanisms that only a standalone accountant uses.
        accounting: the module's ``accounting=`` value that selects it besides its name (``"corrected"`` for
            ``freq_corrected``; None: only by name, e.g. through ``PrivacyCallback(mechanism=...)``).
        warning: warned once when a run is accounted with it (e.g. a bound that does not hold).
        stands_in_for: other mechanisms whose runs ``PrivacyCallback(mechanism=name)`` may account with
            this bound instead (``naive`` for the paper's Eq. 3 reading of FREQ-CLIP, as in its Figure 2).
        needs_sampling: False for a release that is not a sampled step (a noised statistic).
        pld: (SamplingSpec or None, σ, interval) → the privacy-loss distribution of one step, a dominating pair proven
            in ``docs/accounting.md`` (:mod:`lightning_dprel.accounting.pld`); None: only the RDP bound exists.
        check_sampling: a fit's SamplingSpec → None, raising ``ValueError`` where the data break the bound's premise
            (e.g. a degree cap under an edge-level bound); run with the unit check when a fit starts.
        compositions: (SamplingSpec, n) → how many per-step curves a run of n consecutive steps composes (None: n);
            e.g. ⌈n/b⌉ for banded noise under b-min-sep sampling. Such a run is one fit: a ledger refuses a second.
    """

    name: str
    rdp: RdpFunction
    description: str
    unit: PrivacyUnit | None
    coupled: bool = True
    label: str = ""
    clipping: tuple[str, ...] = ()
    accounting: str | None = None
    warning: str | None = None
    stands_in_for: tuple[str, ...] = ()
    needs_sampling: bool = True
    pld: "Callable[..., Any] | None" = None
    check_sampling: "Callable[[SamplingSpec], None] | None" = None
    compositions: "Callable[[SamplingSpec, int], int] | None" = None

    @property
    def privacy_unit(self) -> str:
        """The unit's description (what reports print)."""
        return "the unit its event states" if self.unit is None else str(self.unit)


#: name → Mechanism; a miss (or a full listing) imports the method packages first.
_REGISTRY: MethodRegistry[Mechanism] = MethodRegistry("mechanisms")


def register_mechanism(
    name: str, rdp: RdpFunction, *, description: str,
    privacy_unit: "PrivacyUnit | str | None" = ...,
    coupled: bool = False, overwrite: bool = False, label: str | None = None,
    clipping: tuple[str, ...] = (), accounting: str | None = None, warning: str | None = None,
    stands_in_for: tuple[str, ...] = (), needs_sampling: bool = True, pld: "Callable[..., Any] | None" = None,
    check_sampling: "Callable[[SamplingSpec], None] | None" = None,
    compositions: "Callable[[SamplingSpec, int], int] | None" = None,
) -> Mechanism:
    """Add a mechanism to the registry (and clear the per-step cache).

    A mechanism with ``clipping`` (the module clipping modes it bounds) is usable end to end:
    ``DPRelationalModule(clipping=..., accounting=<accounting or name>)`` selects it, and the privacy
    callback and ledger charge it. ``privacy_unit`` (a :class:`~lightning_dprel.core.specs.PrivacyUnit` or a known unit's
    name) is the unit the bound is proven for: runs whose datamodule samples for another unit are refused. ``pld``
    gives the tight accountant the mechanism's dominating pair; give it only with a proof that the pair dominates.
    ``check_sampling`` refuses a fit's data that break the bound's premise (beyond the unit's name).
    """
    if not isinstance(name, str) or not name or name == "none":
        raise ValueError(f"`name` must be a non-empty string other than 'none', got {name!r}.")
    if _REGISTRY.peek(name) is not None and not overwrite:
        raise ValueError(f"Mechanism {name!r} is already registered; pass overwrite=True to replace it.")
    bad = [c for c in clipping if not isinstance(c, str) or not c or c == "none"]
    if bad:
        raise ValueError(
            f"`clipping` lists the module clipping modes it bounds (e.g. 'standard'), got {bad}."
        )
    if privacy_unit is ...:
        raise ValueError(f"Mechanism {name!r} must name the `privacy_unit` its bound is proven for "
                         "(None only for a release whose event states its unit).")
    if privacy_unit is None and (clipping or needs_sampling):
        raise ValueError(
            f"Mechanism {name!r}: only a release whose event states its unit (no sampling, no module clipping) may omit "
            "`privacy_unit`; a sampled or module mechanism must name the unit its bound is proven for."
        )
    unit = None if privacy_unit is None else as_unit(privacy_unit)
    mech = Mechanism(
        name, rdp, description, unit, coupled, label or name, tuple(clipping), accounting, warning, tuple(stands_in_for),
        bool(needs_sampling), pld, check_sampling, compositions,
    )
    _GENERATION[0] += _REGISTRY.peek(name) is not None  # a replaced mechanism: accountants built before share no curve
    _REGISTRY[name] = mech
    _cached_rdp.cache_clear()
    _cached_pld.cache_clear()
    PLD_CURVES.clear()
    return mech


def registered_mechanisms() -> tuple[str, ...]:
    """Names of every registered mechanism (built-in and added)."""
    return tuple(_REGISTRY)


def get_mechanism(name: str) -> Mechanism:
    """Look a mechanism up by name.

    Raises:
        ValueError: for ``"none"`` (the non-private baseline has no ε) or an unknown name.
    """
    if name == "none":
        raise ValueError(
            "`mechanism='none'` is the non-private baseline (clipping='none', noise_multiplier=0): it has no "
            "finite ε and cannot be accounted. Use clipping 'freq' or 'standard' with noise_multiplier > 0."
        )
    if name not in _REGISTRY:
        raise ValueError(f"`mechanism` must be one of {registered_mechanisms()}, got {name!r}{_REGISTRY.failures()}.")
    return _REGISTRY[name]


def check_module_mechanism(name: str, clipping: str) -> Mechanism:
    """The registered mechanism ``name`` if it bounds the module's ``clipping``, else a clear ``ValueError``."""
    mech = get_mechanism(name)
    if clipping not in mech.clipping:
        covering = [m.name for m in _REGISTRY.values() if clipping in m.clipping]
        raise ValueError(
            f"Mechanism {name!r} does not bound clipping={clipping!r} (it covers {list(mech.clipping)}); the "
            f"mechanisms that do: {covering}. Register one with register_mechanism(..., clipping=({clipping!r},))."
        )
    return mech


def check_fit_sampling(name: str, sampling: SamplingSpec) -> Mechanism:
    """The mechanism ``name`` if it is proven for the fit's unit and its data meet the bound's premise."""
    mech = check_unit(name, sampling.privacy_unit)
    if mech.check_sampling is not None:
        mech.check_sampling(sampling)
    return mech


def check_unit(name: str, unit: "PrivacyUnit | str") -> Mechanism:
    """The mechanism ``name`` if it is proven for ``unit`` (the datamodule's), else a ``ValueError`` naming both."""
    mech, unit = get_mechanism(name), as_unit(unit)
    if mech.unit is not None and mech.unit != unit:
        proven = [m.name for m in _REGISTRY.values() if m.unit == unit and m.clipping]
        raise ValueError(
            f"Privacy unit mismatch: mechanism {name!r} is proven for the unit {mech.unit.name!r} ({mech.unit}), but the "
            f"data is sampled for the unit {unit.name!r} ({unit}). Its ε would not bound this run. Mechanisms proven "
            f"for {unit.name!r}: {proven}."
        )
    return mech


def check_accounting_choice(module_mechanism: str, chosen: str) -> Mechanism:
    """The mechanism a callback may account a module's runs with: its own, or one that stands in for it."""
    mech = get_mechanism(chosen)
    if chosen != module_mechanism and module_mechanism not in mech.stands_in_for:
        raise ValueError(
            f"PrivacyCallback(mechanism={chosen!r}) contradicts the module, whose clipping and accounting give "
            f"mechanism {module_mechanism!r}. Build the callback with mechanism={module_mechanism!r} or None."
        )
    return mech


def check_step_count(name: str, value: int) -> int:
    """Return ``value`` as an int, or raise unless it is an int >= 1 (``name`` is the argument's name)."""
    return check_int(name, value, 1)


#: Smallest σ the accountant accepts (its numerics are tested from 0.3 up; calibration never goes below 0.1).
SIGMA_FLOOR = 0.1


def check_noise_multiplier(noise_multiplier: float) -> float:
    """Return σ as a float, or raise unless it is a finite number > 0."""
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float, np.floating, np.integer)):
        raise TypeError(
            f"`noise_multiplier` must be a float > 0, got {type(noise_multiplier).__name__} ({noise_multiplier!r})."
        )
    sigma = float(noise_multiplier)
    if not (sigma > 0.0) or math.isinf(sigma):
        raise ValueError(
            f"`noise_multiplier` must be > 0 and finite, got {noise_multiplier}; a private step needs noise "
            "(use mechanism 'none' only for the non-private baseline, which is not accounted)."
        )
    if sigma < SIGMA_FLOOR:
        raise ValueError(
            f"`noise_multiplier` must be >= {SIGMA_FLOOR}, got {noise_multiplier}: below it the accountant's "
            "quadrature is untested and slow (minutes per order grid), and the ε would be in the hundreds anyway. "
            "Raise the noise multiplier (or calibrate it from a target ε)."
        )
    return sigma


def check_sampling(sampling: SamplingSpec, *, coupled: bool = True) -> SamplingSpec:
    """Validate a SamplingSpec for accounting (SamplingSpec itself checks its facts); ``coupled``:
    its detail's draws must be possible too."""
    if not isinstance(sampling, SamplingSpec):
        raise TypeError(f"`sampling` must be a SamplingSpec, got {type(sampling).__name__}.")
    if coupled and sampling.detail is not None:
        sampling.detail.check_draws(sampling)
    return sampling


@lru_cache(maxsize=4096)
def _cached_rdp(name: str, sampling: SamplingSpec, sigma: float, orders: tuple[float, ...] | None) -> np.ndarray:
    mech = _REGISTRY[name]
    grid = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
    out = np.array(mech.rdp(sampling, sigma, grid), dtype=float).reshape(-1)
    if out.shape != grid.shape or np.any(np.isnan(out)) or np.any(out < 0.0):
        raise RuntimeError(f"Mechanism {name!r} returned an invalid RDP curve (shape {out.shape}, NaN or < 0).")
    out.setflags(write=False)
    return out


#: (grid width, δ, closed runs as ((mechanism, sampling, σ), steps), run) → {steps of the run: PLD ε}: the ε curve of
#: a run after a history, shared by every Accountant with that history (calibration's, the callback's, the ledger's).
PLD_CURVES: "dict[tuple, dict[int, float]]" = {}
#: Mechanisms replaced so far: an Accountant built before the last replacement shares no ε curve (it may hold the old PLDs).
_GENERATION = [0]


def _generation() -> int:
    """How many times a registered mechanism was replaced (``overwrite=True``) in this process."""
    return _GENERATION[0]


@lru_cache(maxsize=64)
def _cached_pld(name: str, sampling: SamplingSpec | None, sigma: float, interval: float) -> Any:
    fn = _REGISTRY[name].pld
    return None if fn is None else fn(sampling, sigma, interval)


def step_pld(mechanism: str, sampling: SamplingSpec | None, noise_multiplier: float, interval: float) -> Any:
    """The privacy-loss distribution of one step (validated, cached), or None if the mechanism has no proven pair."""
    mech = get_mechanism(mechanism)
    if mech.needs_sampling or sampling is not None:
        check_sampling(sampling, coupled=mech.coupled)
    return _cached_pld(mechanism, sampling, check_noise_multiplier(noise_multiplier), float(interval))


def _orders_key(orders: object) -> tuple[float, ...] | None:
    if orders is None:
        return None
    arr = as_orders(orders)
    if arr.shape == DEFAULT_ORDERS.shape and np.array_equal(arr, DEFAULT_ORDERS):
        return None
    return tuple(float(a) for a in arr)


def _lookup(mechanism: str, sampling: SamplingSpec | None, noise_multiplier: float, key: tuple | None) -> np.ndarray:
    """Validated, cached, read-only per-step RDP (internal fast path of the Accountant)."""
    mech = get_mechanism(mechanism)
    if mech.needs_sampling or sampling is not None:
        check_sampling(sampling, coupled=mech.coupled)
    return _cached_rdp(mechanism, sampling, check_noise_multiplier(noise_multiplier), key)


def per_step_rdp(
    mechanism: str, sampling: SamplingSpec, noise_multiplier: float, orders: object = None
) -> np.ndarray:
    """Per-step RDP ε(α) of a registered mechanism (a fresh array; see the module docstring).

    Args:
        mechanism: a name of :func:`registered_mechanisms` (e.g. ``"poisson_gaussian"``).
        sampling: how the datamodule samples one step.
        noise_multiplier: σ > 0 (noise std σ·C on a sum of sensitivity C).
        orders: Rényi orders > 1 (default :data:`DEFAULT_ORDERS`).

    Raises:
        ValueError: for ``mechanism='none'`` or an unknown name, σ ≤ 0, k·γ·m > n, bad orders.
        TypeError: if ``sampling`` is not a SamplingSpec.
    """
    return _lookup(mechanism, sampling, noise_multiplier, _orders_key(orders)).copy()
