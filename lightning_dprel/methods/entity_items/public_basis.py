"""A public-feature adapter: A = V·M·Vᵀ (+ V·w) with V the public item embeddings' top-k right singular vectors.

The items' embeddings are public, so V (a function of them alone) costs no privacy (Krichene et al., "Private
Learning with Public Features", AISTATS 2024, Section 3: condition on the public side, privatise only the
interaction). Only M (k×k) and w (k) are trained, so DP-SGD noises k² + k coordinates instead of d², and each
clipped per-entity gradient keeps only its component in the items' span, where the scores move.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_dprel.core.checks import check_int

__all__ = ["PublicBasisAdapter", "public_item_basis"]


def public_item_basis(item_x: Tensor, k: int) -> Tensor:
    """``[d, k]``: the top-k right singular vectors of the public item embeddings, signs fixed (largest entry > 0)."""
    if item_x.dim() != 2 or not torch.isfinite(item_x).all():
        raise ValueError(f"`item_x` must be a finite [n_items, d] tensor, got shape {tuple(item_x.shape)}.")
    k = check_int("public_basis", k, 1, maximum=min(item_x.shape))
    _, _, vh = torch.linalg.svd(item_x.double(), full_matrices=False)
    v = vh[:k].t()
    sign = torch.sign(v.gather(0, v.abs().argmax(0, keepdim=True)))
    return (v * sign).to(item_x.dtype)


class PublicBasisAdapter(nn.Module):
    """x ↦ V·(M·Vᵀx + w), zero at the start; V ``[d, k]`` a buffer (public), M and w trained (one ``nn.Linear``)."""

    def __init__(self, dim: int, k: int, item_x: Tensor | None = None) -> None:
        super().__init__()
        dim = check_int("dim", dim, 1)
        k = check_int("public_basis", k, 1, maximum=dim)
        self.register_buffer("basis", torch.zeros(dim, k))
        self.inner = nn.Linear(k, k)
        nn.init.zeros_(self.inner.weight)
        nn.init.zeros_(self.inner.bias)
        if item_x is not None:
            self.fit(item_x)

    @property
    def ready(self) -> bool:
        """Whether V holds the public basis (a zero V is unset: read from the items at setup, or a checkpoint)."""
        return bool(self.basis.abs().sum() > 0)

    def fit(self, item_x: Tensor) -> None:
        """Set V from the public item embeddings."""
        if item_x.size(1) != self.basis.size(0):
            raise ValueError(f"`item_x` has {item_x.size(1)} dimensions, the adapter {self.basis.size(0)}.")
        self.basis.copy_(public_item_basis(item_x.float(), self.basis.size(1)))

    def forward(self, x: Tensor) -> Tensor:
        if not self.ready:
            raise RuntimeError("PublicBasisAdapter has no basis yet: give it the public item embeddings (`fit`).")
        return self.inner(x @ self.basis) @ self.basis.t()
