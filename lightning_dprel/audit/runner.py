"""One audit of one mechanism: proven ε (accountant) next to audited lower bounds (one run and two runs).

Three training runs per setting: one with every canary's secret coin (one-run bound), one with all canaries in
and one with all out (two-run bound; only without negatives, k = 0: negatives are drawn from every node, so with
k > 0 the other canaries change each canary's frequencies and the two worlds differ by a group, not one entity).
Each bound is taken at confidence 1 − (1 − c)/2, so their maximum holds at confidence c (per setting). A lower
bound above the proven ε is a **violation**: a bug in the accountant or the mechanism, never a number to hide.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lightning_dprel.accounting.calibration import epsilon_for
from lightning_dprel.audit.bounds import (
    OneRunBound,
    TwoRunBound,
    one_run_audit,
    two_run_audit,
)
from lightning_dprel.audit.canaries import CanaryGraph, secret_coins
from lightning_dprel.audit.whitebox import WhiteBoxSetting, canary_scores, sampling_spec
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["PROVEN_MECHANISM", "AuditRecord", "audit_setting", "proven_epsilons"]

#: The accounting the library stands behind, per clipping mode (FREQ-CLIP: corrected profile; standard: Thm C.1).
PROVEN_MECHANISM = {"freq": "freq_corrected", "standard": "standard"}


@dataclass
class AuditRecord:
    """What an audit of one setting found (all ε at the same δ)."""

    setting: dict[str, Any]
    design: str
    canaries: int
    degree: int
    delta: float
    epsilon_proven: float
    proven_by: str
    epsilon_paper_eq3: float | None
    epsilon_claimed: float
    one_run: OneRunBound
    two_run: TwoRunBound | None
    no_noise: bool
    confidence: float

    @property
    def epsilon_lower(self) -> float:
        """The larger of the two audited lower bounds; holds with probability ≥ ``confidence`` (Bonferroni over both)."""
        return max(self.one_run.epsilon, 0.0 if self.two_run is None else self.two_run.epsilon)

    @property
    def violation(self) -> bool:
        """An audited lower bound above the proven ε: the guarantee is broken somewhere."""
        return self.epsilon_lower > self.epsilon_proven

    @property
    def claim_refuted(self) -> bool:
        """An audited lower bound above the ε this setting's own accounting claims (e.g. Eq. 3 for ``accounting="paper"``)."""
        return self.epsilon_lower > self.epsilon_claimed

    @property
    def exceeds_paper(self) -> bool | None:
        """An audited lower bound above the paper's Eq. 3 ε for the same σ (FREQ-CLIP only)."""
        if self.epsilon_paper_eq3 is None:
            return None
        return self.epsilon_lower > self.epsilon_paper_eq3

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            one_run=self.one_run.to_dict(), two_run=None if self.two_run is None else self.two_run.to_dict(),
            epsilon_lower=self.epsilon_lower,
            violation=self.violation, exceeds_paper=self.exceeds_paper, claim_refuted=self.claim_refuted,
        )
        return out


def proven_epsilons(graph: CanaryGraph, setting: WhiteBoxSetting, delta: float) -> tuple[float, str, float | None]:
    """(proven ε, its mechanism, the paper's Eq. 3 ε or None) after the setting's steps, from the accountant."""
    if setting.clipping == "none" or setting.noise_multiplier == 0.0:
        return math.inf, "none (no noise)", None
    spec = sampling_spec(graph, setting)
    mech = PROVEN_MECHANISM[setting.clipping]
    eps = epsilon_for(delta=delta, steps=setting.steps, sampling=spec, noise_multiplier=setting.noise_multiplier, mechanism=mech)[0]
    paper = None
    if setting.clipping == "freq":
        paper = epsilon_for(
            delta=delta, steps=setting.steps, sampling=spec, noise_multiplier=setting.noise_multiplier, mechanism="freq_paper"
        )[0]
    return float(eps), mech, None if paper is None else float(paper)


def audit_setting(
    graph: CanaryGraph, setting: WhiteBoxSetting, *, delta: float, confidence: float = 0.95, seed: int | None = None,
) -> AuditRecord:
    """Audit one setting on ``graph``: three runs (coins, all in, all out), both bounds, the proven ε.

    ``seed``: reproducible coins, batches and noise (tests; warns); None draws them all from the OS.
    """
    def stream(tag: str) -> KeyedStream:
        return KeyedStream.seeded(seed, f"audit/{tag}", warn=False) if seed is not None else KeyedStream.secret(f"audit/{tag}")

    if seed is not None:
        KeyedStream.seeded(seed, "audit")  # one warning for the whole audit
    eps, mech, paper = proven_epsilons(graph, setting, delta)
    m = graph.num_canaries

    def run(included: torch.Tensor, tag: str) -> torch.Tensor:
        return canary_scores(graph, included, setting, noise=stream(f"{tag}/noise"), sampling=stream(f"{tag}/sampling"))

    each = 1.0 - (1.0 - confidence) / 2.0  # Bonferroni over the two bounds
    coins = secret_coins(m, stream=stream("coins"))
    one = one_run_audit(run(coins, "one-run"), coins, delta=delta, confidence=each)
    two = None
    if setting.neg_per_pos == 0:
        ins = run(torch.ones(m, dtype=torch.bool), "all-in")
        outs = run(torch.zeros(m, dtype=torch.bool), "all-out")
        two = two_run_audit(ins, outs, delta=delta, confidence=each)
    return AuditRecord(
        setting=asdict(setting), design=graph.design, canaries=m, degree=graph.degree, delta=float(delta),
        epsilon_proven=eps, proven_by=mech, epsilon_paper_eq3=paper,
        epsilon_claimed=paper if (setting.accounting == "paper" and paper is not None) else eps, one_run=one, two_run=two,
        no_noise=setting.clipping == "none" or setting.noise_multiplier == 0.0, confidence=float(confidence),
    )
