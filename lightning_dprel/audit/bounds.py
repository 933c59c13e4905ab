"""Lower bounds on ε from membership guesses: one-run (Steinke, Nasr & Jagielski 2023) and two-run thresholds.

A mechanism that is (ε, δ)-DP caps how well *any* test can tell a canary's presence from its absence; an attack
that does better, with a stated confidence, proves a lower bound on ε. Both bounds here are *lower* bounds at
confidence ``confidence`` (the probability, over the training randomness and the coins, that the reported
value does not exceed the true ε); they never replace the accountant's upper bound.

- :func:`one_run_audit`: one training run, m canaries each included by a secret fair coin; guess "in" for the
  highest scores and "out" for the lowest, abstain on the rest; the number of correct guesses is dominated by
  a binomial (Theorem 3.1; Proposition 5.2 / Algorithm 3 with δ > 0). The guess counts tried are corrected
  for by Bonferroni.
- :func:`two_run_audit`: in-scores (canaries trained on) against out-scores (canaries left out), thresholds
  with Clopper–Pearson intervals, ε ≥ log((TPR − δ)/FPR) and log((TNR − δ)/FNR) (Jagielski et al. 2020;
  Nasr et al. 2021), simultaneously over every threshold. Its intervals need the scores to be independent
  (true for disjoint gradient canaries without negatives; an assumption for canaries in one model).

References:
    Steinke, Nasr, Jagielski. Privacy Auditing with One (1) Training Run. NeurIPS 2023, arXiv 2305.08846.
    Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning. NeurIPS 2020.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats
from lightning_dprel.core.checks import check_choice, check_probability, non_negative

__all__ = [
    "OneRunBound",
    "TwoRunBound",
    "clopper_pearson",
    "one_run_audit",
    "one_run_epsilon",
    "one_run_p_value",
    "two_run_audit",
]

_EPS_MAX = 60.0  # search ceiling: e^60 ≈ 1e26 (no finite sample can certify more)


def _check_confidence(confidence: float) -> float:
    return check_probability("confidence", confidence)


def _check_delta(delta: float) -> float:
    return check_probability("delta", delta, zero=True)


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[≥ v of r guesses correct] for an (ε, δ)-DP mechanism, m canaries (Steinke et al. 2023, Prop. 5.2).

    With q = e^ε/(1+e^ε), β = P[Bin(r, q) ≥ v] and α = max_{1≤i≤v} (P[Bin(r, q) ≥ v − i] − β)/i, the
    p-value is min(1, β + 2mδ·α); δ = 0 gives Theorem 3.1's β.
    """
    if not (0 <= v <= r <= m):
        raise ValueError(f"Need 0 <= v <= r <= m, got m={m}, r={r}, v={v}.")
    non_negative("eps", eps)
    q = 1.0 / (1.0 + math.exp(-eps))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    alpha = float(np.max((stats.binom.sf(v - i - 1, r, q) - beta) / i))
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def one_run_epsilon(m: int, r: int, v: int, *, delta: float, significance: float) -> float:
    """The largest ε whose (ε, δ)-DP claim ``v`` correct of ``r`` guesses rejects at ``significance`` (0 if none).

    Bisection to 1e-6 between a rejected ε (below) and an accepted one (above). Sound whether or not the p-value is
    monotone: an (ε, δ)-DP mechanism is (ε', δ)-DP for every ε' ≥ ε, so rejecting ε rejects every smaller ε.
    """
    if one_run_p_value(m, r, v, 0.0, delta) > significance:
        return 0.0
    lo, hi = 0.0, _EPS_MAX
    if one_run_p_value(m, r, v, hi, delta) <= significance:
        return hi
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) <= significance else (lo, mid)
    return lo


@dataclass(frozen=True)
class OneRunBound:
    """ε ≥ ``epsilon`` with probability ≥ ``confidence`` (one run, ``guesses`` made, ``correct`` right)."""

    epsilon: float
    confidence: float
    delta: float
    canaries: int
    included: int
    guesses: int
    correct: int
    guess_counts: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scores_and_coins(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    c = np.asarray(included).reshape(-1)
    if c.dtype != np.bool_:
        if not np.isin(c, (0, 1)).all():
            raise ValueError("`included` must be booleans (or 0/1): the secret coin of each canary.")
        c = c.astype(bool)
    if s.shape != c.shape:
        raise ValueError(f"`scores` ({s.size}) and `included` ({c.size}) must have one entry per canary.")
    if s.size < 2:
        raise ValueError(f"An audit needs at least 2 canaries, got {s.size}.")
    if not np.isfinite(s).all():
        raise ValueError("`scores` has non-finite entries; score every canary with a finite number.")
    return s, c


def default_guess_counts(m: int) -> tuple[int, ...]:
    """Guess counts r tried by default: powers of two (and m), half "in" from the top, half "out" from the bottom."""
    counts = {min(2 ** j, m) for j in range(1, max(2, math.ceil(math.log2(m)) + 1))}
    return tuple(sorted(c for c in counts if c >= 2))


def one_run_audit(
    scores: Any, included: Any, *, delta: float, confidence: float = 0.95, guess_counts: tuple[int, ...] | None = None,
    sides: str = "both",
) -> OneRunBound:
    """ε lower bound from one run: top r/2 scores guessed in, bottom r/2 out, best r with Bonferroni (Steinke et al.).

    Args:
        scores: ``[m]`` membership scores, higher = more likely included (ties broken against the auditor).
        included: ``[m]`` the secret coins (True = the canary was in the training data).
        delta: δ of the claims tested (the accountant's δ).
        confidence: 1 − significance of the whole bound (split evenly over ``guess_counts``).
        guess_counts: the r tried (default: 2, 4, 8, …, m).
        sides: ``"both"`` (r/2 "in" from the top, r/2 "out" from the bottom) or ``"top"`` (all r guessed "in" from the
            top: for scores that only ever reveal inclusion, e.g. a row that moved).
    """
    check_choice("sides", sides, ("both", "top"))
    confidence, delta = _check_confidence(confidence), _check_delta(delta)
    s, coins = _scores_and_coins(scores, included)
    m = s.size
    counts = tuple(guess_counts) if guess_counts is not None else default_guess_counts(m)
    if not counts or any(isinstance(r, bool) or int(r) != r or not (1 <= r <= m) for r in counts):
        raise ValueError(f"`guess_counts` must be ints in [1, {m}], got {counts}.")
    order = np.lexsort(((~coins).astype(np.int8), s))  # ascending; ties: in-canaries first, so ties count against the guesses
    significance = (1.0 - confidence) / len(counts)
    best = (0.0, 0, 0)
    for r in counts:
        top, bottom = (r - r // 2, r // 2) if sides == "both" else (r, 0)
        correct = int(coins[order[m - top:]].sum()) + int((~coins[order[:bottom]]).sum())
        eps = one_run_epsilon(m, r, correct, delta=delta, significance=significance)
        if eps > best[0] or best[1] == 0:
            best = (eps, r, correct)
    return OneRunBound(
        epsilon=best[0], confidence=confidence, delta=delta, canaries=m, included=int(coins.sum()),
        guesses=best[1], correct=best[2], guess_counts=counts,
    )


def epsilon_lower_bound(tpr_lower: float, fpr_upper: float, delta: float) -> float:
    """ε ≥ log((TPR⁻ − δ)/FPR⁺) from (ε, δ)-DP's TPR ≤ e^ε·FPR + δ (Jagielski et al. 2020); 0 when it says nothing."""
    if tpr_lower <= delta:
        return 0.0
    return max(0.0, math.log((tpr_lower - delta) / fpr_upper))


def clopper_pearson(successes: Any, trials: int, significance: float, side: str) -> np.ndarray:
    """One-sided Clopper–Pearson bound on a binomial proportion (``side`` "upper" or "lower")."""
    k = np.asarray(successes, dtype=np.float64)
    if side == "upper":
        return np.where(k < trials, stats.beta.ppf(1.0 - significance, k + 1, trials - k), 1.0)
    if side == "lower":
        return np.where(k > 0, stats.beta.ppf(significance, k, trials - k + 1), 0.0)
    raise ValueError(f"`side` must be 'upper' or 'lower', got {side!r}.")


@dataclass(frozen=True)
class TwoRunBound:
    """ε ≥ ``epsilon`` with probability ≥ ``confidence`` from in/out scores, at score ``threshold``."""

    epsilon: float
    confidence: float
    delta: float
    in_canaries: int
    out_canaries: int
    threshold: float
    tpr: float
    fpr: float
    thresholds_tried: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def two_run_audit(in_scores: Any, out_scores: Any, *, delta: float, confidence: float = 0.95) -> TwoRunBound:
    """ε lower bound from canaries trained on vs left out: best threshold, Clopper–Pearson, Bonferroni over all.

    For a threshold t, "in" is guessed when score ≥ t; with TPR/FPR bounded by one-sided Clopper–Pearson
    intervals, (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ and TNR ≤ e^ε·FNR + δ, so ε ≥ log((TPR⁻ − δ)/FPR⁺) and
    log((TNR⁻ − δ)/FNR⁺). The k-th largest in-score's true exceedance probability is Beta(k, n₁−k+1)-distributed, so
    one union over the n₁ + n₀ + 2 count values of each one-sided family covers every threshold at once (data-free):
    every interval is taken at significance (1 − confidence)/(2·(n₁ + n₀ + 2)).
    """
    confidence, delta = _check_confidence(confidence), _check_delta(delta)
    ins = np.sort(np.asarray(in_scores, dtype=np.float64).reshape(-1))
    outs = np.sort(np.asarray(out_scores, dtype=np.float64).reshape(-1))
    if ins.size < 1 or outs.size < 1:
        raise ValueError(f"Need at least one in-score and one out-score, got {ins.size} and {outs.size}.")
    if not (np.isfinite(ins).all() and np.isfinite(outs).all()):
        raise ValueError("Scores must be finite.")
    thresholds = np.concatenate([np.union1d(ins, outs), [np.inf]])
    tp = ins.size - np.searchsorted(ins, thresholds, side="left")  # in-scores >= t
    fp = outs.size - np.searchsorted(outs, thresholds, side="left")
    n1, n0 = ins.size, outs.size
    sig = (1.0 - confidence) / (2.0 * (n1 + n0 + 2))
    tpr_lo, fpr_hi = clopper_pearson(tp, n1, sig, "lower"), clopper_pearson(fp, n0, sig, "upper")
    tnr_lo, fnr_hi = clopper_pearson(n0 - fp, n0, sig, "lower"), clopper_pearson(n1 - tp, n1, sig, "upper")
    with np.errstate(divide="ignore", invalid="ignore"):
        forward = np.where(tpr_lo > delta, np.log(np.maximum(tpr_lo - delta, 1e-300)) - np.log(fpr_hi), 0.0)
        backward = np.where(tnr_lo > delta, np.log(np.maximum(tnr_lo - delta, 1e-300)) - np.log(fnr_hi), 0.0)
    eps = np.maximum(np.maximum(forward, backward), 0.0)
    best = int(np.argmax(eps))
    return TwoRunBound(
        epsilon=float(eps[best]), confidence=confidence, delta=delta, in_canaries=n1, out_canaries=n0,
        threshold=float(thresholds[best]), tpr=float(tp[best] / n1), fpr=float(fp[best] / n0),
        thresholds_tried=int(thresholds.size),
    )
