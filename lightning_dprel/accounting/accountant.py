"""The accountant: the composed privacy loss of the steps it was given, as two upper bounds; it reports the smaller.

* **RDP** (always): per-step curves from the mechanism registry, composed additively (also across different σ or γ),
  converted by Balle et al. 2020 (the paper's Theorem D.1). Cached, so ``step`` costs microseconds.
* **PLD** (``accountant="pld"``, the default, where every event's mechanism has a proven dominating pair): dp-accounting's
  privacy-loss distributions composed by FFT (:mod:`lightning_dprel.accounting.pld`); tight up to discretisation.

Both are valid upper bounds on the same composition, so their minimum is one too; :meth:`Accountant.epsilon_bounds` shows
both and which one gave the reported ε. The privacy callback asks after every step: :meth:`Accountant.live_epsilon`
evaluates the PLD at a geometric grid of counts (never below the exact value) and :meth:`Accountant.steps_within`
answers the halting question exactly from a cached search.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lightning_dprel.accounting.conversion import check_delta, conversion_constants, epsilon_from_constants
from lightning_dprel.accounting.mechanisms import (
    PLD_CURVES,
    _generation,
    _lookup,
    _orders_key,
    check_noise_multiplier,
    check_step_count,
    get_mechanism,
    step_pld,
)
from lightning_dprel.accounting.orders import as_orders
from lightning_dprel.accounting.pld import (
    VALUE_DISCRETIZATION,
    discretization_for,
    identity_pld,
    pld_epsilon,
    self_composed,
)
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["Accountant", "ACCOUNTANTS", "check_accountant", "LIVE_GRID_RATIO"]

#: The accountants: "pld" reports min(PLD, RDP) (PLD where every event has a proven pair); "rdp" reports RDP only.
ACCOUNTANTS = ("pld", "rdp")

#: Live ε between exact PLD evaluations: the value at the next count of the grid 1, 2, …, 10, then ×1.1 (≤ 10 % more
#: steps, about 5 % more ε: ε grows like √T).
LIVE_GRID_RATIO = 1.1
_LIVE_GRID_EXACT = 10
_PLD_SEARCH_FACTOR = 64


def check_accountant(accountant: str) -> str:
    """``accountant`` if it is ``"pld"`` or ``"rdp"``, else a ``ValueError`` naming both."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"`accountant` must be 'pld' (privacy-loss distributions where a dominating pair is proven, RDP elsewhere; "
            f"the smaller bound is reported) or 'rdp' (Rényi DP only), got {accountant!r}."
        )
    return accountant


#: (history id, run, steps) → the id of that history followed by the run: equal histories get equal ids (exact: a
#: dictionary, no hashing of long tuples per step), 0 is the empty history.
_HISTORIES: dict[tuple, int] = {}


def _history_after(history: int, run: tuple, count: int) -> int:
    """The id of ``history`` followed by ``count`` steps of ``run``."""
    return _HISTORIES.setdefault((history, run, int(count)), len(_HISTORIES) + 1)


def _next_grid(count: int) -> int:
    """The live grid's count after ``count`` (a grid count): +1 up to 10, then ×1.1 rounded up."""
    return count + 1 if count < _LIVE_GRID_EXACT else max(count + 1, math.ceil(count * LIVE_GRID_RATIO))


def _grid_count(count: int) -> int:
    """The smallest count of the live grid that is ≥ ``count``."""
    if count <= _LIVE_GRID_EXACT:
        return count
    g = _LIVE_GRID_EXACT
    while g < count:
        g = _next_grid(g)
    return g


class Accountant:
    """Entity-level privacy accountant for Algorithm 3: composition of per-step privacy loss, reported as an (ε, δ).

    Args:
        mechanism: a registered mechanism name (e.g. ``"poisson_gaussian"``, or a method's: the
            relational ``"freq_corrected"``); ``"none"`` is refused.
        orders: Rényi orders (default :data:`DEFAULT_ORDERS`).
        accountant: ``"pld"`` (default): the smaller of the PLD bound (when every event has a proven dominating pair)
            and the RDP bound; ``"rdp"``: the RDP bound only.
        value_discretization: the PLD's privacy-loss grid (pessimistic at any width); default
            :func:`~lightning_dprel.accounting.pld.discretization_for` the first event's sampling rate (one grid per
            composition).

    Attributes:
        mechanism: the mechanism name. privacy_unit: what neighbouring datasets differ by. accountant: "pld" or "rdp".

    Example::

        acc = Accountant("poisson_gaussian")
        acc.step(sampling, noise_multiplier=1.0, num_steps=100)
        acc.get_epsilon(delta=1e-6), acc.epsilon_bounds(delta=1e-6)["bound"]
    """

    def __init__(self, mechanism: str, *, orders: object = None, accountant: str = "pld",
                 value_discretization: float | None = None) -> None:
        mech = get_mechanism(mechanism)
        self.mechanism: str = mechanism
        self.privacy_unit: str = mech.privacy_unit
        self.accountant: str = check_accountant(accountant)
        if value_discretization is not None and not (0.0 < float(value_discretization) <= 0.1):
            raise ValueError(f"`value_discretization` must be in (0, 0.1] or None, got {value_discretization}.")
        self._interval = None if value_discretization is None else float(value_discretization)
        self._set_orders(orders)
        self._reset()

    # -- internal state ---------------------------------------------------------------------------------
    def _set_orders(self, orders: object) -> None:
        self._orders = np.array(as_orders(orders), dtype=float)
        self._orders.setflags(write=False)
        self._key = _orders_key(self._orders)
        self._c1, self._c2 = conversion_constants(self._orders)

    def _reset(self) -> None:
        # Σ count·rdp as closed runs + the open run (count·rdp of a run is computed once, so the sum does not depend on
        # how its steps were fed in: a resumed ledger composes bit-for-bit as an uninterrupted one). No history is kept.
        self._closed = np.zeros_like(self._orders)
        self._run: tuple | None = None  # (mechanism, sampling, σ) of the open run
        self._run_rdp = np.zeros_like(self._orders)
        self._run_count = 0
        self._steps = 0
        # PLD: closed runs still to fold into the prefix, the prefix, and caches valid until a run closes.
        self._pld_pending: list[tuple[tuple, int]] = []
        self._history = 0  # the closed runs ((mechanism, sampling, σ), steps), as an id: the key of the shared ε curves
        self._pld_prefix: Any = None  # built on first use, on this composition's grid
        self._pld_ok = self.accountant == "pld"
        self._pld_cache: dict[tuple, Any] = {}
        self._generation = _generation()  # the registry this state was built under (shared curves only while current)

    def _count(self, run: tuple | None, n: int) -> int:
        """Per-step curves ``n`` steps of ``run`` compose (the mechanism's ``compositions``; n for most)."""
        fn = None if run is None or not n else get_mechanism(run[0]).compositions
        return n if fn is None else int(fn(run[1], n))

    def _close_run(self) -> None:
        if self._run is not None and self._run_count:
            self._closed = self._closed + self._count(self._run, self._run_count) * self._run_rdp
            if self._pld_ok:
                self._pld_pending.append((self._run, self._run_count))
                self._history = _history_after(self._history, self._run, self._run_count)
        self._pld_cache = {}

    # -- public API -------------------------------------------------------------------------------------
    @property
    def orders(self) -> np.ndarray:
        """The Rényi orders of this accountant (read-only)."""
        return self._orders

    @property
    def steps(self) -> int:
        """Number of steps recorded so far."""
        return self._steps

    def step(self, sampling: SamplingSpec | None, noise_multiplier: float, num_steps: int = 1, *,
             mechanism: str | None = None) -> None:
        """Record ``num_steps`` steps of Algorithm 3 with this sampling and σ (validated first; a failed call
        leaves the state unchanged). ``mechanism`` composes a release of another registered mechanism (a ledger of
        several kinds of event); default this accountant's."""
        num_steps = check_step_count("num_steps", num_steps)
        sigma = check_noise_multiplier(noise_multiplier)
        name = self.mechanism if mechanism is None else mechanism
        run = (name, sampling, sigma)
        if self._run == run:  # the open run goes on: looked up and checked when it opened
            self._run_count += num_steps
            self._steps += num_steps
            return
        rdp = _lookup(name, sampling, sigma, self._key)
        if self._pld_ok and self._run_pld(run) is None:  # checked once per run, not per step
            self._pld_ok = False  # one event without a proven pair: this composition has the RDP bound only
        self._close_run()
        self._run, self._run_rdp, self._run_count = run, rdp, num_steps
        self._steps += num_steps

    def rdp(self) -> np.ndarray:
        """The composed RDP curve over :attr:`orders` (a copy)."""
        return self._closed + self._count(self._run, self._run_count) * self._run_rdp

    @property
    def has_pld(self) -> bool:
        """True if this accountant composes a PLD (``accountant="pld"`` and every event so far has a proven pair)."""
        return self._pld_ok

    def get_epsilon_and_order(self, delta: float) -> tuple[float, float]:
        """(ε, best α) of the **RDP** bound at this δ (Balle et al. 2020; the paper's Theorem D.1)."""
        return epsilon_from_constants(self._orders, self._c1, self._c2, self.rdp(), check_delta(delta))

    def epsilon_bounds(self, delta: float) -> dict[str, Any]:
        """Both bounds at δ: ``{"epsilon": the smaller, "bound": "pld" | "rdp", "rdp": ε, "pld": ε or None}``."""
        rdp = self.get_epsilon_and_order(delta)[0]
        pld = self._pld_total(check_delta(delta), self._run, 0) if self._pld_ok else None
        return _bounds(rdp, pld)

    def get_epsilon(self, delta: float) -> float:
        """ε of the steps so far at this δ: the smaller valid bound (PLD where available, RDP)."""
        return self.epsilon_bounds(delta)["epsilon"]

    def live_epsilon(self, delta: float, *, target: float | None = None) -> float:
        """An upper bound on :meth:`get_epsilon` that costs one PLD evaluation per grid count (1…10, then ×1.1):
        the PLD at the next grid count of the open run (ε grows with steps), or RDP if smaller. With ``target``, a
        value above it is replaced by the exact ε, or by ``target`` itself when a halting search of this run
        (:meth:`steps_within`) already proved that the steps taken fit it."""
        if not self._pld_ok or self._run is None:
            return self.get_epsilon(delta)
        last, grid = self._pld_cache.get(("grid",), (0, 0))  # counts in [last, grid] share the grid count grid
        same = last <= self._run_count <= grid
        answer = self._pld_cache.get(("answer", delta, target))  # (grid, ε): this grid's PLD, RDP above it, ≤ target
        if same and answer is not None and answer[0] == grid:  # the next step of the interval: nothing to read
            self._pld_cache[("grid",)] = (self._run_count, grid)
            return answer[1]
        delta = check_delta(delta)
        if not same:
            grid = _grid_count(self._run_count)
        self._pld_cache[("grid",)] = (self._run_count, grid)
        live = pld = self._pld_at(delta, grid)
        if self._pld_cache.get(("live", delta)) != grid:  # RDP grows with steps: once ≥ the PLD at grid, it stays ≥
            rdp = self.get_epsilon_and_order(delta)[0]
            live = min(rdp, pld)
            self._pld_cache[("live", delta)] = grid if rdp >= pld else None
        if target is None or live <= target:
            if self._pld_cache.get(("live", delta)) == grid:
                self._pld_cache[("answer", delta, target)] = (grid, live)
            return live
        proven = self._pld_cache.get(("within", delta, float(target), self._run, True, None))
        return float(target) if proven is not None and proven[0] >= self._run_count else self.get_epsilon(delta)

    def epsilon_after(
        self, sampling: SamplingSpec, noise_multiplier: float, delta: float, num_steps: int = 1, *,
        bound: str | None = None,
    ) -> float:
        """ε if ``num_steps`` more steps with this sampling and σ were taken (no state change); ``bound="rdp"``: the
        RDP bound alone."""
        num_steps = check_step_count("num_steps", num_steps)
        sigma = check_noise_multiplier(noise_multiplier)
        delta = check_delta(delta)
        run = (self.mechanism, sampling, sigma)
        rdp = epsilon_from_constants(self._orders, self._c1, self._c2, self._rdp_after(run, num_steps), delta)[0]
        if bound == "rdp":
            return rdp
        pld = self._pld_total(delta, run, num_steps) if self.has_pld_for(sampling, sigma) else None
        return _bounds(rdp, pld)["epsilon"]

    def has_pld_for(self, sampling: SamplingSpec | None, noise_multiplier: float) -> bool:
        """True if a step of this accountant's mechanism with this sampling and σ would keep the PLD bound."""
        return self._pld_ok and self._run_pld((self.mechanism, sampling, check_noise_multiplier(noise_multiplier))) is not None

    def steps_within(self, target_epsilon: float, delta: float, sampling: SamplingSpec, noise_multiplier: float,
                     *, max_steps: int = 2**40) -> int:
        """The most further steps (≤ ``max_steps``) with this sampling and σ whose ε stays ≤ ``target_epsilon``.

        ε after n steps is the smaller of two bounds, each non-decreasing in n, so n fits iff it fits either; each
        largest n is found by a doubling and bisection search (RDP's first; PLD's from there, up to 64× it), cached for
        this state, so the halting check every step is a dictionary lookup. Ask with the steps you plan (the callback
        passes the fit's remaining steps): the PLD of very long compositions is slow to build."""
        asked = ("asked", target_epsilon, delta, sampling, noise_multiplier)  # the halting check every step: no checks
        key = self._pld_cache.get(asked) if type(max_steps) is int and max_steps >= 1 and self._run is not None else None
        cached = None if key is None else self._pld_cache.get(key)
        if cached is not None and (cached[1] or cached[0] >= self._run_count + max_steps):
            return max(0, min(max_steps, cached[0] - self._run_count))
        from lightning_dprel.accounting.analysis.binomial import bisect_int

        sigma = check_noise_multiplier(noise_multiplier)
        delta = check_delta(delta)
        max_steps = check_step_count("max_steps", max_steps)
        run = (self.mechanism, sampling, sigma)
        base = self._run_count if self._run == run else 0  # answers are cached as totals of the run they extend
        key = ("within", delta, float(target_epsilon), run, self._run == run, None if self._run == run else self._run_count)
        if self._run == run:  # the same question next step reads this key (the run and its counts move on)
            self._pld_cache[asked] = key
        cached = self._pld_cache.get(key)  # (largest total known to fit, whether it is the exact largest)
        if cached is not None and (cached[1] or cached[0] >= base + max_steps):
            return max(0, min(max_steps, cached[0] - base))

        def fits_rdp(n: int) -> bool:
            rdp = self._rdp_after(run, n)
            return epsilon_from_constants(self._orders, self._c1, self._c2, rdp, delta)[0] <= target_epsilon

        def fits_pld(n: int) -> bool:
            return self._pld_total(delta, run, n) <= target_epsilon

        best, exact = 0, True
        for fits, usable, pld in ((fits_rdp, True, False), (fits_pld, self._pld_ok and self._run_pld(run) is not None, True)):
            # PLD is never far above RDP: its search stops at 64× RDP's answer (a cap that can only under-state the steps)
            limit = min(max_steps, _PLD_SEARCH_FACTOR * (best + 1)) if pld else max_steps
            good = best + 1
            if not usable or good > limit or not fits(good):
                continue
            while good < limit and fits(nxt := min(2 * good, limit)):
                good = nxt
            if good >= limit:  # fits through the limit: the largest count beyond it is not known
                best, exact = limit, False
            else:
                best, exact = bisect_int(fits, good=good, bad=nxt), True
        self._pld_cache[key] = (best + base, exact)
        return best

    # -- internals --------------------------------------------------------------------------------------
    def _rdp_after(self, run: tuple, n: int) -> np.ndarray:
        name, sampling, sigma = run
        if self._run == run:
            return self._closed + self._count(run, self._run_count + n) * self._run_rdp
        return self.rdp() + self._count(run, n) * _lookup(name, sampling, sigma, self._key)

    def _run_pld(self, run: tuple) -> Any:
        name, sampling, sigma = run
        if self._interval is None:  # the first event fixes the grid (PLDs compose on one grid)
            self._interval = discretization_for(1.0 if sampling is None else sampling.sampling_rate)
        return step_pld(name, sampling, sigma, self._interval)

    def _prefix(self) -> Any:
        """PLD of the closed runs (folded in as they are first needed); None while there are none."""
        while self._pld_pending:
            run, count = self._pld_pending.pop(0)
            pld = self_composed(self._run_pld(run), self._count(run, count))
            self._pld_prefix = pld if self._pld_prefix is None else self._pld_prefix.compose(pld)
        return self._pld_prefix

    def _then(self, run: tuple, count: int, head: Any = None) -> Any:
        """``head`` (default the closed runs) ∘ ``run``'s PLD composed over ``count`` steps; no composition with an
        empty head (the identity)."""
        head = self._prefix() if head is None else head
        pld = self_composed(self._run_pld(run), self._count(run, count)) if count else None
        if pld is None:
            return identity_pld(self._interval or VALUE_DISCRETIZATION) if head is None else head
        return pld if head is None else head.compose(pld)

    def _curve(self, delta: float, history: int, run: tuple) -> dict[int, float]:
        """The shared ε curve {steps of ``run``: PLD ε} after ``history`` (:data:`PLD_CURVES`, the 256 last used)."""
        key = (self._interval, delta, history, run)
        if self._generation != _generation():  # a mechanism was replaced since: this state may hold its old PLDs
            return self._pld_cache.setdefault(("curve", *key), {})  # so it reads and writes no shared curve
        curve = PLD_CURVES.pop(key, None)
        if curve is None and len(PLD_CURVES) >= 256:
            PLD_CURVES.pop(next(iter(PLD_CURVES)))
        PLD_CURVES[key] = curve = {} if curve is None else curve
        return curve

    def _pld_at(self, delta: float, count: int) -> float:
        """ε of prefix ∘ (open run)^count (read from the run's ε curve; computed once per count)."""
        curve = self._curve(delta, self._history, self._run)
        if count not in curve:
            curve[count] = pld_epsilon(self._then(self._run, count), delta)
        return curve[count]

    def plan(self, delta: float, sampling: SamplingSpec | None, noise_multiplier: float, steps: int) -> None:
        """Compute once the ε curve of the next ``steps`` steps with this sampling and σ: the PLD at every count of
        the live grid they reach (what :meth:`live_epsilon` reads), shared by every accountant of this history."""
        if not self.has_pld_for(sampling, noise_multiplier):
            return
        run, delta = (self.mechanism, sampling, check_noise_multiplier(noise_multiplier)), check_delta(delta)
        base = self._run_count if self._run == run else 0
        count, last = _grid_count(base + 1), _grid_count(base + check_step_count("steps", steps))
        while count <= last:
            self._pld_total(delta, run, count - base)
            count = _next_grid(count)

    def _pld_total(self, delta: float, run: tuple | None, n: int) -> float:
        """ε of everything so far plus ``n`` steps of ``run`` (the open run continued, or a new run after it)."""
        if self._run is not None and (run is None or run == self._run):
            return self._pld_at(delta, self._run_count + n)
        if run is None or n == 0:
            return pld_epsilon(self._then(None, 0), delta)
        history = self._history if self._run is None else _history_after(self._history, self._run, self._run_count)
        curve = self._curve(delta, history, run)  # the curve this run will read once the open run closes
        if n not in curve:
            head = self._pld_cache.get(("head", self._run_count), ...)
            if head is ...:
                head = self._prefix() if self._run is None else self._then(self._run, self._run_count)
                self._pld_cache = {k: v for k, v in self._pld_cache.items() if k[0] != "head"}
                self._pld_cache[("head", self._run_count)] = head
            curve[n] = pld_epsilon(self._then(run, n, head) if head is not None else self._then(run, n), delta)
        return curve[n]

    def __repr__(self) -> str:
        return (f"Accountant(mechanism={self.mechanism!r}, accountant={self.accountant!r}, steps={self._steps}, "
                f"mechanism_unit={self.privacy_unit!r})")


def _bounds(rdp: float, pld: float | None) -> dict[str, Any]:
    use_pld = pld is not None and pld < rdp
    return {"epsilon": float(pld if use_pld else rdp), "bound": "pld" if use_pld else "rdp", "rdp": float(rdp),
            "pld": None if pld is None else float(pld)}
