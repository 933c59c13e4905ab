"""The stateful accountant: a run-length history of steps over a pure mechanism (bookkeeping only).

RDP composes additively over steps (also across steps with different σ or γ), and the (ε, δ) conversion
is Balle et al. 2020 (the paper's Theorem D.1). The per-step curves come from the mechanism registry and
are cached, so ``step`` and ``epsilon_after`` cost microseconds after the first call with a given
(SamplingSpec, σ) — the privacy callback calls both after every training step.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from lightning_dprel.accounting.conversion import check_delta, conversion_constants, epsilon_from_constants
from lightning_dprel.accounting.mechanisms import (
    _lookup,
    _orders_key,
    check_noise_multiplier,
    check_step_count,
    get_mechanism,
)
from lightning_dprel.accounting.orders import as_orders
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["Accountant"]

_STATE_KEYS = ("mechanism", "orders", "history")



class Accountant:
    """Entity-level privacy accountant for Algorithm 3 (composition of per-step RDP, then Theorem D.1).

    Args:
        mechanism: a registered mechanism name (default ``"freq_corrected"``, the FREQ-CLIP accounting that
            holds); ``"freq_paper"`` reproduces the paper's Eq. 3; ``"none"`` is refused.
        orders: Rényi orders (default :data:`DEFAULT_ORDERS`).

    Attributes:
        mechanism: the mechanism name. privacy_unit: what neighbouring datasets differ by.

    Example::

        acc = Accountant("freq_corrected")
        acc.step(sampling, noise_multiplier=1.0, num_steps=100)
        eps, alpha = acc.get_epsilon_and_order(delta=1e-6)
    """

    def __init__(self, mechanism: str = "freq_corrected", *, orders: object = None) -> None:
        mech = get_mechanism(mechanism)
        self.mechanism: str = mechanism
        self.privacy_unit: str = mech.privacy_unit
        self._set_orders(orders)
        self._reset()

    # -- internal state ---------------------------------------------------------------------------------
    def _set_orders(self, orders: object) -> None:
        self._orders = np.array(as_orders(orders), dtype=float)
        self._orders.setflags(write=False)
        self._key = _orders_key(self._orders)
        self._c1, self._c2 = conversion_constants(self._orders)

    def _reset(self) -> None:
        self._history: list[list[Any]] = []  # [SamplingSpec, σ, count, mechanism]
        self._closed = np.zeros_like(self._orders)  # Σ count·rdp over every run but the last
        self._last_rdp = np.zeros_like(self._orders)
        self._steps = 0

    def _record(self, sampling: SamplingSpec, sigma: float, rdp: np.ndarray, num_steps: int, mechanism: str) -> None:
        last = self._history[-1] if self._history else None
        if last is not None and last[0] == sampling and last[1] == sigma and last[3] == mechanism:
            last[2] += num_steps
        else:
            if last is not None:
                self._closed = self._closed + last[2] * self._last_rdp
            self._history.append([sampling, sigma, num_steps, mechanism])
            self._last_rdp = rdp
        self._steps += num_steps

    # -- public API -------------------------------------------------------------------------------------
    @property
    def orders(self) -> np.ndarray:
        """The Rényi orders of this accountant (read-only)."""
        return self._orders

    @property
    def steps(self) -> int:
        """Number of steps recorded so far."""
        return self._steps

    @property
    def history(self) -> list[tuple[SamplingSpec, float, int]]:
        """Run-length history as (SamplingSpec, σ, count) tuples (a copy)."""
        return [(s, sig, n) for s, sig, n, _ in self._history]

    def step(self, sampling: SamplingSpec | None, noise_multiplier: float, num_steps: int = 1, *,
             mechanism: str | None = None) -> None:
        """Record ``num_steps`` steps of Algorithm 3 with this sampling and σ (validated first; a failed call
        leaves the state unchanged). ``mechanism`` composes a release of another registered mechanism (a ledger of
        several kinds of event); default this accountant's."""
        num_steps = check_step_count("num_steps", num_steps)
        sigma = check_noise_multiplier(noise_multiplier)
        name = self.mechanism if mechanism is None else mechanism
        rdp = _lookup(name, sampling, sigma, self._key)
        self._record(sampling, sigma, rdp, num_steps, name)

    def rdp(self) -> np.ndarray:
        """The composed RDP curve over :attr:`orders` (a copy)."""
        if not self._history:
            return np.zeros_like(self._orders)
        return self._closed + self._history[-1][2] * self._last_rdp

    def get_epsilon_and_order(self, delta: float) -> tuple[float, float]:
        """(ε, best α) of the steps so far at this δ (Balle et al. 2020; the paper's Theorem D.1)."""
        return epsilon_from_constants(self._orders, self._c1, self._c2, self.rdp(), check_delta(delta))

    def get_epsilon(self, delta: float) -> float:
        """ε of the steps so far at this δ."""
        return self.get_epsilon_and_order(delta)[0]

    def epsilon_after(
        self, sampling: SamplingSpec, noise_multiplier: float, delta: float, num_steps: int = 1
    ) -> float:
        """ε if ``num_steps`` more steps with this sampling and σ were taken (no state change)."""
        num_steps = check_step_count("num_steps", num_steps)
        sigma = check_noise_multiplier(noise_multiplier)
        rdp = _lookup(self.mechanism, sampling, sigma, self._key)
        last = self._history[-1] if self._history else None
        if last is not None and last[0] == sampling and last[1] == sigma and last[3] == self.mechanism:
            total = self._closed + (last[2] + num_steps) * self._last_rdp
        elif last is not None:
            total = (self._closed + last[2] * self._last_rdp) + num_steps * rdp
        else:
            total = self._closed + num_steps * rdp
        return epsilon_from_constants(self._orders, self._c1, self._c2, total, check_delta(delta))[0]

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state: mechanism, orders and the run-length history (SamplingSpecs as dicts)."""
        return {
            "mechanism": self.mechanism,
            "privacy_unit": self.privacy_unit,
            "orders": [float(a) for a in self._orders],
            "history": [
                {"sampling": None if s is None else s.to_dict(), "noise_multiplier": float(sig), "steps": int(n),
                 **({} if m == self.mechanism else {"mechanism": m})}
                for s, sig, n, m in self._history
            ],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the composed RDP is rebuilt bit-for-bit by replaying the runs.

        Raises:
            ValueError: for an empty dict, a missing key, or another mechanism.
        """
        if not isinstance(state_dict, dict) or not state_dict:
            raise ValueError("`state_dict` is empty; pass the dict returned by Accountant.state_dict().")
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        if missing:
            raise ValueError(f"`state_dict` is missing keys {missing}; expected {list(_STATE_KEYS)}.")
        if state_dict["mechanism"] != self.mechanism:
            raise ValueError(
                f"`state_dict` was saved by mechanism {state_dict['mechanism']!r}, this accountant uses "
                f"{self.mechanism!r}; create Accountant({state_dict['mechanism']!r}) to load it."
            )
        state = copy.deepcopy(state_dict)
        fresh = Accountant(self.mechanism, orders=state["orders"])
        for run in state["history"]:  # replay on a fresh object: a bad entry leaves self unchanged
            sampling = None if run["sampling"] is None else SamplingSpec(**run["sampling"])
            fresh.step(sampling, run["noise_multiplier"], int(run["steps"]), mechanism=run.get("mechanism"))
        self.__dict__.update(fresh.__dict__)

    def __repr__(self) -> str:
        return f"Accountant(mechanism={self.mechanism!r}, steps={self._steps}, runs={len(self._history)})"
