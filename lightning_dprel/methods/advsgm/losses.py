"""Skip-gram-with-negatives and AdvSGM's adversarial terms, per tuple (AdvSGM Eqs. 2, 13, 16; Algorithm 1).

A tuple's embeddings ``h [..., 2 + k, 2r]`` follow :class:`~lightning_dprel.datamodules.edge_tuples.batch.TupleBatch`'s
columns (u, v, z_1, …, z_k), each row ``[v_i ‖ c_i]`` (:class:`~.encoder.NodeIdEmbedding`). Everything broadcasts over
leading dimensions, so the same code scores one tuple (inside ``vmap``) or a batch (ghost clipping).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dprel.core.checks import check_choice

__all__ = ["softclip", "constrained_sigmoid", "log_sigmoid", "sgns_loss", "adversarial_loss", "split_tables"]

#: Algorithm 1's bounds (a, b) as the authors' code sets them.
SOFTCLIP_BOUNDS = (1e-5, 120.0)


def softclip(x: Tensor, a: float = SOFTCLIP_BOUNDS[0], b: float = SOFTCLIP_BOUNDS[1]) -> Tensor:
    """Algorithm 1 (exponential clipping): a smooth clamp of ``x`` to [a, b] with corners of width ≈ (b − a)/4.19."""
    c = 1.0 / (2.0 * (2.0 / (math.exp(2.0) + 1.0))) / ((b - a) / 2.0)
    return x.clamp(a, b) + torch.exp(-c * (x - a).abs()) / (2 * c) - torch.exp(-c * (x - b).abs()) / (2 * c)


def constrained_sigmoid(x: Tensor) -> Tensor:
    """S(x) = 1/(1 + softclip(−x)) of Section IV-C (not the logistic function: S(0) ≈ 0.066)."""
    return 1.0 / (1.0 + softclip(-x))


def log_sigmoid(x: Tensor, kind: str = "logistic") -> Tensor:
    """log σ(x) for the logistic σ (provable mode), or log S(x) for the constrained sigmoid (paper-faithful mode)."""
    return F.logsigmoid(x) if kind == "logistic" else torch.log(constrained_sigmoid(x))


def split_tables(h: Tensor) -> tuple[Tensor, Tensor]:
    """(node vectors v, context vectors c) of rows laid out ``[v ‖ c]``."""
    r = h.shape[-1] // 2
    return h[..., :r], h[..., r:]


def sgns_loss(h: Tensor, neg_anchor: Tensor, *, symmetric: bool = True, part: str = "both", sigmoid: str = "logistic",
              negatives: str = "sum", neg_label: Tensor | None = None) -> Tensor:
    """L_sgm of a tuple (Eq. 2): −log σ(v_u·c_v) [− log σ(v_v·c_u)] − Σ_j log σ(−v_{w_j}·c_{z_j}).

    Args:
        h: ``[..., 2 + k, 2r]`` rows of (u, v, z_1, …, z_k).
        neg_anchor: ``[..., k]`` in {0, 1}: negative j pairs z_j with w_j = u (0) or v (1).
        symmetric: score the positive both ways (an undirected edge: u→v and v→u), else u→v only.
        part: ``"both"``, ``"positive"`` or ``"negative"`` (the paper's two updates per iteration, Eq. 24).
        sigmoid: ``"logistic"`` or ``"constrained"`` (S, Algorithm 1).
        negatives: ``"sum"`` (Eq. 2) or ``"mean"`` over the k negatives (the authors' code: its negative update is the
            mean over its own B·k pairs, so they weigh as much as the B positives).
        neg_label: ``[..., k]`` labels y_j ∈ {−1, +1} of the negatives, term −log σ(y_j·v_{w_j}·c_{z_j}) (None: all −1;
            the code labels a sampled pair that is an edge +1).

    Returns:
        ``[...]`` per-tuple losses.
    """
    check_choice("negatives", negatives, ("sum", "mean"))
    v, c = split_tables(h)
    loss = h.new_zeros(h.shape[:-2])
    if part in ("both", "positive"):
        loss = loss - log_sigmoid((v[..., 0, :] * c[..., 1, :]).sum(-1), sigmoid)
        if symmetric:
            loss = loss - log_sigmoid((v[..., 1, :] * c[..., 0, :]).sum(-1), sigmoid)
    if part in ("both", "negative") and h.shape[-2] > 2:
        anchor = neg_anchor.to(h.dtype)[..., None]  # [..., k, 1]
        v_w = v[..., 0:1, :] * (1 - anchor) + v[..., 1:2, :] * anchor
        score = (v_w * c[..., 2:, :]).sum(-1)
        terms = log_sigmoid(-score if neg_label is None else neg_label.to(h.dtype) * score, sigmoid)
        loss = loss - (terms.mean(-1) if negatives == "mean" else terms.sum(-1))
    return loss


def adversarial_loss(h: Tensor, fakes: Tensor, *, noise: Tensor | None = None, sigmoid: str = "logistic", symmetric: bool = True) -> Tensor:
    """λ-free discriminator terms L̃_adv1 + L̃_adv2 (Eqs. 13, 16) of a tuple's positive (u, v).

    L̃_adv1 = −log(1 − F(v_u·v'_v + ξ_1·v_u)), L̃_adv2 = −log(1 − F(v'_u·c_v + ξ_2·c_v)), with v' the generator's fake
    neighbours: the discriminator learns to score a real node against a fake neighbour low.

    Args:
        h: ``[..., 2 + k, 2r]`` rows of (u, v, …).
        fakes: ``[..., 2, r]`` fake neighbours (v'_u, v'_v), constants (the generator's, from released state).
        noise: ``[..., 2, r]`` per-example (ξ_1, ξ_2) inside F: the paper-faithful mode only (None: none).
        sigmoid: F: ``"logistic"`` or ``"constrained"`` (S).
        symmetric: also the terms of (v, u).
    """
    v, c = split_tables(h)

    def terms(a: int, b: int) -> Tensor:
        x1 = (v[..., a, :] * fakes[..., b, :]).sum(-1)
        x2 = (fakes[..., a, :] * c[..., b, :]).sum(-1)
        if noise is not None:
            x1 = x1 + (noise[..., 0, :] * v[..., a, :]).sum(-1)
            x2 = x2 + (noise[..., 1, :] * c[..., b, :]).sum(-1)
        return -log_sigmoid(-x1, sigmoid) - log_sigmoid(-x2, sigmoid) if sigmoid == "logistic" else (
            -torch.log1p(-constrained_sigmoid(x1)) - torch.log1p(-constrained_sigmoid(x2))
        )

    return terms(0, 1) + terms(1, 0) if symmetric else terms(0, 1)
