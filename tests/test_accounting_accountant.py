"""The Accountant (bookkeeping), the registry, calibration and input validation."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dprel.accounting import (
    DEFAULT_ORDERS,
    Accountant,
    max_steps_for,
    noise_multiplier_for,
    per_step_rdp,
    register_mechanism,
    registered_mechanisms,
    rdp_to_epsilon,
)
from lightning_dprel.accounting import mechanisms as mech_mod
from lightning_dprel.core.specs import NoiseSpec, PrivacyUnit
from lightning_dprel.datamodules.edge_tuples.accounting import MECHANISMS
from lightning_dprel.datamodules.edge_tuples.spec import PRIVACY_UNIT
from lightning_dprel.demos.specs import make_spec


SPEC = make_spec(20_000, 50_000, 3, 2e-3, 2)
SPEC2 = make_spec(20_000, 50_000, 3, 4e-3, 2)


def test_public_names():
    assert MECHANISMS == ("freq_corrected", "freq_paper", "standard", "naive")
    assert set(MECHANISMS) <= set(registered_mechanisms())
    acc = Accountant("freq_corrected")
    assert acc.mechanism == "freq_corrected" and acc.privacy_unit == PRIVACY_UNIT
    assert np.array_equal(acc.orders, DEFAULT_ORDERS)
    for noise in (NoiseSpec(1.0, 1.0, "freq", "corrected"), NoiseSpec(1.0, 1.0, "freq", "paper"),
                  NoiseSpec(1.0, 1.0, "standard")):
        assert Accountant(noise.mechanism).mechanism == noise.mechanism


def test_none_mechanism_is_refused():
    with pytest.raises(ValueError, match="non-private baseline"):
        Accountant("none")
    with pytest.raises(ValueError, match="non-private baseline"):
        per_step_rdp("none", SPEC, 1.0)
    with pytest.raises(ValueError, match="`mechanism` must be one of"):
        Accountant("gaussian-ish")


def test_composition_history_and_epsilon_after():
    acc = Accountant("freq_paper")
    assert acc.get_epsilon(1e-5) == 0.0 and acc.steps == 0
    predicted = acc.epsilon_after(SPEC, 1.0, 1e-5, num_steps=10)
    acc.step(SPEC, 1.0, num_steps=4)
    acc.step(SPEC, 1.0, num_steps=6)
    assert acc.get_epsilon(1e-5) == pytest.approx(predicted, rel=1e-12)
    acc.step(SPEC2, 0.8)
    acc.step(SPEC, 1.0, num_steps=2)
    assert acc.steps == 13
    expected = 12 * per_step_rdp("freq_paper", SPEC, 1.0) + per_step_rdp("freq_paper", SPEC2, 0.8)
    np.testing.assert_allclose(acc.rdp(), expected, rtol=1e-12)
    eps, order = acc.get_epsilon_and_order(1e-5)
    ref_eps, ref_order = rdp_to_epsilon(DEFAULT_ORDERS, expected, 1e-5)
    assert eps == pytest.approx(ref_eps, rel=1e-12) and order == ref_order
    # epsilon_after with a different spec, and the state is unchanged by it
    before = acc.rdp()
    after = acc.epsilon_after(SPEC2, 0.8, 1e-5, num_steps=3)
    np.testing.assert_array_equal(acc.rdp(), before)
    acc.step(SPEC2, 0.8, num_steps=3)
    assert acc.get_epsilon(1e-5) == after


def test_failed_step_leaves_state_unchanged():
    acc = Accountant("standard")
    acc.step(SPEC, 1.0, num_steps=3)
    rdp, steps = acc.rdp(), acc.steps
    bad = [
        ((SPEC, 0.0), ValueError, "noise_multiplier"),
        ((SPEC, -1.0), ValueError, "noise_multiplier"),
        ((SPEC, 1.0, 0), ValueError, "num_steps"),
        ((SPEC, 1.0, 1.5), TypeError, "num_steps"),
        (("not a spec", 1.0), TypeError, "sampling"),
        ((make_spec(n=100, m=50_000, gamma=2e-3, k=2), 1.0), ValueError, "neg_per_pos"),
    ]
    for args, exc, name in bad:
        with pytest.raises(exc, match=name):
            acc.step(*args)
    np.testing.assert_array_equal(acc.rdp(), rdp)
    assert acc.steps == steps


def test_the_accountant_keeps_no_history_and_composes_runs_exactly():
    """The ledger is the only history; a run of steps composes bit-for-bit however it is fed (a resumed ledger replays
    t steps at once, an uninterrupted one step by step)."""
    acc = Accountant("freq_corrected", orders=[1.5, 2.0, 4.0, 8.0, 16.0])
    assert not hasattr(acc, "history") and not hasattr(acc, "state_dict")
    at_once, one_by_one = Accountant("standard"), Accountant("standard")
    at_once.step(SPEC, 1.0, 5)
    at_once.step(SPEC2, 1.3, 2)
    at_once.step(SPEC2, 1.3, 7)
    for spec, sigma, n in [(SPEC, 1.0, 5), (SPEC2, 1.3, 9)]:
        for _ in range(n):
            one_by_one.step(spec, sigma)
    np.testing.assert_array_equal(at_once.rdp(), one_by_one.rdp())
    assert at_once.steps == one_by_one.steps == 14


def test_per_step_rdp_is_cached_and_copied():
    mech_mod._cached_rdp.cache_clear()
    a = per_step_rdp("standard", SPEC, 1.1)
    hits = mech_mod._cached_rdp.cache_info().hits
    b = per_step_rdp("standard", SPEC, 1.1)
    assert mech_mod._cached_rdp.cache_info().hits == hits + 1
    np.testing.assert_array_equal(a, b)
    a[:] = -1.0  # a copy: the cache is not corrupted
    assert np.all(per_step_rdp("standard", SPEC, 1.1) >= 0)


def test_registry_accepts_new_mechanisms():
    name = "test_constant_mechanism"
    if name not in registered_mechanisms():
        register_mechanism(name, lambda s, sigma, orders: np.full(len(orders), 0.01 / sigma),
                           description="test", privacy_unit=PrivacyUnit("test_unit", "one test unit"))
    acc = Accountant(name)
    acc.step(SPEC, 2.0, 10)
    np.testing.assert_allclose(acc.rdp(), 0.05)
    assert acc.privacy_unit == "one test unit"
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism(name, lambda s, sigma, orders: orders, description="dup")
    with pytest.raises(ValueError, match="name"):
        register_mechanism("none", lambda s, sigma, orders: orders, description="x")


def test_poisson_gaussian_is_per_example():
    acc = Accountant("poisson_gaussian")
    assert acc.privacy_unit != PRIVACY_UNIT and "example" in acc.privacy_unit


@pytest.mark.parametrize("mechanism,target", [("freq_paper", 4.0), ("standard", 10.0), ("freq_corrected", 4.0)])
def test_noise_multiplier_for_meets_target_within_one_percent(mechanism, target):
    sigma = noise_multiplier_for(target, delta=1e-5, steps=2_000, sampling=SPEC, mechanism=mechanism)
    eps = rdp_to_epsilon(DEFAULT_ORDERS, 2_000 * per_step_rdp(mechanism, SPEC, sigma), 1e-5)[0]
    assert eps <= target
    assert eps >= 0.99 * target


def test_max_steps_for_is_the_largest_feasible_t():
    r = per_step_rdp("freq_paper", SPEC, 1.0)
    t = max_steps_for(3.0, delta=1e-5, noise_multiplier=1.0, sampling=SPEC, mechanism="freq_paper")
    assert t >= 1
    assert rdp_to_epsilon(DEFAULT_ORDERS, t * r, 1e-5)[0] <= 3.0
    assert rdp_to_epsilon(DEFAULT_ORDERS, (t + 1) * r, 1e-5)[0] > 3.0
    assert max_steps_for(1e-6, delta=1e-5, noise_multiplier=1.0, sampling=SPEC, mechanism="freq_paper") == 0


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: make_spec(gamma=0.0), "sampling_rate"),
        (lambda: make_spec(gamma=1.5), "sampling_rate"),
        (lambda: make_spec(K=0), "max_degree"),
        (lambda: make_spec(m=0), "num_edges"),
        (lambda: make_spec(n=0), "num_nodes"),
    ],
)
def test_bad_sampling_parameters_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="neg_per_pos"):
        per_step_rdp("freq_corrected", make_spec(n=150, m=50_000, gamma=2e-3, k=2), 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        per_step_rdp("freq_corrected", SPEC, 0.0)
    for delta in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match="delta"):
            Accountant("freq_paper").get_epsilon(delta)
        with pytest.raises(ValueError, match="delta"):
            noise_multiplier_for(4.0, delta=delta, steps=10, sampling=SPEC, mechanism="freq_paper")
    with pytest.raises(ValueError, match="target_epsilon"):
        noise_multiplier_for(-1.0, delta=1e-5, steps=10, sampling=SPEC, mechanism="freq_paper")
    with pytest.raises(ValueError, match="steps"):
        noise_multiplier_for(4.0, delta=1e-5, steps=0, sampling=SPEC, mechanism="freq_paper")
    with pytest.raises(ValueError, match="orders"):
        Accountant("freq_paper", orders=[0.5, 2.0])
