"""White-box audit of Confident-GNMax: worst-case neighbouring vote histograms, audited ε_lb ≤ the proven ε of a query."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lightning_dprel.audit import audit_confident_gnmax, neighbouring_histograms
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.methods.dp_gpl.aggregation import pate_releases

N, C, T, TRIALS = 250, 26, 120, 200_000

pytestmark = pytest.mark.usefixtures("one_thread")


def _audit(sigma: float, seed: int = 0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # seeded noise warns; an audit wants it reproducible
        return audit_confident_gnmax(N, C, T, sigma, sigma, trials=TRIALS, seed=seed, delta=1e-5)


@pytest.mark.parametrize("threshold", [120, 125.5, 150, 240])
def test_candidates_are_neighbours_at_the_threshold_and_at_a_tie(threshold):
    pairs = neighbouring_histograms(N, C, threshold)
    top = math.ceil(threshold)
    assert pairs and pairs[-1][0] == "near tie"
    for name, c in pairs:
        d, d_prime = torch.tensor(c), torch.tensor([c[0] - 1, c[1] + 1] + c[2:])
        assert len(c) == C and int(d.sum()) == N and min(c) >= 0 and int(d_prime.min()) >= 0
        assert (d - d_prime).abs().sum() == 2  # one teacher's vote moved from a to b
        if name.startswith("threshold"):
            assert (int(d.max()), int(d_prime.max())) == (top, top - 1) and int(d.argmax()) == 0
        else:
            assert int(d.argmax()) == 0 and int(d_prime.argmax()) == 1 and d.max() == d_prime.max()


@pytest.mark.slow
def test_audit_at_sigma_40_is_positive_and_below_the_proven_epsilon():
    res = _audit(40.0)
    print(f"\nσ = 40: audited ε_lb = {res.epsilon:.4f} ≤ proven ε = {res.proven_epsilon:.4f} ({res.pair}, "
          f"{res.event}, {res.direction}: p = {res.p:.4f}, q = {res.q:.4f})")
    # one query: the threshold at σ₁ = 40 and the votes at σ₂/√2, together one Gaussian at 40/√3 (1/σ² add). RDP gives
    # 0.161; the reported (PLD) ε is that Gaussian's exact ε (Balle & Wang 2018)
    exact = _analytic_gaussian_epsilon(40.0 / math.sqrt(3.0), 1e-5)
    assert exact - 1e-6 <= res.proven_epsilon <= exact + 1e-3 and res.proven_epsilon < 0.161
    assert 0.0 < res.epsilon <= res.proven_epsilon and not res.violation


@pytest.mark.slow
def test_audit_detects_leakage_at_tiny_noise():
    res = _audit(0.5)
    print(f"\nσ = 0.5: audited ε_lb = {res.epsilon:.3f} ≤ proven ε = {res.proven_epsilon:.3f} ({res.pair}, {res.event})")
    assert 1.0 < res.epsilon <= res.proven_epsilon
    # an accountant claiming σ = 40's ε for these releases would be refuted
    ledger = PrivacyLedger()
    for release in pate_releases(sigma_threshold=40.0, sigma_vote=40.0, queries=1):
        ledger.charge(release)
    assert res.epsilon > ledger.epsilon(1e-5)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="trials"):
        audit_confident_gnmax(N, C, T, 1.0, 1.0, trials=2, seed=0, delta=1e-5)
    with pytest.raises(ValueError, match="confidence"):
        audit_confident_gnmax(N, C, T, 1.0, 1.0, trials=100, seed=0, delta=1e-5, confidence=1.0)


def _analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε of one Gaussian release of sensitivity 1 at noise σ (Balle & Wang 2018, Theorem 8), by bisection."""
    from scipy.stats import norm

    def delta_at(eps: float) -> float:
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)

    lo, hi = 0.0, 10.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
    return hi
