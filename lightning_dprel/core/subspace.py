"""A public gradient subspace: project per-example gradients before clipping, noise k coordinates (GEP, Algorithm 1).

The basis V (``[P, k]``, orthonormal columns) is the top-k right singular subspace of per-example gradients of
*public* examples at the current (already released) parameters, so it is a function of public data and past
releases only. Each private per-example gradient g_i is replaced by its coordinates c_i = Vᵀg_i; the DP optimizer
clips ‖c_i‖ to C, sums, adds N(0, σ²C²I_k) and maps the result back with V. Removing one privacy unit changes the
released k-vector by exactly what it changes the un-projected clipped sum by in any mechanism whose per-example
bound is C, so the step's mechanism and accountant are unchanged; only the noise lives in k dimensions instead of P.

References:
    Yu, Zhang, Chen, Yin, Liu. Do not Let Privacy Overbill Utility: Gradient Embedding Perturbation for Private
    Learning (ICLR 2021), Algorithm 1 (anchor subspace from public gradients, projected clipping and noise).
    Zhou, Wu, Banerjee. Bypassing the Ambient Dimension: Private SGD with Gradient Subspace Identification (ICLR 2021).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.grad_sample.base import MaterializedGrads, TupleGradients

__all__ = ["GradientSubspace", "ProjectedGrads", "SUBSPACE", "check_subspace", "check_projected"]

#: The name of the one released tensor of a projected step (its k coordinates).
SUBSPACE = "subspace"


class GradientSubspace:
    """An orthonormal basis ``[P, k]`` over the flattened parameters ``names`` (in that order), with their shapes."""

    def __init__(self, basis: Tensor, shapes: Mapping[str, tuple[int, ...]]) -> None:
        if basis.dim() != 2:
            raise ValueError(f"`basis` must be [P, k], got shape {tuple(basis.shape)}.")
        self.shapes = {n: tuple(s) for n, s in shapes.items()}
        total = sum(int(torch.Size(s).numel()) for s in self.shapes.values())
        if basis.shape[0] != total:
            raise ValueError(f"`basis` has {basis.shape[0]} rows, the parameters {total} coordinates.")
        if not 1 <= basis.shape[1] <= total:
            raise ValueError(f"`basis` must have between 1 and {total} columns, got {basis.shape[1]}.")
        gram = basis.t() @ basis
        if not torch.allclose(gram, torch.eye(gram.shape[0], dtype=basis.dtype, device=basis.device), atol=1e-4):
            raise ValueError("`basis` must have orthonormal columns (use GradientSubspace.fit).")
        self.basis = basis

    @property
    def dim(self) -> int:
        """k: the number of noised coordinates."""
        return int(self.basis.shape[1])

    @classmethod
    def fit(cls, public_grads: Mapping[str, Tensor], k: int) -> "GradientSubspace":
        """The top-k right singular vectors of the public per-example gradients (name → ``[n, *shape]``)."""
        check_int("k", k, 1)
        flat = flatten(public_grads)
        if not torch.isfinite(flat).all():
            raise ValueError("the public per-example gradients hold non-finite values; check the public graph's features.")
        rank = min(flat.shape)
        if k > rank:
            raise ValueError(f"k={k} exceeds the rank bound min(public examples, parameters) = {rank}; lower k or use more public tuples.")
        _, _, vh = torch.linalg.svd(flat.double(), full_matrices=False)
        basis = vh[:k].t().to(flat.dtype).contiguous()
        return cls(basis, {n: tuple(t.shape[1:]) for n, t in public_grads.items()})

    def coordinates(self, flat: Tensor) -> Tensor:
        """Vᵀg for rows of flat gradients ``[B, P]`` → ``[B, k]``."""
        return flat @ self.basis.to(device=flat.device, dtype=flat.dtype)

    def project(self, grads: TupleGradients) -> "ProjectedGrads":
        """The per-example coordinates c_i = Vᵀg_i as the one released tensor of the step (already projected: as is)."""
        if isinstance(grads, ProjectedGrads):
            if grads.subspace is not self:
                raise ValueError("these coordinates were projected on another subspace than the optimizer's current one.")
            return grads
        if not isinstance(grads, MaterializedGrads):
            raise TypeError(
                f"a projected step needs per-example gradients as tensors (vmap), got {type(grads).__name__}; "
                "ghost clipping never forms them (the module switches to vmap while a subspace is set)."
            )
        if set(grads.names) != set(self.shapes):
            raise ValueError(f"the subspace covers {sorted(self.shapes)}, the gradients {sorted(grads.names)}.")
        basis = self.basis.to(device=grads.grads[next(iter(self.shapes))].device)
        coords = None  # Σ_n g_n·V_n block by block: no [B, P] concatenation on the step's path
        for name, rows in self._rows():
            g = grads.grads[name]
            part = g.reshape(g.shape[0], -1) @ basis[rows].to(g.dtype)
            coords = part if coords is None else coords + part
        return ProjectedGrads(coords, self)

    def lift(self, coords: Tensor) -> dict[str, Tensor]:
        """V·c split back into the parameters' shapes."""
        return self.split(self.basis.to(device=coords.device, dtype=coords.dtype) @ coords)

    def split(self, flat: Tensor) -> dict[str, Tensor]:
        """A flat ``[P]`` vector as the parameters' shapes."""
        return {name: flat[rows].view(self.shapes[name]) for name, rows in self._rows()}

    def _rows(self):
        """(name, slice of the flat index) per parameter, in order."""
        offset = 0
        for name, shape in self.shapes.items():
            numel = int(torch.Size(shape).numel())
            yield name, slice(offset, offset + numel)
            offset += numel


class ProjectedGrads(MaterializedGrads):
    """Per-example subspace coordinates ``[B, k]`` under the single name :data:`SUBSPACE`."""

    def __init__(self, coords: Tensor, subspace: GradientSubspace) -> None:
        if coords.dim() != 2 or coords.shape[1] != subspace.dim:
            raise ValueError(f"coordinates must be [B, k={subspace.dim}], got {tuple(coords.shape)}.")
        super().__init__({SUBSPACE: coords})
        self.subspace = subspace


def flatten(grads: Mapping[str, Tensor]) -> Tensor:
    """name → ``[B, *shape]`` as one ``[B, P]`` matrix (names in order)."""
    return torch.cat([t.reshape(t.shape[0], -1) for t in grads.values()], dim=1)


def check_subspace(subspace: GradientSubspace | None, named_params: Mapping[str, Tensor]) -> GradientSubspace | None:
    """``subspace`` if it covers exactly ``named_params`` (or is None), else a clear error."""
    if subspace is None:
        return None
    if not isinstance(subspace, GradientSubspace):
        raise TypeError(f"`subspace` must be a GradientSubspace or None, got {type(subspace).__name__}.")
    want = {n: tuple(p.shape) for n, p in named_params.items()}
    if subspace.shapes != want:
        raise ValueError(f"the subspace covers {subspace.shapes}, this optimizer's parameters are {want}.")
    return subspace


def check_projected(grads: TupleGradients, subspace: GradientSubspace | None) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of recorded gradients; ``{}`` for coordinates projected on ``subspace`` (refused otherwise)."""
    if not isinstance(grads, ProjectedGrads):
        return grads.shapes()
    if subspace is None:
        raise ValueError("Projected coordinates were recorded but this optimizer has no subspace (set_subspace).")
    if grads.subspace is not subspace:
        raise ValueError("these coordinates were projected on another subspace than the optimizer's current one.")
    return {}
