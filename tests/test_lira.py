"""Online LiRA on synthetic shadows with a known truth; ROC summaries; the DP test TPR ≤ e^ε·FPR + δ."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from lightning_dprel.audit import dp_tpr_check, lira_scores, logit_confidence, logit_confidence_from_logits, roc_summary


def _world(delta_mu: float, targets: int = 2000, shadows: int = 16, seed: int = 0):
    """Per target μ ~ N(0, 3²): IN φ ~ N(μ + Δ, 1), OUT φ ~ N(μ, 1); the first half of the targets are members."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 3.0, targets)
    ins = rng.normal(mu[:, None] + delta_mu, 1.0, (targets, shadows))
    outs = rng.normal(mu[:, None], 1.0, (targets, shadows))
    member = np.arange(targets) < targets // 2
    target = rng.normal(mu + delta_mu * member, 1.0)
    return target, ins, outs, member


def test_logit_confidence_is_stable():
    p = torch.tensor([0.5, 0.9, 1e-3])
    assert torch.allclose(logit_confidence(p), torch.log(p / (1 - p)).double(), atol=1e-6)
    assert torch.isinf(logit_confidence(torch.tensor([1.0]))).all()
    logits = torch.tensor([[2.0, 0.5, -1.0], [100.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    phi = logit_confidence_from_logits(logits, torch.tensor([1, 0, 2]))
    probs = logits[0].double().softmax(0)
    assert phi[0].item() == pytest.approx(float(logit_confidence(probs[1])), rel=1e-9)
    assert phi[1].item() == pytest.approx(100.0 - math.log(2.0), rel=1e-12)  # p_y rounds to 1 in float64
    assert phi[2].item() == pytest.approx(-math.log(2.0), rel=1e-12)


@pytest.mark.parametrize("fixed_variance", [False, True])
def test_no_signal_gives_chance_auc(fixed_variance):
    target, ins, outs, member = _world(0.0)
    roc = roc_summary(lira_scores(target, ins, outs, fixed_variance=fixed_variance), member)
    assert abs(roc.auc - 0.5) < 0.05 and (roc.members, roc.non_members) == (1000, 1000)


@pytest.mark.parametrize("fixed_variance", [False, True])
def test_a_large_shift_is_detected(fixed_variance):
    target, ins, outs, member = _world(4.0)
    roc = roc_summary(lira_scores(target, ins, outs, fixed_variance=fixed_variance), member)
    assert roc.auc > 0.95 and roc.tprs[0] > 0.5, roc
    # per-target calibration is the point: a global threshold on φ itself is far weaker (μ varies by ±3)
    assert roc_summary(target, member).tprs[0] < roc.tprs[0] / 2


def test_scores_are_the_gaussian_log_likelihood_ratio_and_nan_padding_is_ignored():
    rng = np.random.default_rng(1)
    ins, outs, target = rng.normal(1, 2, (3, 5)), rng.normal(0, 1, (3, 4)), rng.normal(0, 1, 3)
    ins[1, 3:] = np.nan  # target 1 has 3 IN shadows
    got = lira_scores(target, ins, outs).numpy()
    for t in range(3):
        a, b = ins[t][~np.isnan(ins[t])], outs[t]
        want = stats.norm.logpdf(target[t], a.mean(), a.std(ddof=1)) - stats.norm.logpdf(target[t], b.mean(), b.std(ddof=1))
        assert got[t] == pytest.approx(want, rel=1e-10)


def test_fixed_variance_pools_the_residuals():
    rng = np.random.default_rng(2)
    r_in, r_out = rng.normal(size=8), rng.normal(size=8)
    mu, target = rng.normal(0, 3, 4), rng.normal(0, 3, 4)
    same_in, same_out = mu[:, None] + r_in, mu[:, None] + 0.5 + r_out  # equal variances across targets
    assert torch.allclose(lira_scores(target, same_in, same_out), lira_scores(target, same_in, same_out, fixed_variance=True))
    scale = np.array([0.1, 1.0, 3.0, 10.0])[:, None]  # variances differ: pooled σ ≠ per-target σ
    ins, outs = mu[:, None] + scale * r_in, mu[:, None] + 0.5 + scale * r_out
    per, fixed = lira_scores(target, ins, outs), lira_scores(target, ins, outs, fixed_variance=True)
    assert not torch.allclose(per, fixed, rtol=1e-3)
    sd_in = math.sqrt(((ins - ins.mean(1, keepdims=True)) ** 2).sum() / (ins.size - 4))  # 4 targets: ddof 1 each
    sd_out = math.sqrt(((outs - outs.mean(1, keepdims=True)) ** 2).sum() / (outs.size - 4))
    want = stats.norm.logpdf(target, ins.mean(1), sd_in) - stats.norm.logpdf(target, outs.mean(1), sd_out)
    assert np.allclose(fixed.numpy(), want, rtol=1e-10)


def test_roc_summary_on_a_hand_made_list():
    members, non_members = [10, 8, 7, 3], [9, 6, 5, 4, 2, 1, 0, -1, -2, -3]
    scores, labels = members + non_members, [1] * 4 + [0] * 10
    roc = roc_summary(scores, labels, fprs=(0.05, 0.1, 0.2))
    assert roc.tprs == (0.25, 0.75, 0.75)  # ≤ 0 / 1 / 2 false positives
    assert roc.auc == pytest.approx(34 / 40)
    huge = roc_summary([1e6 * s for s in scores], labels, fprs=(0.05, 0.1, 0.2))  # no sigmoid squashing
    assert huge.tprs == roc.tprs and huge.auc == pytest.approx(roc.auc)
    check = dp_tpr_check(scores, labels, epsilon=1.0, delta=0.0, fprs=(0.05, 0.1, 0.2))
    assert tuple(c.tpr for c in check.checks) == roc.tprs
    assert tuple(c.threshold for c in check.checks) == (10.0, 7.0, 6.0)


def test_dp_tpr_check_passes_for_epsilon_dp_scores():
    rng = np.random.default_rng(3)
    n, eps = 200_000, 1.0
    # Laplace mechanism on a bit (scale 1/ε): exactly ε-DP, and tight in the tails (TPR = e^ε·FPR beyond the shift)
    scores = np.concatenate([rng.laplace(1.0, 1 / eps, n), rng.laplace(0.0, 1 / eps, n)])
    member = np.arange(2 * n) < n
    check = dp_tpr_check(scores, member, epsilon=eps, delta=1e-5)
    assert check.passed and 0.5 < check.epsilon_lb <= eps, check
    # randomised response (P[1 | member] = e/(1+e)): the only useful threshold has FPR = 1/(1+e)
    rr = np.concatenate([rng.random(n) < math.e / (1 + math.e), rng.random(n) < 1 / (1 + math.e)]).astype(float)
    check = dp_tpr_check(rr, member, epsilon=eps, delta=1e-5, fprs=(0.3, 0.01))
    assert check.passed and 0.9 < check.epsilon_lb <= eps and check.checks[1].tpr == 0.0, check


def test_dp_tpr_check_fails_for_a_leaky_mechanism():
    rng = np.random.default_rng(4)
    n = 20_000
    scores = np.concatenate([rng.normal(4.0, 1.0, n), rng.normal(0.0, 1.0, n)])
    check = dp_tpr_check(scores, np.arange(2 * n) < n, epsilon=1.0, delta=1e-5)
    assert not check.passed and check.epsilon_lb > 3.0, check
    assert all(c.tpr_lower > c.bound for c in check.checks)


def test_bad_inputs_raise():
    ins, outs, target = np.zeros((2, 3)), np.ones((2, 3)), np.zeros(2)
    ins[1, 1:] = np.nan
    with pytest.raises(ValueError, match="< 2 in shadow"):
        lira_scores(target, ins, outs)
    with pytest.raises(ValueError, match="Need target_phi"):
        lira_scores(np.zeros(3), outs, outs)
    with pytest.raises(ValueError, match="finite"):
        lira_scores(np.array([np.inf, 0.0]), outs, outs)
    with pytest.raises(ValueError, match="infinite"):
        lira_scores(target, np.full((2, 3), np.inf), outs)
    with pytest.raises(ValueError, match="one member and one non-member"):
        roc_summary([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="booleans"):
        roc_summary([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="one entry per target"):
        roc_summary([0.1, 0.2, 0.3], [0, 1])
    with pytest.raises(ValueError, match="fprs"):
        roc_summary([0.1, 0.2], [0, 1], fprs=(0.0,))
    with pytest.raises(ValueError, match="delta"):
        dp_tpr_check([0.1, 0.2], [0, 1], epsilon=1.0, delta=1.5)
    with pytest.raises(ValueError, match="significance"):
        dp_tpr_check([0.1, 0.2], [0, 1], epsilon=1.0, delta=0.0, significance=0.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        logit_confidence([1.5])
    with pytest.raises(ValueError, match="labels"):
        logit_confidence_from_logits(torch.zeros(2, 3), torch.tensor([0, 3]))
