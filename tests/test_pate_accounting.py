"""Confident-GNMax accounting (``accounting/analysis/pate.py``) against dp-accounting and tensorflow/privacy's
``research/pate_2018/core.py`` (Papernot et al. 2018), and the DP-GPL spec's sizing."""

from __future__ import annotations

import math

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")

from lightning_dprel.accounting import DEFAULT_ORDERS  # noqa: E402
from lightning_dprel.accounting.analysis import pate as P  # noqa: E402
from lightning_dprel.core.ledger import PrivacyLedger  # noqa: E402
from lightning_dprel.methods.dp_gpl.aggregation import pate_releases  # noqa: E402

DELTA = 1e-5


def _dp_accounting(sigma1: float, sigma2: float, queries: int, answered: int | None = None):
    # dp-accounting has no PATE event: threshold = GaussianDpEvent(σ₁), GNMax (sensitivity √2) = GaussianDpEvent(σ₂/√2).
    acc = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(sigma1), queries)
    answered = queries if answered is None else answered
    if answered:  # dp-accounting refuses count = 0
        acc.compose(dp_accounting.GaussianDpEvent(sigma2 / math.sqrt(2.0)), answered)
    return acc


# --- data-independent ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma1,sigma2,queries,answered", [(10.0, 20.0, 50, None), (1.0, 50.0, 50, None),
                                                             (5.0, 100.0, 200, 37), (50.0, 50.0, 50, 0)])
def test_independent_rdp_and_epsilon_equal_dp_accounting(sigma1, sigma2, queries, answered):
    ours = P.pate_independent_rdp(sigma1, sigma2, queries, DEFAULT_ORDERS, answered=answered)
    ref = _dp_accounting(sigma1, sigma2, queries, answered)
    np.testing.assert_allclose(ours, ref._rdp, rtol=1e-6, atol=0)
    assert P.epsilon_from_rdp(ours, DEFAULT_ORDERS, DELTA) == pytest.approx(ref.get_epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize("sigma1,sigma2,queries", [(10.0, 20.0, 50), (1.0, 50.0, 50), (5.0, 100.0, 200)])
def test_ledger_charged_with_pate_releases_equals_dp_accounting(sigma1, sigma2, queries):
    ledger = PrivacyLedger()
    for event in pate_releases(sigma_threshold=sigma1, sigma_vote=sigma2, queries=queries):
        ledger.charge(event)
    ref = _dp_accounting(sigma1, sigma2, queries).get_epsilon(DELTA)
    assert ledger.epsilon(DELTA, accountant="rdp") == pytest.approx(ref, rel=1e-6)
    own = P.epsilon_from_rdp(P.pate_independent_rdp(sigma1, sigma2, queries, DEFAULT_ORDERS), DEFAULT_ORDERS, DELTA)
    assert ledger.epsilon(DELTA, accountant="rdp") == pytest.approx(own, rel=1e-6)
    # the reported ε: the Gaussian releases' PLD (dp-accounting's PLD accountant on the same events), below RDP
    dp_accounting = pytest.importorskip("dp_accounting")
    tight = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    tight.compose(dp_accounting.GaussianDpEvent(sigma1), queries)
    tight.compose(dp_accounting.GaussianDpEvent(sigma2 / 2**0.5), queries)
    assert tight.get_epsilon(DELTA) - 1e-6 <= ledger.epsilon(DELTA) <= tight.get_epsilon(DELTA) + 5e-3 < ref


# --- data-dependent: reference values ---------------------------------------------------------------------------
# Provenance: tensorflow/privacy @ 03035d5d4a271ac795dab80f5bc1cef82fc3d462, research/pate_2018/core.py, run
# unmodified (numpy 2.4, scipy 1.17): GNMax = rdp_gaussian(compute_logq_gaussian(h, σ₂), σ₂, ORDERS); threshold =
# compute_rdp_threshold(compute_logpr_answered(T, σ₁, h), σ₁, ORDERS). Cases chosen where Thm 6 applies at some orders.
ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0])
UNANIMOUS, SPLIT, NEAR_TIE, CLEAR = [250, 0, 0, 0, 0], [160, 60, 20, 10, 0], [101, 99, 50, 0, 0], [200, 30, 20, 0, 0]
GNMAX_REF = [  # (histogram, σ₂, log q, RDP at ORDERS)
    (UNANIMOUS, 40.0, -10.830158510505367, [6.933736086119801e-06, 7.08043048090962e-06, 7.399619350862934e-06,
     8.157783893505181e-06, 9.683463200953097e-06, 1.792271844491004e-05, 0.00010957675201142871,
     0.007990848454374406, 0.07989450107953094]),
    (SPLIT, 20.0, -8.497821391393757, [0.00013291414339002466, 0.00013802388061007323, 0.00014992434269012154,
     0.0001825451105269126, 0.00026708577396162485, 0.0011631239817549164, 0.03383359110438426, 0.16, 0.32]),
    (CLEAR, 40.0, -6.005431638179212, [0.0006327576442490242, 0.0006426216757845224, 0.0006636118441902541,
     0.0007112199475728825, 0.0007996163844274734, 0.0011879146556655973, 0.0036464389831684873,
     0.030407870794724588, 0.08]),
    (NEAR_TIE, 20.0, -0.6775607074242276, (ORDERS / 400.0).tolist()),  # conditions fail: data-independent α/σ₂²
]
THRESHOLD_REF = [  # (histogram, σ₁, log Pr[answered] at T = 150, RDP at ORDERS)
    (UNANIMOUS, 40.0, -0.00622902548586, [0.00046874999999999993, 0.0006249999999999999, 0.0009374999999999999,
     0.0010968822973963957, 0.0011753293402840656, 0.0014598200619514719, 0.0026020771938756178,
     0.01089566865731587, 0.039999999999999994]),
    (NEAR_TIE, 10.0, -14.551182689355313, [6.384267389006516e-07, 6.853396269668279e-07, 8.108191705427537e-07,
     1.2762514927844666e-06, 3.3647336816184283e-06, 0.00011274674291737057, 0.0780760717357327,
     0.31999999999999995, 0.6399999999999999]),
    (CLEAR, 10.0, -2.8665161296376294e-07, [3.901148538017903e-07, 4.1930409489788116e-07, 4.977975962395869e-07,
     7.924546125962538e-07, 2.1439505220995285e-06, 7.770506868665313e-05, 0.07164516478891096,
     0.31999999999999995, 0.6399999999999999]),
]
# Σ_j compute_rdp_threshold + Σ_{answered j} rdp_gaussian (rdp_cumulative.py's sum, realised answered set) over
# [UNANIMOUS, SPLIT, NEAR_TIE, CLEAR], T = 150, σ₁ = 10, σ₂ = 40, answered = [T, F, T, T]; same source.
TOTAL_REF = [0.009078219921927845, 0.011900806749987296, 0.017547320080307897, 0.028846446437571765,
             0.045814808531832146, 0.09139628918571452, 0.33347725228217223, 1.2302647830717985, 2.7998945010795304]


@pytest.mark.parametrize("hist,sigma2,logq,rdp", GNMAX_REF)
def test_gnmax_data_dependent_equals_pate_2018(hist, sigma2, logq, rdp):
    assert float(P.log_q_gnmax(hist, sigma2)) == pytest.approx(logq, rel=1e-9)
    np.testing.assert_allclose(P.rdp_gnmax_data_dependent(logq, sigma2, ORDERS), rdp, rtol=1e-6, atol=0)


@pytest.mark.parametrize("hist,sigma1,log_pr,rdp", THRESHOLD_REF)
def test_threshold_data_dependent_equals_pate_2018(hist, sigma1, log_pr, rdp):
    assert float(P.log_pr_answered(150.0, sigma1, hist)) == pytest.approx(log_pr, rel=1e-9)
    np.testing.assert_allclose(P.rdp_threshold_data_dependent(log_pr, sigma1, ORDERS), rdp, rtol=1e-6, atol=0)


def test_batched_total_equals_pate_2018_sum():
    counts = np.array([UNANIMOUS, SPLIT, NEAR_TIE, CLEAR], float)
    mask = np.array([True, False, True, True])
    total = P.pate_data_dependent_rdp(counts, 150.0, 10.0, 40.0, ORDERS, answered=mask)
    np.testing.assert_allclose(total, TOTAL_REF, rtol=1e-6, atol=0)
    # batched kernels give each row's own value
    rows = [P.rdp_gnmax_data_dependent(P.log_q_gnmax(h, 40.0), 40.0, ORDERS) for h in counts]
    np.testing.assert_array_equal(P.rdp_gnmax_data_dependent(P.log_q_gnmax(counts, 40.0), 40.0, ORDERS), rows)


# --- data-dependent: degenerate cases --------------------------------------------------------------------------
def test_near_tie_costs_the_data_independent_bound():
    np.testing.assert_allclose(P.rdp_gnmax_data_dependent(P.log_q_gnmax(NEAR_TIE, 20.0), 20.0),
                               P.rdp_gnmax_independent(20.0), rtol=1e-12)
    # max count near T: Pr[answered] near 1/2, the threshold step costs its data-independent α/(2σ₁²)
    np.testing.assert_allclose(P.rdp_threshold_data_dependent(P.log_pr_answered(160.0, 10.0, SPLIT), 10.0),
                               P.rdp_threshold_independent(10.0), rtol=1e-12)


def test_unanimous_votes_cost_far_below_the_data_independent_bound():
    counts = np.tile([1000.0, 0, 0, 0, 0], (50, 1))
    dep = P.pate_data_dependent_rdp(counts, 600.0, 100.0, 100.0)
    ind = P.pate_independent_rdp(100.0, 100.0, 50)
    low = DEFAULT_ORDERS <= 64
    assert np.all(dep[low] < 0.06 * ind[low])
    assert P.epsilon_from_rdp(dep, DEFAULT_ORDERS, DELTA) < 0.2 * P.epsilon_from_rdp(ind, DEFAULT_ORDERS, DELTA)
    assert np.all(P.rdp_gnmax_data_dependent(-np.inf, 5.0) == 0.0)  # a certain answer costs nothing


def test_data_dependent_never_exceeds_data_independent():
    rng = np.random.default_rng(0)
    for _ in range(200):
        c = int(rng.integers(2, 10))
        probs = rng.dirichlet(np.full(c, rng.choice([0.05, 1.0, 5.0])))
        counts = rng.multinomial(int(rng.integers(1, 500)), probs, size=8).astype(float)
        s1, s2, t = float(rng.choice([1, 5, 40])), float(rng.choice([0.5, 10, 100])), float(rng.integers(0, 500))
        mask = rng.random(8) < 0.5
        dep = P.pate_data_dependent_rdp(counts, t, s1, s2, answered=mask)
        ind = P.pate_independent_rdp(s1, s2, 8, answered=int(mask.sum()))
        assert np.all(dep >= 0) and np.all(dep <= ind * (1 + 1e-12))


# --- sizing (spec: δ = 1e-5, σ₁ = σ₂ = σ) --------------------------------------------------------------------------
@pytest.mark.parametrize("queries,epsilon,expected", [(50, 1.0, 50), (50, 2.0, 26), (50, 4.0, 14),
                                                      (200, 1.0, 99), (200, 2.0, 53), (200, 4.0, 28)])
def test_sigma_for_epsilon_meets_the_spec_sizing(queries, epsilon, expected):
    sigma = P.sigma_for_epsilon(epsilon, DELTA, queries)
    assert round(sigma) == expected
    assert _dp_accounting(sigma, sigma, queries).get_epsilon(DELTA) == pytest.approx(epsilon, rel=1e-6)


# --- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda: P.rdp_threshold_independent(0.0),
    lambda: P.rdp_gnmax_independent(-1.0),
    lambda: P.rdp_gnmax_independent(1.0, [0.5, 2.0]),
    lambda: P.pate_independent_rdp(1.0, 1.0, 10, [1.0]),
    lambda: P.pate_independent_rdp(1.0, 1.0, 10, answered=11),
    lambda: P.pate_independent_rdp(1.0, 1.0, -1),
    lambda: P.log_q_gnmax(np.zeros((2, 2, 3)), 1.0),
    lambda: P.log_q_gnmax([3.0, -1.0, 0.0], 1.0),
    lambda: P.log_q_gnmax([3.0], 1.0),
    lambda: P.log_pr_answered(10.0, 0.0, [3.0, 1.0]),
    lambda: P.rdp_gnmax_data_dependent(0.5, 1.0),
    lambda: P.rdp_threshold_data_dependent(-1.0, 1.0, [1.0, 2.0]),
    lambda: P.pate_data_dependent_rdp([3.0, 1.0], 1.0, 1.0, 1.0),
    lambda: P.pate_data_dependent_rdp([[3.0, -1.0]], 1.0, 1.0, 1.0),
    lambda: P.pate_data_dependent_rdp([[3.0, 1.0]], 1.0, 1.0, 1.0, answered=[1]),
    lambda: P.epsilon_from_rdp([1.0], [1.0], DELTA),
    lambda: P.sigma_for_epsilon(0.0, DELTA, 50),
    lambda: P.sigma_for_epsilon(1.0, DELTA, 0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
