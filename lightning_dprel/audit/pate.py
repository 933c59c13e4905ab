"""White-box audit of Confident-GNMax (Papernot et al. 2018, Alg. 1): worst-case neighbouring vote histograms.

Neighbouring relation audited (the provable DP-GPL variant, docs in the spec): one labelled private node reaches one
teacher, so adding or removing it changes **one teacher's vote**: D' = D − e_a + e_b (the max count moves by ≤ 1, the
histogram by √2 in ℓ₂). The adversary picks the histograms; the released outcome of one query is ⊥ (unanswered) or a
label. Each world runs ``trials`` independent queries through the library's own :func:`confident_gnmax`; the best
(pair, event, direction) is chosen on one half of the trials and measured on the other, so the Clopper–Pearson bound
ε ≥ log((P⁻_D(E) − δ)/P⁺_D'(E)) (Jagielski et al. 2020) holds at ``confidence``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import torch

from lightning_dprel.audit.bounds import _check_confidence, _check_delta, clopper_pearson, epsilon_lower_bound
from lightning_dprel.core.checks import check_int
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.methods.dp_gpl.aggregation import confident_gnmax, pate_releases

__all__ = ["PateAudit", "audit_confident_gnmax", "neighbouring_histograms"]

_OUTCOMES = ("not answered", "label a", "label b", "other label")
# every event that is a non-empty proper union of the four outcome groups (14)
_EVENTS = tuple(s for r in (1, 2, 3) for s in combinations(range(4), r))


def _fill(c: list[int], rest: int, cap: int) -> list[int] | None:
    """Spread ``rest`` votes over classes 2.. as evenly as possible, none above ``cap``; None if impossible."""
    others = len(c) - 2
    if rest < 0 or (rest > 0 and (others == 0 or -(-rest // others) > cap)):
        return None
    for i in range(rest):
        c[2 + i % others] += 1
    return c


def neighbouring_histograms(num_teachers: int, num_classes: int, threshold: float) -> list[tuple[str, list[int]]]:
    """Candidate worlds D; D' moves one vote from class a = 0 to class b = 1. (a) Max ⌈T⌉ → ⌈T⌉ − 1 with gaps
    c_a − c_b = g ≥ 2 from the smallest feasible one, so the flip moves both the threshold test and the a/b race;
    (b) a near tie c_a = c_b + 1 (the winner flips, the max does not move)."""
    top, n, out = math.ceil(threshold), num_teachers, []
    g_min = max(2, 2 * top - n)
    for g in sorted({g_min + d for d in (0, 1, 2, 4, 6, 10, 14, 22, 30, 46, 62)}):
        cb, pad = top - g, [0] * (num_classes - 2)
        c = _fill([top, cb, *pad], n - top - cb, top - 2) if cb >= 0 else None
        if c is not None:
            out.append((f"threshold, gap {g}", c))
    cb = (n - 1) // 2
    c = _fill([cb + 1, cb] + [0] * (num_classes - 2), n - 2 * cb - 1, cb)
    if c is not None and cb >= 0:
        out.append(("near tie", c))
    return out


@dataclass(frozen=True)
class PateAudit:
    """ε ≥ ``epsilon`` at ``confidence`` for one Confident-GNMax query; ``proven_epsilon`` is the ledger's bound."""

    epsilon: float
    proven_epsilon: float
    confidence: float
    delta: float
    trials: int
    pair: str
    counts: tuple[int, ...]  # D; D' moves one vote from class 0 to class 1
    event: str
    direction: str
    p: float  # empirical P_first(E) on the measured half
    q: float  # empirical P_second(E)
    candidates: int

    @property
    def violation(self) -> bool:
        return self.epsilon > self.proven_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violation": self.violation}


def _outcome_counts(counts: list[int], trials: int, stream: KeyedStream, **kw: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome-group counts [2 halves, 4] of ``trials`` independent queries on histogram ``counts`` (one call)."""
    ans = confident_gnmax(torch.tensor(counts, dtype=torch.float64).expand(trials, -1), stream=stream, **kw)
    lab = ans.labels
    group = torch.where(~ans.answered, 0, torch.where(lab == 0, 1, torch.where(lab == 1, 2, 3)))
    half = trials // 2
    return torch.bincount(group[:half], minlength=4), torch.bincount(group[half:2 * half], minlength=4)


def _best(k1: torch.Tensor, k0: torch.Tensor, n: int, sig: float, delta: float) -> tuple[float, int, int]:
    """Best (ε bound, event, direction) over every event and both directions; k1/k0: [4] outcome counts of D, D'."""
    masks = torch.zeros(len(_EVENTS), 4, dtype=torch.float64)
    for i, e in enumerate(_EVENTS):
        masks[i, list(e)] = 1.0
    e1, e0 = (masks @ k1.double()).numpy(), (masks @ k0.double()).numpy()
    best = (0.0, 0, 0)
    for d, (x, y) in enumerate(((e1, e0), (e0, e1))):
        lo, hi = clopper_pearson(x, n, sig, "lower"), clopper_pearson(y, n, sig, "upper")
        for i in range(len(_EVENTS)):
            eps = epsilon_lower_bound(float(lo[i]), float(hi[i]), delta)
            if eps > best[0]:
                best = (eps, i, d)
    return best


def _proven_epsilon(sigma_threshold: float, sigma_vote: float, delta: float) -> float:
    ledger = PrivacyLedger()
    for release in pate_releases(sigma_threshold=sigma_threshold, sigma_vote=sigma_vote, queries=1):
        ledger.charge(release)
    return ledger.epsilon(delta)


def audit_confident_gnmax(num_teachers: int, num_classes: int, threshold: float, sigma_threshold: float,
                          sigma_vote: float, *, trials: int, seed: int, delta: float,
                          confidence: float = 0.95) -> PateAudit:
    """Audited ε lower bound of one Confident-GNMax query on worst-case neighbours, next to the proven ε.

    Neighbours: one labelled private node reaches one teacher, so one vote changes (D' = D − e_a + e_b). For each
    candidate D of :func:`neighbouring_histograms` and its D', ``trials`` queries run in each world (one call each). On the first half, every event (a union of ⊥ / label a / label b /
    other label) in both directions is scored by its Clopper–Pearson ε; the best is then measured on the second half,
    with both one-sided intervals at (1 − confidence)/2. Noise is seeded (``KeyedStream.seeded``, warns): an audit.
    """
    confidence, delta = _check_confidence(confidence), _check_delta(delta)
    check_int("trials", trials, 4)
    check_int("num_classes", num_classes, 2)
    check_int("num_teachers", num_teachers, 1)
    kw = dict(threshold=float(threshold), sigma_threshold=float(sigma_threshold), sigma_vote=float(sigma_vote))
    pairs = neighbouring_histograms(num_teachers, num_classes, threshold)
    if not pairs:
        raise ValueError(f"No neighbouring histograms for N = {num_teachers}, C = {num_classes}, T = {threshold}.")
    root, n, sig = KeyedStream.seeded(seed, "audit/confident-gnmax"), trials // 2, (1.0 - confidence) / 2.0
    chosen = None
    for j, (name, c) in enumerate(pairs):
        c_prime = [c[0] - 1, c[1] + 1] + c[2:]
        (s1, m1), (s0, m0) = (_outcome_counts(x, trials, root.child(j, w), **kw) for w, x in enumerate((c, c_prime)))
        score, event, direction = _best(s1, s0, n, sig, delta)  # selection half only
        if chosen is None or score > chosen[0]:
            chosen = (score, j, event, direction, m1, m0)
    _, j, event, direction, m1, m0 = chosen
    mask = list(_EVENTS[event])
    x, y = (int(m1[mask].sum()), int(m0[mask].sum()))
    if direction:
        x, y = y, x
    lo, hi = float(clopper_pearson(x, n, sig, "lower")), float(clopper_pearson(y, n, sig, "upper"))
    eps = epsilon_lower_bound(lo, hi, delta)
    names = [_OUTCOMES[i] for i in mask]
    return PateAudit(
        epsilon=eps, proven_epsilon=_proven_epsilon(sigma_threshold, sigma_vote, delta), confidence=confidence,
        delta=delta, trials=trials, pair=pairs[j][0], counts=tuple(pairs[j][1]),
        event=" or ".join(names), direction=("D' vs D" if direction else "D vs D'"), p=x / n, q=y / n,
        candidates=len(pairs),
    )
