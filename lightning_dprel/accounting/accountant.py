"""The accountant: composed RDP of the steps it was given, over a pure mechanism (the ledger is the only history).

RDP composes additively over steps (also across steps with different σ or γ), and the (ε, δ) conversion
is Balle et al. 2020 (the paper's Theorem D.1). The per-step curves come from the mechanism registry and
are cached, so ``step`` and ``epsilon_after`` cost microseconds after the first call with a given
(SamplingSpec, σ) — the privacy callback calls both after every training step.
"""

from __future__ import annotations

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
        # Σ count·rdp as closed runs + the open run (count·rdp of a run is computed once, so the sum does not depend on
        # how its steps were fed in: a resumed ledger composes bit-for-bit as an uninterrupted one). No history is kept.
        self._closed = np.zeros_like(self._orders)
        self._run: tuple | None = None  # (mechanism, sampling, σ) of the open run
        self._run_rdp = np.zeros_like(self._orders)
        self._run_count = 0
        self._steps = 0

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
        rdp = _lookup(name, sampling, sigma, self._key)
        if self._run == (name, sampling, sigma):
            self._run_count += num_steps
        else:
            self._closed = self._closed + self._run_count * self._run_rdp
            self._run, self._run_rdp, self._run_count = (name, sampling, sigma), rdp, num_steps
        self._steps += num_steps

    def rdp(self) -> np.ndarray:
        """The composed RDP curve over :attr:`orders` (a copy)."""
        return self._closed + self._run_count * self._run_rdp

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
        if self._run == (self.mechanism, sampling, sigma):
            total = self._closed + (self._run_count + num_steps) * self._run_rdp
        else:
            total = self.rdp() + num_steps * rdp
        return epsilon_from_constants(self._orders, self._c1, self._c2, total, check_delta(delta))[0]

    def __repr__(self) -> str:
        return f"Accountant(mechanism={self.mechanism!r}, steps={self._steps}, mechanism_unit={self.privacy_unit!r})"
