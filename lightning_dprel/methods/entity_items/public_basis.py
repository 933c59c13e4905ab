"""Public-feature adapters: the adapter's output lives in the public items' singular directions.

V (``[d, k]``) holds the top-k right singular vectors of the public item embeddings T and s their singular values; both
are functions of public data alone, so using them costs no privacy (Krichene et al., "Private Learning with Public
Features", AISTATS 2024, Section 3: condition on the public side, privatise only the interaction). Two uses:

* a **public basis**: A = V·M·Vᵀ (+ V·w), k² + k trained (and noised) coordinates instead of d²;
* a **public preconditioner**: A = V·diag((s/s̄)^−γ)·M (full rank), which rescales the item-side directions the
  clipped gradient is measured and the noise is added in: γ > 0 gives the rare directions of the item space a larger
  share of each entity's clipped contribution (γ = 0: a rotation of the plain adapter).
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
    """x ↦ V_out·(M·V_inᵀx + w), zero at the start; V_out = V·diag((s/s̄)^−γ), V_in = V (or the identity).

    Args:
        dim: d. k: the number of the items' singular directions kept (≤ d, ≤ the number of items).
        item_x: the public item embeddings (or later, with :meth:`fit`).
        precondition: γ (0: V_out = V). project_input: V_in = V (else the identity, M is k×d). bias: train w.
    """

    def __init__(self, dim: int, k: int, item_x: Tensor | None = None, *, precondition: float = 0.0,
                 project_input: bool = True, bias: bool = True) -> None:
        super().__init__()
        dim = check_int("dim", dim, 1)
        k = check_int("public_basis", k, 1, maximum=dim)
        self.gamma = float(precondition)
        if not abs(self.gamma) < float("inf"):
            raise ValueError(f"`precondition` (γ) must be finite, got {precondition}.")
        self.project_input = bool(project_input)
        self.register_buffer("basis", torch.zeros(dim, k))
        self.register_buffer("basis_out", torch.zeros(dim, k))
        self.inner = nn.Linear(k if self.project_input else dim, k, bias=bool(bias))
        nn.init.zeros_(self.inner.weight)
        if self.inner.bias is not None:
            nn.init.zeros_(self.inner.bias)
        if item_x is not None:
            self.fit(item_x)

    @property
    def ready(self) -> bool:
        """Whether V holds the public basis (a zero V is unset: read from the items at setup, or a checkpoint)."""
        return bool(self.basis.abs().sum() > 0)

    def fit(self, item_x: Tensor) -> None:
        """Set V (and V_out) from the public item embeddings."""
        if item_x.size(1) != self.basis.size(0):
            raise ValueError(f"`item_x` has {item_x.size(1)} dimensions, the adapter {self.basis.size(0)}.")
        k = self.basis.size(1)
        v = public_item_basis(item_x.float(), k)
        s = torch.linalg.svdvals(item_x.double())[:k].float()
        self.basis.copy_(v)
        self.basis_out.copy_(v * (s / s.mean()).clamp(min=1e-12) ** (-self.gamma))

    def forward(self, x: Tensor) -> Tensor:
        if not self.ready:
            raise RuntimeError("PublicBasisAdapter has no basis yet: give it the public item embeddings (`fit`).")
        return self.inner(x @ self.basis if self.project_input else x) @ self.basis_out.t()
