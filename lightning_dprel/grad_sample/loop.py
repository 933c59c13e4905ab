"""Per-example gradients one example at a time: a forward and a backward per example (DP-SGD, Abadi et al. 2016, Alg. 1).

For examples that are not tuples of node slots, e.g. DP-GCN's subgraphs, each with its own graph: example i's loss
ℓ_i is computed from its own inputs only, so g_i = ∂ℓ_i/∂Θ is its own gradient. The losses are consumed one by one
(a generator keeps one example's graph alive at a time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from lightning_dprel.grad_sample.base import MaterializedGrads, PerTupleResult

__all__ = ["per_example_loop"]


def per_example_loop(params: Mapping[str, Tensor], losses: Iterable[Tensor | None]) -> PerTupleResult:
    """g_i = ∂ℓ_i/∂Θ for each scalar loss of ``losses``; ``None`` (an example with nothing to fit) has gradient 0.

    Args:
        params: name → parameter, the parameters to differentiate (e.g. ``trainable_parameters(encoder)``).
        losses: one scalar loss per example, in order; a parameter a loss does not reach gets gradient 0.

    Returns:
        :class:`PerTupleResult` with :class:`MaterializedGrads` name → ``[B, *shape]`` and the losses ``[B]`` (0 for None).
    """
    if not params:
        raise ValueError("`params` is empty: the model has no trainable parameters (none with requires_grad).")
    names, tensors = list(params), list(params.values())
    rows: list[tuple[Tensor, ...]] = []
    values: list[Tensor] = []
    for i, loss in enumerate(losses):
        if loss is None:
            rows.append(tuple(torch.zeros_like(p) for p in tensors))
            values.append(tensors[0].new_zeros(()))
            continue
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError(f"example {i}: each loss must be a scalar tensor (or None), got {getattr(loss, 'shape', type(loss))}.")
        grads = torch.autograd.grad(loss.reshape(()), tensors, allow_unused=True)
        rows.append(tuple(torch.zeros_like(p) if g is None else g.detach() for g, p in zip(grads, tensors)))
        values.append(loss.detach().reshape(()))
    if not rows:
        return PerTupleResult(MaterializedGrads({n: p.new_zeros((0,) + tuple(p.shape)) for n, p in params.items()}),
                              tensors[0].new_zeros(0))
    grads = {n: torch.stack([r[i] for r in rows]) for i, n in enumerate(names)}
    return PerTupleResult(MaterializedGrads(grads), torch.stack([v.to(values[0].dtype) for v in values]))
