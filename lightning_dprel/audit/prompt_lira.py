"""Online LiRA on graph prompts (DP-GPL Sec. 3, Alg. 1; Carlini et al. 2022): does a k-shot prompt leak its shots?

Threat model (the paper's): the frozen encoder Φ and the pool of candidate nodes are known; the attacker queries a
tuned prompt (P, answer head) on a node v and asks whether v was one of the ``shots`` nodes it was tuned on. The
statistic is φ = log p_y − log(1 − p_y) of the prompt's confidence in v's true label (logit scaling, Sec. 4.2).

Design (:func:`prompt_lira`):

* **Candidates.** ``num_candidates`` pool nodes are drawn at random and split at random into G groups of ``2·shots``
  nodes (G = num_candidates / (2·shots), rounded up).
* **Shadows match the target's training distribution.** A shadow is a set of G independent prompts, one per group; its
  prompt for group g is tuned on ``shots`` of that group's 2·shots nodes (half of them). So every shadow prompt is, like
  the target, a ``shots``-shot prompt on random pool nodes, and a candidate v is IN for a shadow iff v is among the
  shots of that shadow's prompt for v's group. Shadows come in complementary pairs (shadow 2p takes one half of
  every group, shadow 2p + 1 the other), so **every candidate is IN for exactly half of the shadows and OUT for the
  rest** (``num_shadows`` must be even). φ of v under shadow k is the confidence of shadow k's prompt for v's group.
  Shadow sets tuned on half of *all* candidates (Carlini's models on half the data) would be prompts tuned on
  hundreds of nodes, whose IN/OUT confidences do not model a few-shot prompt: the per-group design keeps the
  half-inclusion structure at the target's training size.
* **Targets.** Target prompt r (``num_targets`` repetitions, the paper's 100) is tuned on ``shots`` random candidates
  (its members); its non-members are ``non_members_per_shot·shots`` random other candidates (the paper's 50·k
  random nodes it was not tuned on). The shadows do not depend on any target, so all targets share them.
* **One batch.** The K·G shadow prompts and the R target prompts are ``num_prompts`` stacked copies of one
  :class:`~lightning_dprel.methods.dp_gpl.tuning.PromptedModel` (owner = prompt index), tuned together by
  :func:`~lightning_dprel.methods.dp_gpl.tuning.tune_prompts`: each owner's loss is the mean over its own examples
  and Adam is element-wise, so each prompt trains exactly as if alone. A node tuned into several prompts appears once
  per prompt: the union is a concatenation of :meth:`EgoBatch.select` calls (one per shadow, whose groups are
  disjoint, and one per target), never a select with repeated indices.
* **Scores.** Online LiRA, :func:`~lightning_dprel.audit.lira.lira_scores`: per (target, candidate) pair, the
  Gaussian likelihood ratio of the target prompt's φ under the candidate's IN and OUT shadow φs (per-candidate
  variances, or pooled with ``fixed_variance``); :func:`~lightning_dprel.audit.lira.roc_summary` gives AUC and TPR at
  low FPR over all pairs (members = the targets' shots).

Caveats: scores of one candidate across targets share its shadow fit, and all targets draw from the same candidates,
so the pooled pairs are not independent (as in Carlini et al.'s leave-one-out evaluation); AUC and TPR are point
estimates. Every prompt (targets and shadows) starts from its own random initialisation (``seed``).

References:
    Carlini, Chien, Nasr, Song, Terzis, Tramèr. Membership Inference Attacks From First Principles. IEEE S&P 2022.
    DP-GPL (the spec's paper), Section 3, Algorithm 1: LiRA with prompts instead of models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprel.audit.canaries import check_int
from lightning_dprel.audit.lira import RocSummary, lira_scores, logit_confidence_from_logits, roc_summary
from lightning_dprel.methods.dp_gpl.egonets import EgoBatch
from lightning_dprel.methods.dp_gpl.tuning import PromptedModel, TuningConfig, tune_prompts

__all__ = ["PromptLiraResult", "concat_ego_batches", "prompt_lira"]


def concat_ego_batches(batches: list[EgoBatch]) -> EgoBatch:
    """The disjoint union of several :class:`EgoBatch` es, in order (an example may recur across them)."""
    if not batches:
        raise ValueError("Need at least one EgoBatch.")
    rows, edges, centers, examples, nodes, count = [], [], [], [], 0, 0
    for b in batches:
        rows.append(b.rows)
        edges.append(b.edge_index + nodes)
        centers.append(b.center + nodes)
        examples.append(b.example + count)
        nodes += int(b.rows.numel())
        count += b.size
    return EgoBatch(torch.cat(rows), torch.cat(edges, dim=1), torch.cat(centers), torch.cat(examples))


@dataclass(frozen=True)
class PromptLiraResult:
    """An online LiRA on prompts: the ROC summary, every (target, candidate) score and the design's sizes."""

    summary: RocSummary
    scores: Tensor  # [P] LiRA scores of every (target, candidate) pair
    is_member: Tensor  # [P] bool: the candidate is one of the target prompt's shots
    target: Tensor  # [P] the target (repetition) of each pair
    candidate: Tensor  # [P] the pool index of each pair's node
    target_phi: Tensor  # [P] φ of the node under the target prompt
    in_phi: Tensor  # [P, K/2] φ of the node under its IN shadows
    out_phi: Tensor  # [P, K/2] ... and under its OUT shadows
    shots: int
    num_shadows: int
    num_targets: int
    num_candidates: int
    in_per_candidate: int  # IN shadows of every candidate (= num_shadows / 2)
    member_accuracy: float  # target prompts' accuracy on their own shots
    non_member_accuracy: float  # ... and on their non-members (the prompts' utility)

    @property
    def auc(self) -> float:
        return self.summary.auc

    @property
    def tprs(self) -> tuple[float, ...]:
        return self.summary.tprs

    def rescore(self, *, fixed_variance: bool, fprs: Any = None) -> RocSummary:
        """The ROC of the same φs scored again (e.g. with the other variance model), no prompt re-tuned."""
        scores = lira_scores(self.target_phi, self.in_phi, self.out_phi, fixed_variance=fixed_variance)
        return roc_summary(scores, self.is_member, self.summary.fprs if fprs is None else fprs)

    def to_dict(self) -> dict[str, Any]:
        return {"auc": self.auc, "fprs": list(self.summary.fprs), "tprs": list(self.tprs),
                "members": self.summary.members, "non_members": self.summary.non_members, "shots": self.shots,
                "num_shadows": self.num_shadows, "num_targets": self.num_targets, "num_candidates": self.num_candidates,
                "in_per_candidate": self.in_per_candidate, "member_accuracy": self.member_accuracy,
                "non_member_accuracy": self.non_member_accuracy}


def prompt_lira(encoder: nn.Module, x: Tensor, pool: EgoBatch, labels: Tensor, *, shots: int = 5,
                num_shadows: int = 64, num_targets: int = 20, non_members_per_shot: int = 50,
                num_candidates: int | None = None, cfg: TuningConfig = TuningConfig(), num_classes: int | None = None,
                fixed_variance: bool = False, fprs: Any = (0.01, 0.001), seed: int = 0) -> PromptLiraResult:
    """Online LiRA against ``shots``-shot prompts on a frozen ``encoder`` (design: the module docstring).

    Args:
        encoder: Φ, frozen, with ``in_dim`` / ``out_dim`` (e.g. :class:`~lightning_dprel.methods.dp_gpl.GraphEncoder`).
        x: node features [n, in_dim] that ``pool.rows`` index.
        pool: every node the attack may use (targets' shots, non-members and shadow data), one example each.
        labels: [pool.size] true classes.
        shots: k, nodes a target (and every shadow) prompt is tuned on.
        num_shadows: K shadows (even, ≥ 4): every candidate is IN for exactly K/2.
        num_targets: R target prompts (repetitions), each with ``shots`` members.
        non_members_per_shot: non-members per member of a target (the paper's 50).
        num_candidates: pool nodes the attack uses (rounded up to a multiple of 2·shots); default the fewest that
            hold one target's members and non-members, ⌈(1 + non_members_per_shot)/2⌉·2·shots.
        cfg: how every prompt is tuned.
        num_classes: C (default ``labels.max() + 1``).
        fixed_variance: pool the IN and OUT variances over candidates (Carlini et al. with few shadows).
        fprs: FPRs at which the TPR is reported.
        seed: candidates, groups, shadow halves, targets' shots and non-members, and every prompt's initialisation.
    """
    shots = check_int("shots", shots, 1)
    num_shadows = check_int("num_shadows", num_shadows, 4)
    if num_shadows % 2:
        raise ValueError(f"`num_shadows` must be even (complementary pairs), got {num_shadows}.")
    num_targets = check_int("num_targets", num_targets, 1)
    non_members_per_shot = check_int("non_members_per_shot", non_members_per_shot, 1)
    if not isinstance(pool, EgoBatch):
        raise TypeError(f"`pool` must be an EgoBatch, got {type(pool).__name__}.")
    if not (hasattr(encoder, "in_dim") and hasattr(encoder, "out_dim")):
        raise TypeError("`encoder` needs `in_dim` and `out_dim` (a GraphEncoder).")
    if x.dim() != 2 or x.shape[1] != encoder.in_dim:
        raise ValueError(f"`x` must be [n, {encoder.in_dim}], got {tuple(x.shape)}.")
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or labels.numel() != pool.size or labels.dtype.is_floating_point:
        raise ValueError(f"`labels` must be integer class ids, one per pool example ({pool.size}), "
                         f"got {tuple(labels.shape)} {labels.dtype}.")
    labels = labels.long()
    c = int(labels.max()) + 1 if num_classes is None else check_int("num_classes", num_classes, 2)
    if c < 2 or int(labels.min()) < 0 or int(labels.max()) >= c:
        raise ValueError(f"`labels` must lie in [0, {c}) with at least 2 classes.")
    block = 2 * shots
    need = (1 + non_members_per_shot) * shots
    m = need if num_candidates is None else check_int("num_candidates", num_candidates, need)
    m = -(-m // block) * block
    if m > pool.size:
        raise ValueError(f"The attack needs {m} candidate nodes (≥ {need}: {shots} members and "
                         f"{non_members_per_shot * shots} non-members per target, in groups of {block}); "
                         f"the pool has {pool.size}.")

    gen = torch.Generator().manual_seed(int(seed))
    cand = torch.randperm(pool.size, generator=gen)[:m]  # pool index of candidate i; group of i = i // block
    groups, k_pairs = m // block, num_shadows // 2
    group = torch.arange(m) // block
    # IN[k, i]: candidate i is one of shadow k's shots; complementary pairs: each candidate IN for exactly K/2
    inside = torch.zeros(num_shadows, m, dtype=torch.bool)
    for p in range(k_pairs):
        half = torch.rand(groups, block, generator=gen).argsort(dim=1) < shots  # per group, a random half
        inside[2 * p] = half.view(-1)
        inside[2 * p + 1] = ~half.view(-1)
    target_idx = torch.stack([torch.randperm(m, generator=gen)[:need] for _ in range(num_targets)])  # [R, need]
    members, non_members = target_idx[:, :shots], target_idx[:, shots:]

    cand_batch, cand_labels = pool.select(cand), labels[cand]
    parts, owners, ys = [], [], []
    for k in range(num_shadows):  # one select per shadow: its groups are disjoint, so no index repeats
        idx = inside[k].nonzero().view(-1)
        parts.append(cand_batch.select(idx))
        owners.append(k * groups + group[idx])
        ys.append(cand_labels[idx])
    base = num_shadows * groups
    for r in range(num_targets):
        parts.append(cand_batch.select(members[r]))
        owners.append(torch.full((shots,), base + r, dtype=torch.long))
        ys.append(cand_labels[members[r]])
    with torch.random.fork_rng():  # every prompt's own random initialisation, reproducible by `seed`
        torch.manual_seed(int(seed))
        model = PromptedModel(encoder, c, cfg, num_prompts=base + num_targets)
    tune_prompts(model, x, concat_ego_batches(parts), torch.cat(ys), torch.cat(owners))

    with torch.no_grad():
        shadow_phi = torch.stack([logit_confidence_from_logits(model(x, cand_batch, k * groups + group), cand_labels)
                                  for k in range(num_shadows)])  # [K, m]
        target_logits = torch.stack([model(x, cand_batch, base + r) for r in range(num_targets)])  # [R, m, C]
    target_phi_all = logit_confidence_from_logits(target_logits, cand_labels.expand(num_targets, -1))  # [R, m]
    correct = target_logits.argmax(-1) == cand_labels

    t_of = torch.arange(num_targets).repeat_interleave(need)
    c_of = target_idx.reshape(-1)
    is_member = torch.zeros(num_targets, need, dtype=torch.bool)
    is_member[:, :shots] = True
    is_member = is_member.reshape(-1)
    phi_t = target_phi_all[t_of, c_of]
    ins = shadow_phi.t()[inside.t()].view(m, k_pairs)  # [m, K/2]: exactly K/2 IN per candidate
    outs = shadow_phi.t()[~inside.t()].view(m, k_pairs)
    scores = lira_scores(phi_t, ins[c_of], outs[c_of], fixed_variance=fixed_variance)
    summary = roc_summary(scores, is_member, fprs)
    member_acc = float(correct.gather(1, members).float().mean())
    non_member_acc = float(correct.gather(1, non_members).float().mean())
    return PromptLiraResult(summary, scores, is_member, t_of, cand[c_of], phi_t, ins[c_of], outs[c_of], shots,
                            num_shadows, num_targets, m, k_pairs, member_acc, non_member_acc)
