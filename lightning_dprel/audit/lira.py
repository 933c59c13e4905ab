"""Online LiRA (Carlini et al. 2022, Alg. 1) on logit-scaled confidences, ROC summaries and a DP hypothesis-test check.

Model-agnostic: every function takes arrays of φ = log(p/(1−p)) (p: the confidence in the true label), so any
prompt or model pipeline can score its targets. Higher scores mean "member".

References:
    Carlini, Chien, Nasr, Song, Terzis, Tramèr. Membership Inference Attacks From First Principles. IEEE S&P 2022.
    Kairouz, Oh, Viswanath. The Composition Theorem for Differential Privacy. ICML 2015 (TPR ≤ e^ε·FPR + δ).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_auroc, binary_roc

from lightning_dprel.audit.bounds import _check_delta, clopper_pearson, epsilon_lower_bound
from lightning_dprel.core.checks import check_probability, non_negative

__all__ = [
    "DPCheck",
    "RocSummary",
    "TprCheck",
    "dp_tpr_check",
    "lira_scores",
    "logit_confidence",
    "logit_confidence_from_logits",
    "roc_summary",
]

_MIN_STD = 1e-12  # a side whose shadows all agree: a near-point mass instead of a division by zero


def _f64(x: Any) -> Tensor:
    return torch.as_tensor(x).detach().to(device="cpu", dtype=torch.float64)


def logit_confidence(probs_true_class: Any) -> Tensor:
    """φ = log p − log(1 − p) of the true-class confidence p (Carlini et al. 2022, Sec. 4.2); ±inf at p ∈ {0, 1}."""
    p = _f64(probs_true_class)
    if ((p < 0) | (p > 1) | p.isnan()).any():
        raise ValueError("`probs_true_class` must lie in [0, 1].")
    return torch.log(p) - torch.log1p(-p)


def logit_confidence_from_logits(logits: Any, labels: Any) -> Tensor:
    """φ = log p_y − log Σ_{m≠y} p_m from logits [..., C] and labels [...], via log-softmax (finite where p_y ≈ 1)."""
    z, y = _f64(logits), torch.as_tensor(labels).long().cpu()
    if z.dim() < 1 or z.shape[-1] < 2 or z.shape[:-1] != y.shape:
        raise ValueError(f"Need logits [..., C ≥ 2] and labels [...], got {tuple(z.shape)} and {tuple(y.shape)}.")
    if ((y < 0) | (y >= z.shape[-1])).any():
        raise ValueError(f"`labels` must be class ids in [0, {z.shape[-1]}).")
    logp = torch.log_softmax(z, dim=-1)
    own = logp.gather(-1, y.unsqueeze(-1))
    rest = torch.logsumexp(logp.scatter(-1, y.unsqueeze(-1), -math.inf), dim=-1)
    return own.squeeze(-1) - rest


def _fit(phi: Tensor, side: str, fixed_variance: bool) -> tuple[Tensor, Tensor]:
    """Per-target mean and std of NaN-padded shadow values [T, K]; ``fixed_variance``: one pooled std for all."""
    ok = ~phi.isnan()
    n = ok.sum(dim=1)
    if (n < 2).any():
        bad = torch.nonzero(n < 2).flatten()[:5].tolist()
        raise ValueError(f"{int((n < 2).sum())} target(s) have < 2 {side} shadow values (e.g. targets {bad}); "
                         "LiRA fits a Gaussian per target and needs at least 2.")
    if torch.isinf(phi).any():
        raise ValueError(f"`{side}_phi` has infinite entries; clip p away from 0 and 1 or use logits.")
    mean = phi.nansum(dim=1) / n
    sq = torch.where(ok, phi - mean[:, None], torch.zeros_like(phi)).square()
    if fixed_variance:  # pooled over targets (the reference's fix_variance), unbiased
        var = (sq.sum() / (n.sum() - n.numel())).expand_as(mean)
    else:
        var = sq.sum(dim=1) / (n - 1)
    return mean, var.sqrt().clamp_min(_MIN_STD)


def _log_normal(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    return -0.5 * ((x - mean) / std).square() - std.log() - 0.5 * math.log(2 * math.pi)


def lira_scores(target_phi: Any, in_phi: Any, out_phi: Any, *, fixed_variance: bool = False) -> Tensor:
    """Online LiRA scores [T]: log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²) (Carlini et al. 2022, Alg. 1, line 10).

    Args:
        target_phi: ``[T]`` φ of each target under the attacked model.
        in_phi: ``[T, K_in]`` φ under shadows trained with the target (NaN pads targets with fewer shadows).
        out_phi: ``[T, K_out]`` φ under shadows trained without it (NaN-padded likewise).
        fixed_variance: one σ per side pooled over all targets (Sec. 5: better with few shadows).
    """
    t, ins, outs = _f64(target_phi), _f64(in_phi), _f64(out_phi)
    if t.dim() != 1 or ins.dim() != 2 or outs.dim() != 2 or ins.shape[0] != t.numel() or outs.shape[0] != t.numel():
        raise ValueError(f"Need target_phi [T], in_phi [T, K_in], out_phi [T, K_out], got {tuple(t.shape)}, "
                         f"{tuple(ins.shape)}, {tuple(outs.shape)}.")
    if not torch.isfinite(t).all():
        raise ValueError("`target_phi` must be finite (use logit_confidence_from_logits for p near 0 or 1).")
    (mu_in, sd_in), (mu_out, sd_out) = _fit(ins, "in", fixed_variance), _fit(outs, "out", fixed_variance)
    return _log_normal(t, mu_in, sd_in) - _log_normal(t, mu_out, sd_out)


def _scores_and_labels(scores: Any, is_member: Any) -> tuple[Tensor, Tensor]:
    s, m = _f64(scores).reshape(-1), torch.as_tensor(is_member).cpu().reshape(-1)
    if m.dtype != torch.bool:
        if not ((m == 0) | (m == 1)).all():
            raise ValueError("`is_member` must be booleans (or 0/1).")
        m = m.bool()
    if s.shape != m.shape:
        raise ValueError(f"`scores` ({s.numel()}) and `is_member` ({m.numel()}) need one entry per target.")
    if not torch.isfinite(s).all():
        raise ValueError("`scores` must be finite.")
    if not (m.any() and (~m).any()):
        raise ValueError("Need at least one member and one non-member.")
    return s, m


def _check_fprs(fprs: Any) -> tuple[float, ...]:
    out = tuple(float(f) for f in fprs)
    if not out or any(not (0.0 < f < 1.0) for f in out):
        raise ValueError(f"`fprs` must be in (0, 1), got {fprs}.")
    return out


@dataclass(frozen=True)
class RocSummary:
    """ROC AUC and TPR at fixed FPRs (largest TPR with FPR ≤ target; Carlini et al. 2022, Sec. 3)."""

    auc: float
    fprs: tuple[float, ...]
    tprs: tuple[float, ...]
    members: int
    non_members: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roc_summary(scores: Any, is_member: Any, fprs: Any = (0.01, 0.001)) -> RocSummary:
    """AUC and TPR at each FPR in ``fprs`` of membership scores (higher = member), exact (unbinned) ROC."""
    s, m = _scores_and_labels(scores, is_member)
    fprs = _check_fprs(fprs)
    # dense ranks in [0, 1]: torchmetrics would squash raw scores through a sigmoid (ties at ±large)
    ranks = torch.unique(s, return_inverse=True)[1].double()
    preds, target = ranks / max(1.0, float(ranks.max())), m.long()
    auc = float(binary_auroc(preds, target))
    fpr, tpr, _ = binary_roc(preds, target)
    n1, n0 = int(m.sum()), int((~m).sum())
    fp = (fpr.double() * n0).round()  # exact counts: the ROC comes back in float32
    tp = [round(float(tpr[fp <= math.floor(f * n0 + 1e-9)].max()) * n1) for f in fprs]
    return RocSummary(auc, fprs, tuple(k / n1 for k in tp), n1, n0)


@dataclass(frozen=True)
class TprCheck:
    """One FPR target: the threshold (score ≥ t ⇒ "member"), its counts, Clopper–Pearson bounds, and the DP test."""

    fpr_target: float
    threshold: float
    tpr: float
    fpr: float
    tpr_lower: float
    fpr_upper: float
    bound: float  # e^ε·FPR⁺ + δ
    passed: bool  # TPR⁻ ≤ e^ε·FPR⁺ + δ
    epsilon_lb: float  # log((TPR⁻ − δ)/FPR⁺), ≥ 0


@dataclass(frozen=True)
class DPCheck:
    """Does (ε, δ)-DP survive the attack at every FPR target? ``epsilon_lb``: the audited ε lower bound."""

    epsilon: float
    delta: float
    significance: float
    checks: tuple[TprCheck, ...]
    epsilon_lb: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def dp_tpr_check(scores: Any, is_member: Any, epsilon: float, delta: float, fprs: Any = (0.01, 0.001),
                 significance: float = 0.05) -> DPCheck:
    """Test TPR ≤ e^ε·FPR + δ (Kairouz et al. 2015, Thm 2.1) at each FPR target with Clopper–Pearson bounds.

    For a target f the threshold is the lowest score whose empirical FPR is ≤ f: the k-th largest non-member
    score, k = ⌊f·n₀⌋ fixed in advance, so its true FPR is Beta-distributed as in
    :func:`~lightning_dprel.audit.bounds.two_run_audit` and the interval on k stays valid; the member side is
    independent of it. All 2·len(fprs) intervals hold together at 1 − ``significance`` (Bonferroni). Ties at the
    threshold count for the attack in both TPR and FPR (the ROC convention).
    """
    s, m = _scores_and_labels(scores, is_member)
    fprs, delta = _check_fprs(fprs), _check_delta(delta)
    non_negative("epsilon (ε)", epsilon)
    check_probability("significance", significance)
    ins, outs = np.sort(s[m].numpy()), np.sort(s[~m].numpy())
    n1, n0 = ins.size, outs.size
    cand = np.concatenate([np.unique(s.numpy()), [np.inf]])
    fp_all = n0 - np.searchsorted(outs, cand, side="left")  # non-member scores ≥ t, non-increasing in t
    sig = significance / (2 * len(fprs))
    checks = []
    for f in fprs:
        t = float(cand[np.argmax(fp_all <= math.floor(f * n0 + 1e-9))])  # lowest threshold with FPR ≤ f
        tp, fp = n1 - int(np.searchsorted(ins, t, side="left")), n0 - int(np.searchsorted(outs, t, side="left"))
        lo, hi = float(clopper_pearson(tp, n1, sig, "lower")), float(clopper_pearson(fp, n0, sig, "upper"))
        bound = math.exp(epsilon) * hi + delta
        eps_lb = epsilon_lower_bound(lo, hi, delta)
        checks.append(TprCheck(f, t, tp / n1, fp / n0, lo, hi, bound, lo <= bound, eps_lb))
    return DPCheck(float(epsilon), delta, float(significance), tuple(checks), max(c.epsilon_lb for c in checks))
