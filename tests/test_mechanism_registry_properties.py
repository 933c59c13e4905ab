"""Properties every registered mechanism must have: a declared unit, ε monotone in steps and in σ⁻¹, foreign units refused."""

from __future__ import annotations

import pytest

from lightning_dprel.accounting import Accountant, get_mechanism, registered_mechanisms
from lightning_dprel.accounting.mechanisms import check_unit
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.datamodules.edge_tuples.graph_prep import NO_DEGREE_CAP
from lightning_dprel.core.specs import PRIVACY_UNITS, SamplingSpec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _spec(unit: str, name: str = "") -> SamplingSpec:
    if name == "banded_poisson_gaussian":  # proven only for cyclic Poisson sampling (2 partitions here)
        from lightning_dprel.accounting.mechanisms.banded import CyclicPoisson

        return SamplingSpec(population=50, sampling_rate=0.2, expected_batch_size=10.0, steps_per_epoch=10,
                            privacy_unit=unit, num_units=100, detail=CyclicPoisson(2))
    if unit == "entity":
        return SamplingSpec(num_nodes=5000, num_edges=10000, max_degree=3, sampling_rate=0.01, neg_per_pos=1,
                            expected_batch_size=100.0, steps_per_epoch=100)
    uncapped = unit == "edge"  # edge-level data cap no degree (skipgram_edge's premise, checked with the unit)
    return SamplingSpec(num_nodes=50, num_edges=50, max_degree=NO_DEGREE_CAP if uncapped else 1, sampling_rate=0.2,
                        neg_per_pos=0, expected_batch_size=10.0, steps_per_epoch=5, privacy_unit=unit, num_units=400)


def _eps(name: str, unit: str, sigma: float, steps: int, accountant: str = "pld") -> float:
    acc = Accountant(name, accountant=accountant)
    mech = get_mechanism(name)
    acc.step(_spec(unit, name) if mech.needs_sampling else None, sigma, steps, mechanism=name)
    return acc.get_epsilon(1e-5)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("name", registered_mechanisms())
def test_every_mechanism_declares_its_unit_and_epsilon_is_monotone(name, accountant):
    mech = get_mechanism(name)
    assert mech.unit is not None or not mech.needs_sampling  # only a release whose event states its unit may omit it
    unit = mech.unit.name if mech.unit is not None else "entity"
    assert unit in PRIVACY_UNITS and mech.privacy_unit
    by_steps = [_eps(name, unit, 1.5, t, accountant) for t in (1, 5, 20, 80)]
    assert all(a < b for a, b in zip(by_steps, by_steps[1:])), by_steps
    by_sigma = [_eps(name, unit, s, 10, accountant) for s in (4.0, 2.0, 1.0, 0.6)]  # σ⁻¹ increasing
    assert all(a < b for a, b in zip(by_sigma, by_sigma[1:])), by_sigma


@pytest.mark.parametrize("name", [n for n in registered_mechanisms() if get_mechanism(n).clipping])
@pytest.mark.parametrize("data_unit", sorted(PRIVACY_UNITS))
def test_a_module_mechanism_is_refused_for_data_sampled_for_another_unit(name, data_unit):
    mech = get_mechanism(name)
    ledger = PrivacyLedger()
    ledger.open(_spec(data_unit, name))
    clipping = mech.clipping[0]
    if mech.unit.name == data_unit:
        ledger.check_mechanism(name, clipping)
        check_unit(name, data_unit)
        return
    with pytest.raises(ValueError, match=rf"(?s)mechanism {name!r} is proven for the unit {mech.unit.name!r}.*{data_unit!r}"):
        ledger.check_mechanism(name, clipping)
