"""The mechanism registry: name → pure function (SamplingSpec, σ, orders) → per-step RDP.

The :class:`~lightning_dprel.accounting.accountant.Accountant` only composes what these functions return,
so a new mechanism (per-example subsampled Gaussian for DP-GCN/AdvSGM, PATE for DP-GPL, …) is one
:func:`register_mechanism` call. Per-step curves are cached per (mechanism, SamplingSpec, σ, orders):
after the first call a lookup costs microseconds.

Built-in mechanisms (entity-level unless stated):

* ``freq_corrected`` — FREQ-CLIP with the corrected profile Δ_freq(i,j) = C(1/2 + 3j/4 + i(1+k)/4) (holds).
* ``freq_paper`` — FREQ-CLIP with the paper's Eq. 3 (Δ ≡ C; rests on Proposition 4.1, which does not hold
  as stated: reproduces the paper, under-states ε).
* ``standard`` — standard per-tuple clipping, Theorem C.1 (Δ = C(i + 2j)).
* ``naive`` — the unamplified Gaussian bound α/(2σ²) of the paper's Figure 2.
* ``poisson_gaussian`` — per-**example** Poisson-subsampled Gaussian at rate γ (Mironov et al. 2019); its
  privacy unit is one example, not one entity (the K = 1, k = 0 case of the coupled mechanism).
* ``subgraph_replace`` — DP-GCN with random graph splits (node-level): Poisson-sampled subgraphs, a node changes one
  subgraph (replace-one; :mod:`~lightning_dprel.accounting.analysis.substitution`).
* ``gcn_paper`` — DP-GCN as published (add/remove per subgraph, Poisson): reproduces the paper, under-states ε.

The coupled mechanisms (``freq_corrected``, ``standard``) charge K' = min(K, n) (:func:`accounted_degree`
proves it covers the same neighbouring graphs) and refuse K' > 2²²; their cost stops growing with K above
:data:`~lightning_dprel.accounting.analysis.coupled_rdp.HEAD_ROWS` (closed-form tail bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from lightning_dprel.accounting.analysis.coupled_rdp import coupled_rdp
from lightning_dprel.accounting.analysis.sampled_gaussian import eq3_rdp
from lightning_dprel.accounting.analysis.substitution import poisson_gaussian_rdp, substitution_rdp
from lightning_dprel.accounting.orders import DEFAULT_ORDERS, as_orders
from lightning_dprel.accounting.profiles import freq_corrected_profile, standard_profile
from lightning_dprel.specs import PRIVACY_UNIT, SamplingSpec

__all__ = [
    "MECHANISMS",
    "PAPER_EQ3_WARNING",
    "check_module_mechanism",
    "check_accounting_choice",
    "Mechanism",
    "RdpFunction",
    "EXAMPLE_PRIVACY_UNIT",
    "register_mechanism",
    "get_mechanism",
    "registered_mechanisms",
    "per_step_rdp",
    "check_noise_multiplier",
    "check_step_count",
    "check_sampling",
    "accounted_degree",
    "MAX_ACCOUNTED_DEGREE",
]

#: (sampling, noise_multiplier, orders) → per-step RDP at those orders.
RdpFunction = Callable[[SamplingSpec, float, np.ndarray], np.ndarray]

EXAMPLE_PRIVACY_UNIT = "one training example (add/remove), not an entity: use only for per-example pipelines"

#: The entity-level mechanisms of the paper, in the order reports list them.
MECHANISMS: tuple[str, ...] = ("freq_corrected", "freq_paper", "standard", "naive")

#: Warned once when an accounting that rests on Proposition 4.1 (the paper's Eq. 3, or the naive bound) is used.
PAPER_EQ3_WARNING = (
    "PrivacyCallback: ε is computed with the paper's Eq. 3 (sensitivity Δ ≡ C). Eq. 3 rests on "
    "Proposition 4.1 (FREQ-CLIP has sensitivity C), which does not hold as stated: removing a node changes "
    "the clip thresholds of other tuples (a counterexample moves the clipped sum by 6.75·C for K=5, k=4). "
    "This ε reproduces the paper and under-states the privacy loss; use accounting='corrected' for a bound "
    "that holds."
)


@dataclass(frozen=True)
class Mechanism:
    """A registered accounting mechanism.

    Attributes:
        name: registry key.
        rdp: pure function (SamplingSpec, σ, orders) → per-step RDP (array like orders, ≥ 0).
        description: one line naming the bound (and its equation) for reports.
        privacy_unit: what neighbouring datasets differ by.
        coupled: True if it needs Algorithm 2's constraint k·γ·m ≤ n.
        label: the short name reports print next to an ε.
        clipping: the module clipping modes (``NoiseSpec.clipping``) whose sensitivity this bound covers;
            empty for mechanisms that only a standalone accountant uses.
        accounting: the ``NoiseSpec.accounting`` value that selects it (None: only by name, e.g. through
            ``PrivacyCallback(mechanism=...)``).
        warning: warned once when a run is accounted with it (e.g. a bound that does not hold).
        stands_in_for: other mechanisms whose runs ``PrivacyCallback(mechanism=name)`` may account with
            this bound instead (``naive`` for the paper's Eq. 3 reading of FREQ-CLIP, as in its Figure 2).
    """

    name: str
    rdp: RdpFunction
    description: str
    privacy_unit: str = PRIVACY_UNIT
    coupled: bool = True
    label: str = ""
    clipping: tuple[str, ...] = ()
    accounting: str | None = None
    warning: str | None = None
    stands_in_for: tuple[str, ...] = ()


_REGISTRY: dict[str, Mechanism] = {}


def register_mechanism(
    name: str, rdp: RdpFunction, *, description: str, privacy_unit: str = PRIVACY_UNIT,
    coupled: bool = False, overwrite: bool = False, label: str | None = None,
    clipping: tuple[str, ...] = (), accounting: str | None = None, warning: str | None = None,
    stands_in_for: tuple[str, ...] = (),
) -> Mechanism:
    """Add a mechanism to the registry (and clear the per-step cache).

    A mechanism with ``clipping`` (the module clipping modes it bounds) is usable end to end:
    ``DPRelationalModule(clipping=..., accounting=<accounting or name>)`` selects it, and the privacy
    callback and ledger charge it.
    """
    if not isinstance(name, str) or not name or name == "none":
        raise ValueError(f"`name` must be a non-empty string other than 'none', got {name!r}.")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"Mechanism {name!r} is already registered; pass overwrite=True to replace it.")
    bad = [c for c in clipping if c not in ("freq", "standard")]
    if bad:
        raise ValueError(f"`clipping` lists the module clipping modes it bounds ('freq', 'standard'), got {bad}.")
    mech = Mechanism(
        name, rdp, description, privacy_unit, coupled, label or name, tuple(clipping), accounting, warning, tuple(stands_in_for)
    )
    _REGISTRY[name] = mech
    _cached_rdp.cache_clear()
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
        raise ValueError(f"`mechanism` must be one of {registered_mechanisms()}, got {name!r}.")
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
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int >= 1, got {type(value).__name__} ({value!r}).")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}.")
    return int(value)


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
    """Validate a SamplingSpec for accounting (SamplingSpec itself checks n, m, K ≥ 1 and γ ∈ (0, 1])."""
    if not isinstance(sampling, SamplingSpec):
        raise TypeError(f"`sampling` must be a SamplingSpec, got {type(sampling).__name__}.")
    if coupled:
        need = sampling.neg_per_pos * sampling.sampling_rate * sampling.num_edges
        if need > sampling.num_nodes:
            raise ValueError(
                f"`neg_per_pos` * expected batch size = {sampling.neg_per_pos} * "
                f"{sampling.sampling_rate * sampling.num_edges:g} = {need:g} exceeds `num_nodes` = "
                f"{sampling.num_nodes}: NEG-SAMPLE-WOR (Algorithm 2) draws negatives without replacement. "
                "Lower neg_per_pos or the sampling rate."
            )
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


def _orders_key(orders: object) -> tuple[float, ...] | None:
    if orders is None:
        return None
    arr = as_orders(orders)
    if arr.shape == DEFAULT_ORDERS.shape and np.array_equal(arr, DEFAULT_ORDERS):
        return None
    return tuple(float(a) for a in arr)


def _lookup(mechanism: str, sampling: SamplingSpec, noise_multiplier: float, key: tuple | None) -> np.ndarray:
    """Validated, cached, read-only per-step RDP (internal fast path of the Accountant)."""
    mech = get_mechanism(mechanism)
    check_sampling(sampling, coupled=mech.coupled)
    return _cached_rdp(mechanism, sampling, check_noise_multiplier(noise_multiplier), key)


def per_step_rdp(
    mechanism: str, sampling: SamplingSpec, noise_multiplier: float, orders: object = None
) -> np.ndarray:
    """Per-step RDP ε(α) of a registered mechanism (a fresh array; see the module docstring).

    Args:
        mechanism: a name of :func:`registered_mechanisms` (e.g. one of :data:`MECHANISMS`).
        sampling: how the datamodule samples one step.
        noise_multiplier: σ > 0 (noise std σ·C on a sum of sensitivity C).
        orders: Rényi orders > 1 (default :data:`DEFAULT_ORDERS`).

    Raises:
        ValueError: for ``mechanism='none'`` or an unknown name, σ ≤ 0, k·γ·m > n, bad orders.
        TypeError: if ``sampling`` is not a SamplingSpec.
    """
    return _lookup(mechanism, sampling, noise_multiplier, _orders_key(orders)).copy()


def _spec_kwargs(sampling: SamplingSpec, sigma: float) -> dict:
    return dict(
        num_nodes=sampling.num_nodes, num_edges=sampling.num_edges, max_degree=sampling.max_degree,
        sampling_rate=float(sampling.sampling_rate), neg_per_pos=sampling.neg_per_pos, noise_multiplier=sigma,
    )


#: Largest degree bound the coupled mechanisms evaluate (their profiles are arrays of K + 1 rows).
MAX_ACCOUNTED_DEGREE = 2**22


def accounted_degree(sampling: SamplingSpec) -> int:
    """The degree bound the coupled mechanisms charge: K' = min(K, n), or a ``ValueError`` above 2²².

    Why min(K, n) is not an under-statement: K enters Theorem C.1 only as a bound on the number of relations
    (capped edges) of the entity that is added or removed — the clipping, the Poisson rate γ and the negative
    sampling do not depend on K. Relations are simple and undirected (no self-loops, no repeats; see
    :func:`~lightning_dprel.sampling.to_simple_undirected`), so in a graph of n nodes an entity has at most
    n − 1 of them, and an entity *added* to it (a graph of n + 1 nodes) at most n. Every pair of neighbouring
    datasets the guarantee quantifies over therefore differs by an entity with ≤ min(K, n) relations, and the
    theorem with K' = min(K, n) covers exactly the same pairs as with K. (The *observed* maximum degree is no
    such bound: an added entity may bring up to K relations, so it is never used.)
    """
    k_eff = min(sampling.max_degree, sampling.num_nodes)
    if k_eff > MAX_ACCOUNTED_DEGREE:
        raise ValueError(
            f"`max_degree` K = {sampling.max_degree:,} (with n = {sampling.num_nodes:,} nodes, min(K, n) = {k_eff:,}) "
            f"is above the {MAX_ACCOUNTED_DEGREE:,} the coupled accountant evaluates; its ε grows like K² (one "
            "entity with K sampled relations moves the sum by ~K·C), so such a cap gives no useful guarantee. "
            "Lower max_degree to about the graph's largest degree (the paper uses K = 5)."
        )
    return k_eff


def _coupled_kwargs(sampling: SamplingSpec, sigma: float) -> dict:
    return {**_spec_kwargs(sampling, sigma), "max_degree": accounted_degree(sampling)}


def _freq_corrected(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    kw = _coupled_kwargs(sampling, sigma)
    prof = freq_corrected_profile(kw["max_degree"], sampling.neg_per_pos)
    return coupled_rdp(prof, orders=orders, **kw)


def _freq_paper(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return eq3_rdp(orders=orders, **_spec_kwargs(sampling, sigma))


def _standard(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    kw = _coupled_kwargs(sampling, sigma)
    prof = standard_profile(kw["max_degree"], sampling.neg_per_pos)
    return coupled_rdp(prof, orders=orders, **kw)


def _naive(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return np.asarray(orders, dtype=float) / (2.0 * sigma * sigma)


def _poisson_gaussian(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return eq3_rdp(
        orders=orders, num_nodes=1, num_edges=sampling.num_edges, max_degree=1,
        sampling_rate=float(sampling.sampling_rate), neg_per_pos=0, noise_multiplier=sigma,
    )


register_mechanism(
    "freq_corrected", _freq_corrected, coupled=True, label="FREQ-CLIP corrected", clipping=("freq",),
    accounting="corrected", stands_in_for=("freq_paper",),  # the bound that holds, for a run accounted by Eq. 3
    description="FREQ-CLIP, corrected accounting: profile Δ=C(1/2+3j/4+i(1+k)/4) in Theorem C.1's mixture",
)
register_mechanism(
    "freq_paper", _freq_paper, coupled=True, label="FREQ-CLIP paper Eq. 3", clipping=("freq",), accounting="paper",
    warning=PAPER_EQ3_WARNING,
    description="FREQ-CLIP, paper's accounting: Eq. 3 (Δ≡C; Proposition 4.1 does not hold as stated)",
)
register_mechanism(
    "standard", _standard, coupled=True, label="standard (Thm C.1)", clipping=("standard",),
    description="standard per-tuple clipping: Theorem C.1 (Δ=C(i+2j))",
)
register_mechanism(
    "naive", _naive, coupled=False, label="naive Δ ≡ C, no amplification", warning=PAPER_EQ3_WARNING,
    stands_in_for=("freq_paper",),
    description="naive Gaussian bound α/(2σ²), no amplification by sampling (paper's Figure 2)",
)
register_mechanism(
    "poisson_gaussian", _poisson_gaussian, coupled=False, privacy_unit=EXAMPLE_PRIVACY_UNIT,
    label="per-example Poisson Gaussian",
    description="per-example Poisson-subsampled Gaussian at rate γ (Mironov et al. 2019)",
)

#: DP-GCN's unit: node-level add/remove, each node inside exactly one subgraph example (lightning_dprel/graph_splits.py).
SUBGRAPH_PRIVACY_UNIT = (
    "one node with its features, label and edges (node-level DP, add/remove a node); with a secret, data-independent "
    "partition each node lies in exactly one subgraph, so neighbouring datasets differ in one subgraph's contents"
)
GCN_PAPER_WARNING = (
    "DP-GCN paper-faithful accounting: the moments-accountant reading of Igamberdiev & Habernal (2022) treats each "
    "subgraph as an added/removed example under Poisson sampling, but removing a node *changes* one subgraph "
    "(substitution, sensitivity 2C) and the published pipeline visits a fixed partition in a fixed order: this ε "
    "under-states the loss; use accounting='subgraph_replace' for a bound that holds."
)


def _subgraph_replace(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return substitution_rdp(float(sampling.sampling_rate), sigma, orders)


def _gcn_paper(sampling: SamplingSpec, sigma: float, orders: np.ndarray) -> np.ndarray:
    return poisson_gaussian_rdp(float(sampling.sampling_rate), sigma, orders)


register_mechanism(
    "subgraph_replace", _subgraph_replace, coupled=False, privacy_unit=SUBGRAPH_PRIVACY_UNIT,
    label="DP-GCN subgraphs (replace-one)", clipping=("standard",), accounting="subgraph_replace",
    description="Poisson-sampled subgraphs, one node changes one subgraph: replace-one bound min(2α/σ², weak triangle)",
)
register_mechanism(
    "gcn_paper", _gcn_paper, coupled=False, privacy_unit=SUBGRAPH_PRIVACY_UNIT, label="DP-GCN paper (add/remove)",
    clipping=("standard",), accounting="gcn_paper", warning=GCN_PAPER_WARNING,
    description="DP-GCN as published: Poisson-subsampled Gaussian add/remove at the subgraph rate (under-states)",
)
