"""Per-example gradients from B stacked copies of shared parameters: one forward, one backward (DP-SGD, Abadi et al.).

Each shared parameter has a leading dimension 1 (a prompt ``[1, d]``, a head ``[1, c, d]``); it is expanded into B
copies ``[B, ...]`` and the model routes example b through copy b only. Then Σ_b ℓ_b differentiated with respect to
copy b is ∇ℓ_b, example b's own gradient, for all b in one backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.grad_sample.base import MaterializedGrads, PerTupleResult

__all__ = ["stacked_copy_grads"]


def stacked_copy_grads(params: Mapping[str, Tensor], losses_of: Callable[[dict[str, Tensor]], Tensor], size: int) -> PerTupleResult:
    """Per-example gradients ``[B, *param.shape]`` of the shared ``params`` from ``losses_of(copies) -> [B]``.

    Args:
        params: name → shared parameter, each with leading dimension 1.
        losses_of: maps the copies name → ``[B, *param.shape[1:]]`` to the per-example losses ``[B]``, example b
            using copy b only (e.g. ``functional_call`` with an owner index b per example).
        size: B, the number of examples.

    Returns:
        :class:`PerTupleResult` with :class:`MaterializedGrads` name → ``[B, *param.shape]`` and the losses ``[B]``.
    """
    if not params:
        raise ValueError("`params` is empty: the model has no trainable parameters (none with requires_grad).")
    check_int("size (B)", size, 0)
    wide = {n: tuple(p.shape) for n, p in params.items() if p.dim() == 0 or p.shape[0] != 1}
    if wide:
        raise ValueError(f"stacked copies need every shared parameter with a leading dimension 1, got {wide}; "
                         "give the parameter a leading 1, or use GradSampler.loop.")
    ref = next(iter(params.values()))
    if size == 0:
        return PerTupleResult(MaterializedGrads({n: p.new_zeros((0,) + tuple(p.shape)) for n, p in params.items()}), ref.new_zeros(0))
    copies = {n: p.detach().expand(size, *p.shape[1:]).clone().requires_grad_(True) for n, p in params.items()}
    losses = losses_of(copies)
    if losses.shape != (size,):
        raise ValueError(f"`losses_of` must return one loss per example, [B] = [{size}], got {tuple(losses.shape)}.")
    grads = torch.autograd.grad(losses.sum(), list(copies.values()))  # Σ_b ℓ_b: d/d copy_b = ∇ℓ_b
    return PerTupleResult(MaterializedGrads({n: g.detach().unsqueeze(1) for n, g in zip(copies, grads)}), losses.detach())
