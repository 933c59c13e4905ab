"""The privacy budget as a pure decision: does the next step fit? (after Lightning's EarlyStopping)."""

from __future__ import annotations


from lightning_dprel.core.checks import check_delta, positive_finite
from lightning_dprel.accounting import Accountant
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["PrivacyBudget"]


class PrivacyBudget:
    """(ε, δ) budget; :meth:`next_step` answers ``(stop, ε_next)`` from an accountant and the next step's facts.

    Pure: it keeps no state of the run, so the callback, a resume and a test ask it the same question the
    same way (Lightning's ``EarlyStopping._evaluate_stopping_criteria`` is the model).
    """

    def __init__(self, target_epsilon: float, delta: float) -> None:
        positive_finite("target_epsilon", target_epsilon)
        check_delta(delta)
        self.target_epsilon = float(target_epsilon)
        self.delta = float(delta)

    def next_step(self, accountant: Accountant, sampling: SamplingSpec, noise_multiplier: float,
                  num_steps: int = 1, *, horizon: int = 2**20) -> tuple[bool, float | None]:
        """``(stop, ε_next)``: stop when ``num_steps`` more steps at this σ would exceed the target; ``ε_next`` (what they
        would spend, by the accountant's reported bound) is computed only when stopping (else None): the decision
        itself is a cached :meth:`~lightning_dprel.accounting.Accountant.steps_within` lookup over the ``horizon``
        steps the run still plans."""
        fits = accountant.steps_within(self.target_epsilon, self.delta, sampling, noise_multiplier,
                                       max_steps=max(int(num_steps), int(horizon)))
        if num_steps <= fits:
            return False, None
        return True, float(accountant.epsilon_after(sampling, noise_multiplier, self.delta, num_steps=num_steps))

    def __repr__(self) -> str:
        return f"PrivacyBudget(target_epsilon={self.target_epsilon}, delta={self.delta})"
