"""AdvSGM accounting (issue 22, acceptance A1): the provable ``skipgram_public_ids`` and the paper's Theorem 7."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_dprel.accounting import DEFAULT_ORDERS, Accountant, get_mechanism, per_step_rdp
from lightning_dprel.accounting.mechanisms import check_unit
from lightning_dprel.methods.advsgm.accounting import (
    ADVSGM_PAPER_WARNING,
    NODE_PUBLIC_IDS,
    advsgm_paper_epsilon,
    advsgm_paper_sampling,
    advsgm_paper_stop_iteration,
)
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import PRIVACY_UNITS, SamplingSpec
from lightning_dprel.demos.specs import make_spec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# PPI as the paper trains it: |V| = 3,890, |E| = 0.9·76,584 training edges (68,925.6 → 68,926), B = 128, k = 5.
PPI = dict(num_nodes=3890, num_edges=round(0.9 * 76_584), batch_size=128, k=5, sigma=5.0, delta=1e-5)
DATASETS = {"ppi": (3890, 76_584, 4.30), "facebook": (4039, 88_234, 4.12), "blog": (10_312, 333_983, 1.45)}


def _eps(mechanism: str, spec: SamplingSpec, sigma: float, steps: int, delta: float = 1e-5, accountant: str = "rdp") -> float:
    acc = Accountant(mechanism, accountant=accountant)
    acc.step(spec, sigma, steps, mechanism=mechanism)
    return acc.get_epsilon(delta)


# ---------------------------------------------------------------- advsgm_paper (Theorem 7 as published)

def test_theorem7_stop_iterations_on_ppi():
    assert [advsgm_paper_stop_iteration(t, **PPI) for t in (1, 2, 3, 4)] == [50, 187, 393, 660]
    # ε(750) = 4.30 < 5: the 750-iteration cap (n_epoch·n_D = 50·15) stops the run for ε ≥ 5
    assert [advsgm_paper_stop_iteration(t, **PPI) for t in (5, 6)] == [750, 750]
    # "stops at T" = T iterations within the budget, the next one would exceed it
    for target, stop in ((1, 50), (4, 660)):
        assert advsgm_paper_epsilon(stop, **PPI) <= target < advsgm_paper_epsilon(stop + 1, **PPI)


def test_code_product_stop_iterations_on_ppi():
    got = [advsgm_paper_stop_iteration(t, rule="code_product", **PPI) for t in range(1, 7)]
    assert got == [28, 104, 210, 345, 495, 675]


def test_stop_rule_is_checked():
    with pytest.raises(ValueError, match="rule"):
        advsgm_paper_stop_iteration(1.0, rule="paper", **PPI)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_theorem7_epsilon_after_750_iterations(name):
    n, e, expected = DATASETS[name]
    eps = advsgm_paper_epsilon(750, num_nodes=n, num_edges=round(0.9 * e), batch_size=128, k=5, sigma=5.0, delta=1e-5)
    assert round(eps, 2) == expected
    # the training-edge count's rounding does not matter at 2 decimals
    for m in (math.floor(0.9 * e), math.ceil(0.9 * e)):
        other = advsgm_paper_epsilon(750, num_nodes=n, num_edges=m, batch_size=128, k=5, sigma=5.0, delta=1e-5)
        assert round(other, 2) == expected


def test_advsgm_paper_is_the_registered_mechanism_and_warns():
    mech = get_mechanism("advsgm_paper")
    assert mech.warning == ADVSGM_PAPER_WARNING
    assert "does not hold" in mech.warning and "∞" in mech.warning
    assert mech.clipping == () and mech.unit.name == "node_replace" and mech.unit.name in PRIVACY_UNITS
    spec = advsgm_paper_sampling(num_nodes=3890, num_edges=PPI["num_edges"], batch_size=128, k=5)
    assert spec.expected_batch_size == pytest.approx(128) and spec.sampling_rate == 128 / PPI["num_edges"]
    assert _eps("advsgm_paper", spec, 5.0, 750) == pytest.approx(advsgm_paper_epsilon(750, **PPI), rel=1e-9)


def test_advsgm_paper_per_step_equals_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    for n, m, b, k, sigma in ((3890, PPI["num_edges"], 128, 5, 5.0), (4039, 79_411, 128, 5, 2.0),
                              (10_312, 300_585, 512, 5, 1.0)):
        spec = advsgm_paper_sampling(num_nodes=n, num_edges=m, batch_size=b, k=k)
        ours = per_step_rdp("advsgm_paper", spec, sigma)
        acc = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
        gauss = dp_accounting.GaussianDpEvent(sigma)
        acc.compose(dp_accounting.PoissonSampledDpEvent(b / m, gauss))
        acc.compose(dp_accounting.PoissonSampledDpEvent(min(1.0, b * k / n), gauss))
        ref = np.asarray(acc._rdp)
        # integer orders agree; at fractional orders dp-accounting's series (|C(α, i)| for every term) is a looser
        # upper bound (see tests/test_accounting_reference.py)
        integer = DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)
        np.testing.assert_allclose(ours[integer], ref[integer], rtol=1e-6, atol=0)
        assert np.all(ours[~integer] <= ref[~integer] * (1 + 1e-9))


# ---------------------------------------------------------------- skipgram_public_ids (provable mode)

def test_public_ids_ppi_case():
    # σ = 5, b = 128, k = 5, K = 5, m = 9,725 capped edges, n = 3,890 nodes, δ = 1e-5 (γ = 128/9,725)
    pub = make_spec(3890, 9725, 5, 128 / 9725, 5, unit="node_public_ids")
    ent = make_spec(3890, 9725, 5, 128 / 9725, 5)
    assert [round(_eps("skipgram_public_ids", pub, 5.0, t), 2) for t in (28, 675, 750)] == [0.28, 1.47, 1.55]
    assert [round(_eps("standard", ent, 5.0, t), 2) for t in (28, 675, 750)] == [2.12, 11.84, 12.61]
    # the tight accountant (the mixture's PLD, below RDP); the coupled `standard` has no proven pair and keeps RDP
    tight = [_eps("skipgram_public_ids", pub, 5.0, t, accountant="pld") for t in (28, 675, 750)]
    assert all(p < r for p, r in zip(tight, (0.28, 1.47, 1.55))) and tight[0] < tight[1] < tight[2]
    assert _eps("standard", ent, 5.0, 750, accountant="pld") == _eps("standard", ent, 5.0, 750)


@pytest.mark.parametrize("gamma,sigma", [(0.01, 1.0), (1e-3, 0.5), (0.1, 3.0), (0.3, 2.0)])
def test_public_ids_equals_poisson_gaussian_at_k1(gamma, sigma):
    m = 100_000
    pub = make_spec(50_000, m, 1, gamma, 4, unit="node_public_ids")
    ex = make_spec(50_000, m, 1, gamma, 4, unit="example")
    np.testing.assert_allclose(per_step_rdp("skipgram_public_ids", pub, sigma), per_step_rdp("poisson_gaussian", ex, sigma),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("K,k,gamma,sigma", [(5, 5, 128 / 9725, 5.0), (3, 1, 0.01, 1.0), (10, 4, 0.05, 2.0),
                                             (40, 1, 0.002, 1.5)])
def test_public_ids_never_above_standard(K, k, gamma, sigma):
    m = 20_000
    pub = per_step_rdp("skipgram_public_ids", make_spec(5000, m, K, gamma, k, unit="node_public_ids"), sigma)
    std = per_step_rdp("standard", make_spec(5000, m, K, gamma, k), sigma)
    assert np.all(pub <= std * (1 + 1e-9))


def test_public_ids_mechanism_and_unit_refusal():
    mech = get_mechanism("skipgram_public_ids")
    assert mech.unit == NODE_PUBLIC_IDS and PRIVACY_UNITS["node_public_ids"] == NODE_PUBLIC_IDS
    assert mech.clipping == ("standard",) and mech.accounting == "skipgram_public_ids" and mech.warning is None
    check_unit("skipgram_public_ids", "node_public_ids")
    ledger = PrivacyLedger()
    ledger.open(make_spec(3890, 9725, 5, 128 / 9725, 5))  # sampled for entities (private ids)
    with pytest.raises(ValueError, match=r"(?s)'skipgram_public_ids' is proven for the unit 'node_public_ids'.*'entity'"):
        ledger.check_mechanism("skipgram_public_ids", "standard")
