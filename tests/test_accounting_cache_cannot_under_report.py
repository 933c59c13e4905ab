"""The shared ε curves (accounting/accountant.py, PLD_CURVES) never report less than an exact recomputation.

What is specified: for a sequence a user can produce (a planned fit, σ changed mid-run, releases charged between steps,
steps beyond the plan, another δ, another sampling with the same mechanism name, a second accountant in the process,
a mechanism replaced with ``overwrite=True``, banded runs split by a release) the reported, live, look-ahead and
halting answers equal those of a fresh Accountant computed with no shared curve, which dp-accounting's PLDAccountant
anchors (same grid).
"""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from lightning_dprel.accounting import Accountant
from lightning_dprel.accounting.mechanisms import PLD_CURVES, register_mechanism
from lightning_dprel.accounting.mechanisms.banded import CyclicPoisson
from lightning_dprel.accounting.mechanisms.per_example import per_example_poisson_gaussian, per_example_poisson_gaussian_pld
from lightning_dprel.accounting.pld import discretization_for
from lightning_dprel.core.specs import EXAMPLE, SamplingSpec

D1, D2 = 1e-5, 1e-3


def _spec(q: float, n: int = 1000, partitions: int | None = None) -> SamplingSpec:
    return SamplingSpec(population=n, sampling_rate=q, expected_batch_size=q * n, steps_per_epoch=math.ceil(1 / q),
                        privacy_unit=EXAMPLE, num_units=n * (partitions or 1),
                        detail=None if partitions is None else CyclicPoisson(partitions))


S1, S2 = _spec(0.01), _spec(0.02)


def _fresh(mechanism: str, events: list, delta: float) -> float:
    """ε of ``events`` ((sampling, σ, steps, mechanism or None), …) by an Accountant that finds no shared curve."""
    saved = dict(PLD_CURVES)
    PLD_CURVES.clear()
    try:
        acc = Accountant(mechanism)
        for sampling, sigma, steps, name in events:
            acc.step(sampling, sigma, steps, mechanism=name)
        return acc.get_epsilon(delta)
    finally:
        PLD_CURVES.clear()
        PLD_CURVES.update(saved)


def _dp_accounting(events: list, delta: float, interval: float) -> float:
    """dp-accounting's PLD of Poisson Gaussian steps ``(q, σ, compositions)`` and Gaussian releases ``(None, σ, n)``."""
    acc = PLDAccountant(value_discretization_interval=interval)
    for q, sigma, count in events:
        event = dp_event.GaussianDpEvent(sigma)
        acc.compose(event if q is None else dp_event.PoissonSampledDpEvent(q, event), count)
    return float(acc.get_epsilon(delta))


def test_every_answer_equals_a_fresh_recomputation_over_a_user_sequence():
    acc, other = Accountant("poisson_gaussian"), Accountant("poisson_gaussian")
    acc.plan(D1, S1, 1.0, 40)  # the callback's plan at fit start: fills the shared curve
    sequence = [(S1, 1.0, 25, None), (S1, 1.5, 10, None), (None, 2.0, 3, "gaussian"), (S1, 1.0, 45, None),
                (S2, 1.0, 5, None)]  # σ changed, a release charged, steps past the plan, another sampling
    events = []
    for sampling, sigma, steps, name in sequence:
        acc.step(sampling, sigma, steps, mechanism=name)
        other.step(sampling, sigma, steps - 1, mechanism=name)  # a second model: neighbouring histories
        other.get_epsilon(D1)
        other.step(sampling, sigma, 1, mechanism=name)
        events.append((sampling, sigma, steps, name))
        for delta in (D1, D2):
            exact = _fresh("poisson_gaussian", events, delta)
            assert acc.get_epsilon(delta) == pytest.approx(exact, rel=1e-12)
            assert other.get_epsilon(delta) == pytest.approx(exact, rel=1e-12)
            assert acc.live_epsilon(delta) >= exact * (1 - 1e-12)
            after = _fresh("poisson_gaussian", [*events, (S1, 1.0, 7, None)], delta)
            assert acc.epsilon_after(S1, 1.0, delta, 7) == pytest.approx(after, rel=1e-12)
        target = acc.get_epsilon(D1) + 0.05
        n = acc.steps_within(target, D1, S1, 1.0, max_steps=60)  # the halting decision
        assert _fresh("poisson_gaussian", [*events, (S1, 1.0, n, None)] if n else events, D1) <= target
        if n < 60:
            assert _fresh("poisson_gaussian", [*events, (S1, 1.0, n + 1, None)], D1) > target
    steps = [(0.01, 1.0, 25), (0.01, 1.5, 10), (None, 2.0, 3), (0.01, 1.0, 45), (0.02, 1.0, 5)]
    ref = _dp_accounting(steps, D1, discretization_for(0.01))
    assert acc.get_epsilon(D1) == pytest.approx(ref, rel=1e-6)


@pytest.fixture
def _probe_mechanism():
    from lightning_dprel.accounting import registry

    yield "probe_replaced_mechanism"
    registry._REGISTRY._items.pop("probe_replaced_mechanism", None)  # no probe left for later tests to enumerate
    PLD_CURVES.clear()


def test_a_replaced_mechanism_is_never_read_from_a_curve_its_old_pld_wrote(_probe_mechanism):
    def weak(sampling, sigma, arg):  # a wrong bound (4σ) that a user then fixes with overwrite=True
        return per_example_poisson_gaussian(sampling, 4 * sigma, arg)

    def weak_pld(sampling, sigma, interval):
        return per_example_poisson_gaussian_pld(sampling, 4 * sigma, interval)

    def register(rdp, pld):
        register_mechanism(_probe_mechanism, rdp, privacy_unit=EXAMPLE, clipping=("standard",), pld=pld,
                           description="a probe", warning="a probe", overwrite=True)

    register(weak, weak_pld)
    old = Accountant(_probe_mechanism)
    old.step(S1, 1.0, 40)
    old.step(S1, 2.0, 5)
    old.get_epsilon(D1)  # its closed runs composed with the old PLD
    register(per_example_poisson_gaussian, per_example_poisson_gaussian_pld)
    old.get_epsilon(D1)  # would write the shared curve of its history with the old PLD
    new = Accountant(_probe_mechanism)
    new.step(S1, 1.0, 40)
    new.step(S1, 2.0, 5)
    ref = _dp_accounting([(0.01, 1.0, 40), (0.01, 2.0, 5)], D1, discretization_for(0.01))
    assert new.get_epsilon(D1) == pytest.approx(ref, rel=1e-6)
    exact = _fresh(_probe_mechanism, [(S1, 1.0, 40, None), (S1, 2.0, 5, None)], D1)
    assert new.get_epsilon(D1) == pytest.approx(exact, rel=1e-12)


def test_banded_runs_compose_ceil_n_over_b_per_run_through_the_shared_curve():
    spec, bands = _spec(0.05, n=200, partitions=4), 4
    acc = Accountant("banded_poisson_gaussian")
    acc.plan(D1, spec, 1.0, 21)
    acc.step(spec, 1.0, 21)
    acc.step(None, 3.0, 1, mechanism="gaussian")  # a release splits the run: ⌈21/4⌉ + ⌈6/4⌉ ≥ ⌈27/4⌉
    acc.step(spec, 1.0, 6)
    interval = discretization_for(0.05)
    ref = _dp_accounting([(0.05, 1.0, math.ceil(21 / bands)), (None, 3.0, 1), (0.05, 1.0, math.ceil(6 / bands))], D1,
                         interval)
    assert acc.get_epsilon(D1) == pytest.approx(ref, rel=1e-6)
    assert acc.live_epsilon(D1) >= acc.get_epsilon(D1)
    one_run = Accountant("banded_poisson_gaussian")
    one_run.step(spec, 1.0, 27)
    assert one_run.get_epsilon(D1) == pytest.approx(_dp_accounting([(0.05, 1.0, math.ceil(27 / bands))], D1, interval),
                                                    rel=1e-6)
    plain = Accountant("banded_poisson_gaussian")
    plain.step(_spec(0.05, n=200), 1.0, 4)
    for read in (plain.get_epsilon, plain.live_epsilon, lambda d: plain.epsilon_after(spec, 1.0, d, 1)):
        with pytest.raises(ValueError, match="cyclic Poisson"):  # never an ε under plain Poisson sampling
            read(D1)
