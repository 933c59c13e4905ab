"""Against independent references: Opacus and dp-accounting for the K = 1, k = 0 case (issue 3 acceptance)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")
opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")

from lightning_dprel.accounting import DEFAULT_ORDERS, Accountant, per_step_rdp, rdp_to_epsilon  # noqa: E402
from lightning_dprel.accounting.analysis.sampled_gaussian import log_a_orders  # noqa: E402
from lightning_dprel.demos.specs import make_spec  # noqa: E402

# (γ, σ) with per-order RDP well above double-precision noise (≥ 1e-6 at α = 1.1).
SETTINGS = [(0.01, 1.0), (1e-3, 0.5), (0.1, 3.0), (0.05, 0.8), (0.3, 2.0), (0.2, 0.3)]


@functools.lru_cache(maxsize=None)
def _refs(gamma: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    orders = list(DEFAULT_ORDERS)
    return (opacus_rdp.compute_rdp(q=gamma, noise_multiplier=sigma, steps=1, orders=orders),
            _dp_accounting_rdp(gamma, sigma, DEFAULT_ORDERS)._rdp)


def _dp_accounting_rdp(gamma: float, sigma: float, orders: np.ndarray, steps: int = 1):
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    event = dp_accounting.PoissonSampledDpEvent(gamma, dp_accounting.GaussianDpEvent(sigma))
    acc.compose(event, steps)
    return acc


@pytest.mark.parametrize("gamma,sigma", SETTINGS)
@pytest.mark.parametrize("mechanism", ["standard", "freq_corrected", "freq_paper", "poisson_gaussian"])
def test_k1_k0_equals_opacus_and_dp_accounting(gamma, sigma, mechanism):
    # K = 1, k = 0: every profile reduces to (1−γ)N(0,σ²) + γ N(Δ(1,0), σ²); Δ(1,0) = 1 for the standard and
    # paper profiles (Theorem C.1 / Eq. 3). The corrected profile has Δ(1,0) = 1/2 + (1+0)/4 = 3/4: compare
    # it with the sampled Gaussian at σ/(3/4).
    scale = 0.75 if mechanism == "freq_corrected" else 1.0
    ours = per_step_rdp(mechanism, make_spec(n=50_000, m=100_000, K=1, gamma=gamma, k=0), sigma)
    ref_opacus, ref_dp = _refs(gamma, sigma / scale)
    assert ours.shape == DEFAULT_ORDERS.shape
    np.testing.assert_allclose(ours, ref_opacus, rtol=1e-6, atol=0)
    # dp-accounting agrees at integer orders. At fractional orders its series (`_compute_log_a_frac`) adds
    # |C(α, i)| for every term, ignoring the alternating signs of Mironov et al.'s series, so it is a (looser)
    # upper bound there: ours (= Opacus, the signed series) must not exceed it.
    integer = DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)
    np.testing.assert_allclose(ours[integer], ref_dp[integer], rtol=1e-6, atol=0)
    assert np.all(ours[~integer] <= ref_dp[~integer] * (1 + 1e-9))


@pytest.mark.parametrize("gamma,sigma", SETTINGS)
def test_sampled_gaussian_series_equals_opacus(gamma, sigma):
    # Our own closed form of A_α(q) (integer sum and fractional series), order by order.
    ours = log_a_orders(np.array([gamma]), sigma, DEFAULT_ORDERS)[0] / (DEFAULT_ORDERS - 1)
    ref = _refs(gamma, sigma)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("gamma,sigma,steps,delta", [(0.01, 1.0, 10_000, 1e-5), (1e-3, 0.6, 100_000, 1e-6),
                                                      (0.1, 3.0, 500, 1e-5)])
def test_composed_epsilon_equals_dp_accounting(gamma, sigma, steps, delta):
    acc = Accountant("standard")
    acc.step(make_spec(n=50_000, m=100_000, K=1, gamma=gamma, k=0), sigma, num_steps=steps)
    eps, order = acc.get_epsilon_and_order(delta)
    ref = _dp_accounting_rdp(gamma, sigma, DEFAULT_ORDERS, steps)
    ref_eps, ref_order = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(DEFAULT_ORDERS, ref._rdp, delta)
    assert abs(eps - ref_eps) <= 1e-3 * ref_eps
    assert order == ref_order
    # and the dp-accounting object itself (same conversion, Balle et al. 2020)
    assert abs(eps - ref.get_epsilon(delta)) <= 1e-3 * ref_eps


def test_conversion_equals_dp_accounting_on_random_curves():
    rng = np.random.default_rng(3)
    compute_epsilon = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon
    for _ in range(20):
        rdp = np.sort(rng.exponential(rng.uniform(1e-3, 5.0), DEFAULT_ORDERS.size)) * DEFAULT_ORDERS / 10
        delta = 10 ** rng.uniform(-9, -2)
        eps, order = rdp_to_epsilon(DEFAULT_ORDERS, rdp, delta)
        ref_eps, ref_order = compute_epsilon(DEFAULT_ORDERS, rdp, delta)
        assert eps == pytest.approx(ref_eps, rel=1e-12, abs=1e-12)
        assert order == ref_order
