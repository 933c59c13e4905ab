"""Graph prompts on input features (Fang et al. 2023, GPF and GPF-plus) with a linear answer head, stacked over owners.

Every prompt holds ``num_prompts`` independent copies of its parameters; ``owner`` [n] says which copy each node uses (an int or None: copy ``owner`` or 0 for all).
One forward and one backward then train many prompts at once (DP-GPL's teachers), and with ``num_prompts`` equal to the
batch size the gradient of copy b is example b's own gradient (DP-SGD's per-example gradients, no second pass).
Adam is element-wise, so copies stepped together train exactly as if each had its own optimizer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from lightning_dprel.core.checks import check_choice

__all__ = ["GPF", "GPFPlus", "AnswerHead", "build_prompt", "PROMPTS"]


class GPF(nn.Module):
    """GPF: x' = x + p (one learned vector per owner; Fang et al. 2023, Eq. 5)."""

    def __init__(self, in_dim: int, *, num_prompts: int = 1) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros(num_prompts, in_dim))

    @property
    def num_prompts(self) -> int:
        return self.p.shape[0]

    def forward(self, x: Tensor, owner: Tensor | int | None = None) -> Tensor:
        return x + (self.p[owner or 0] if owner is None or isinstance(owner, int) else self.p[owner])


class GPFPlus(nn.Module):
    """GPF-plus: x' = x + Σ_j softmax_j(a_j·x + b_j) p_j with ``num_basis`` learned vectors (Fang et al. 2023, Eq. 7)."""

    def __init__(self, in_dim: int, *, num_basis: int = 5, num_prompts: int = 1) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.empty(num_prompts, num_basis, in_dim))
        self.a = nn.Parameter(torch.empty(num_prompts, num_basis, in_dim))
        self.b = nn.Parameter(torch.zeros(num_prompts, num_basis))
        nn.init.normal_(self.p, std=in_dim**-0.5)
        nn.init.normal_(self.a, std=in_dim**-0.5)

    @property
    def num_prompts(self) -> int:
        return self.p.shape[0]

    def forward(self, x: Tensor, owner: Tensor | int | None = None) -> Tensor:
        if owner is None or isinstance(owner, int):  # one prompt for every node: no gather
            j = owner or 0
            return x + torch.softmax(x @ self.a[j].t() + self.b[j], dim=-1) @ self.p[j]
        weights = torch.softmax(torch.einsum("nd,nkd->nk", x, self.a[owner]) + self.b[owner], dim=-1)
        return x + torch.einsum("nk,nkd->nd", weights, self.p[owner])


class AnswerHead(nn.Module):
    """The linear answer head of ProG's prompt tuning, one per owner: logits = z·W_o + b_o."""

    def __init__(self, in_dim: int, num_classes: int, *, num_prompts: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_prompts, in_dim, num_classes) * in_dim**-0.5)
        self.bias = nn.Parameter(torch.zeros(num_prompts, num_classes))

    def forward(self, z: Tensor, owner: Tensor | int | None = None) -> Tensor:
        if owner is None or isinstance(owner, int):
            return z @ self.weight[owner or 0] + self.bias[owner or 0]
        return torch.einsum("nh,nhc->nc", z, self.weight[owner]) + self.bias[owner]


PROMPTS = {"gpf": GPF, "gpf_plus": GPFPlus}


def build_prompt(kind: str, in_dim: int, *, num_prompts: int = 1, num_basis: int = 5) -> nn.Module:
    """A prompt by name (``gpf`` or ``gpf_plus``)."""
    check_choice("prompt", kind, sorted(PROMPTS))
    if kind == "gpf":
        return GPF(in_dim, num_prompts=num_prompts)
    return GPFPlus(in_dim, num_basis=num_basis, num_prompts=num_prompts)
