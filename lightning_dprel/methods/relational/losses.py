"""Scores and per-tuple losses for relational learning (Section 3 of Huang et al.).

A tuple T_i = (e⁺, e⁻_1, …, e⁻_k) has node embeddings h of shape ``[2 + k, d]`` in the column order of
:class:`~lightning_dprel.datamodules.edge_tuples.batch.TupleBatch` (u, v, z_1, …, z_k); negative edge j is (w_j, z_j) with
w_j = u if ``neg_anchor[j] == 0`` else v. Every function here broadcasts over leading dimensions, so the
same code scores one tuple (inside ``vmap``) or a whole batch.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Section 3 (InfoNCE and hinge losses on edge tuples), Algorithm 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from lightning_dprel.core.checks import check_choice, non_negative, positive_finite

__all__ = ["SCORES", "LOSSES", "pair_scores", "score_matrix", "tuple_scores", "infonce_loss", "hinge_loss", "tuple_loss", "check_loss_options"]

SCORES = ("dot", "cosine", "directed_cosine")
LOSSES = ("infonce", "hinge")


def check_loss_options(*, score: str, temperature: float, loss: str, margin: float) -> None:
    """Validate score/loss options, raising ``ValueError`` that names the parameter and a remedy."""
    check_choice("score", score, SCORES)
    check_choice("loss", loss, LOSSES)
    positive_finite("temperature", temperature, "it divides the cosine score")
    non_negative("margin", margin, "the hinge loss's margin")


def _views(h: Tensor) -> tuple[Tensor, Tensor]:
    """(source view, target view) of embeddings ``[..., 2d]`` laid out as ``[h_src ‖ h_dst]``."""
    if h.shape[-1] % 2:
        raise ValueError(f"`score='directed_cosine'` needs embeddings [..., 2d] = [source view ‖ target view], got dimension {h.shape[-1]}.")
    d = h.shape[-1] // 2
    return h[..., :d], h[..., d:]


def pair_scores(h_a: Tensor, h_b: Tensor, *, score: str = "cosine", temperature: float = 0.05) -> Tensor:
    """Score s(a, b): the dot product ⟨h_a, h_b⟩, the cosine similarity / τ, or the directed cosine / τ.

    ``"directed_cosine"`` scores the relation a → b (e.g. child → parent) as cos(a_src, b_dst) / τ on embeddings
    laid out as ``[h_src ‖ h_dst]`` (see :class:`~lightning_dprel.encoders.ResidualAdapter` with ``directed=True``);
    it is not symmetric.

    Args:
        h_a: ``[..., d]`` embeddings.
        h_b: ``[..., d]`` embeddings (broadcast against ``h_a``).
        score: ``"dot"`` or ``"cosine"``.
        temperature: τ > 0, used by ``"cosine"`` only.

    Returns:
        ``[...]`` scores.
    """
    if score == "dot":
        return (h_a * h_b).sum(-1)
    if score == "cosine":
        return (F.normalize(h_a, dim=-1, eps=1e-8) * F.normalize(h_b, dim=-1, eps=1e-8)).sum(-1) / temperature
    if score == "directed_cosine":
        return pair_scores(_views(h_a)[0], _views(h_b)[1], score="cosine", temperature=temperature)
    raise ValueError(f"`score` must be one of {SCORES}, got {score!r}.")


def score_matrix(h_a: Tensor, h_b: Tensor, *, score: str = "cosine", temperature: float = 0.05) -> Tensor:
    """All scores s(a_i, b_j) as one matrix product: ``[A, d]`` × ``[B, d]`` → ``[A, B]`` (same values as :func:`pair_scores`)."""
    if score == "dot":
        return h_a @ h_b.t()
    if score == "cosine":
        return (F.normalize(h_a, dim=-1, eps=1e-8) @ F.normalize(h_b, dim=-1, eps=1e-8).t()) / temperature
    if score == "directed_cosine":
        return score_matrix(_views(h_a)[0], _views(h_b)[1], score="cosine", temperature=temperature)
    raise ValueError(f"`score` must be one of {SCORES}, got {score!r}.")


def tuple_scores(h: Tensor, neg_anchor: Tensor, *, score: str = "cosine", temperature: float = 0.05) -> Tensor:
    """Scores of a tuple's positive edge (u, v) and its k negative edges (w_j, z_j) (Algorithm 2).

    The negative keeps the positive's orientation: with w_j = u it is (u, z_j), with w_j = v it is (z_j, v)
    (the same score for symmetric ``dot``/``cosine``; for ``directed_cosine``, z_j replaces the other end).

    Args:
        h: ``[..., 2 + k, d]`` embeddings of (u, v, z_1, …, z_k).
        neg_anchor: ``[..., k]`` in {0, 1}: w_j = u when 0, v when 1.
        score: ``"dot"`` or ``"cosine"``.
        temperature: τ for ``"cosine"``.

    Returns:
        ``[..., 1 + k]``: the positive score first, then the k negative scores.
    """
    u, v, z = h[..., 0, :], h[..., 1, :], h[..., 2:, :]
    pos = pair_scores(u, v, score=score, temperature=temperature).unsqueeze(-1)
    if score == "directed_cosine":
        from_u = pair_scores(u.unsqueeze(-2), z, score=score, temperature=temperature)  # (u, z_j)
        to_v = pair_scores(z, v.unsqueeze(-2), score=score, temperature=temperature)  # (z_j, v)
        neg = torch.where(neg_anchor == 0, from_u, to_v)
    else:
        w = torch.where(neg_anchor.unsqueeze(-1) == 0, u.unsqueeze(-2), v.unsqueeze(-2))
        neg = pair_scores(w, z, score=score, temperature=temperature)
    return torch.cat([pos, neg], dim=-1)


def infonce_loss(scores: Tensor) -> Tensor:
    """InfoNCE on one tuple: −log(exp s(e⁺) / Σ_{e ∈ T} exp s(e)); ``scores[..., 0]`` is the positive."""
    return torch.logsumexp(scores, dim=-1) - scores[..., 0]


def hinge_loss(scores: Tensor, *, margin: float = 1.0) -> Tensor:
    """Hinge on one tuple: Σ_j max(0, γ − s(e⁺) + s(e⁻_j)); ``scores[..., 0]`` is the positive."""
    return torch.relu(margin - scores[..., :1] + scores[..., 1:]).sum(-1)


def tuple_loss(
    h: Tensor,
    neg_anchor: Tensor,
    *,
    score: str = "cosine",
    temperature: float = 0.05,
    loss: str = "infonce",
    margin: float = 1.0,
) -> Tensor:
    """The loss L(Θ, T_i) of each tuple from its node embeddings ``h`` ``[..., 2 + k, d]``; returns ``[...]``."""
    s = tuple_scores(h, neg_anchor, score=score, temperature=temperature)
    if loss == "infonce":
        return infonce_loss(s)
    if loss == "hinge":
        return hinge_loss(s, margin=margin)
    raise ValueError(f"`loss` must be one of {LOSSES}, got {loss!r}.")
