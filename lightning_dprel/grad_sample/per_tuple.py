"""Per-tuple gradients g(T_i) = ∂L(Θ, T_i)/∂Θ with torch.func (Algorithm 3, line 3).

Each tuple is encoded on its own: its 2 + k node inputs go through the encoder as one small batch, and
the loss of that tuple is differentiated with ``torch.func.grad`` under ``torch.func.vmap`` over tuples.
A tuple's gradient therefore depends on its own inputs only (tuple independence, which the sensitivity
analysis needs), and only the encoder's trainable parameters (e.g. LoRA adapters) get per-tuple
gradients. No Opacus hooks are involved.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 (line 3: per-tuple gradients). Pattern after Opacus
    ``grad_sample/functorch.py`` (``functional_call`` under ``vmap(grad(...))``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from lightning_dprel.core.checks import check_int
from lightning_dprel.grad_sample.base import (
    MaterializedGrads,
    PerTupleResult,
    TupleGradients,
    trainable_parameters,
    uses_dropout,
)

__all__ = [
    "TupleGradients", "MaterializedGrads", "PerTupleResult", "trainable_parameters", "uses_dropout",
    "check_per_tuple_args", "per_tuple_grads", "head_for_one",
]


def check_per_tuple_args(
    encoder: nn.Module, inputs: Mapping[str, Tensor], head_args: tuple[Tensor, ...], params: Mapping[str, Tensor] | None,
    chunk_size: int | None,
) -> dict[str, Tensor]:
    """Validate the arguments shared by the vmap and ghost paths; returns the parameters to differentiate."""
    check_int("chunk_size", chunk_size, 1, optional=True)
    if not inputs:
        raise ValueError("`inputs` is empty; pass the per-tuple node inputs, e.g. the relational method's tuple_inputs(batch).")
    params = dict(trainable_parameters(encoder) if params is None else params)
    if not params:
        raise ValueError("The encoder has no trainable parameters (none with requires_grad); nothing to differentiate.")
    size = next(iter(inputs.values())).shape[0]
    for key, value in list(inputs.items()) + [(f"head_args[{i}]", a) for i, a in enumerate(head_args)]:
        if value.shape[0] != size:
            raise ValueError(f"Per-tuple input `{key}` has leading size {value.shape[0]}, expected B = {size}.")
    return params


def per_tuple_grads(
    encoder: nn.Module,
    inputs: Mapping[str, Tensor],
    head: Callable[..., Tensor],
    head_args: tuple[Tensor, ...] = (),
    *,
    params: Mapping[str, Tensor] | None = None,
    chunk_size: int | None = None,
    randomness: str | None = None,
) -> PerTupleResult:
    """Per-tuple gradients of ``head(encoder(**inputs_i), *head_args_i)`` over the trainable parameters.

    Args:
        encoder: maps keyword inputs (``x`` or ``input_ids``/``attention_mask``) of ``2 + k`` nodes to
            embeddings ``[2 + k, d]``.
        inputs: per-tuple node inputs, each ``[B, 2 + k, ...]`` (see :func:`~lightning_dprel.datamodules.edge_tuples.batch.tuple_inputs`).
        head: ``head(h, *args_i) -> scalar`` loss of one tuple from its embeddings.
        head_args: tensors with leading dimension ``B`` passed per tuple to ``head`` (e.g. ``neg_anchor``).
        params: the parameters to differentiate (default: :func:`trainable_parameters` of ``encoder``);
            the others are taken from ``encoder`` and held fixed.
        chunk_size: tuples per vmapped chunk (None: all at once); bounds peak memory.
        randomness: vmap randomness; default ``"different"`` when dropout is active, else ``"error"``.

    Returns:
        :class:`PerTupleResult` with :class:`MaterializedGrads` (detached ``[B, *shape]`` per parameter) and losses ``[B]``.
    """
    params = check_per_tuple_args(encoder, inputs, head_args, params, chunk_size)
    params = {name: p.detach() for name, p in params.items()}
    size = next(iter(inputs.values())).shape[0]
    if size == 0:  # an empty Poisson sample is still a step: zero per-tuple gradients
        grads = {name: p.new_zeros((0,) + tuple(p.shape)) for name, p in params.items()}
        return PerTupleResult(MaterializedGrads(grads), next(iter(params.values())).new_zeros(0))
    if randomness is None:
        randomness = "different" if uses_dropout(encoder) else "error"
    keys = list(inputs.keys())

    def loss_one(p: dict[str, Tensor], values: tuple[Tensor, ...], args: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        h = functional_call(encoder, p, (), dict(zip(keys, values)))
        loss = head(h, *args)
        return loss, loss.detach()

    fn = vmap(
        grad(loss_one, has_aux=True),
        in_dims=(None, 0, 0),
        chunk_size=chunk_size,
        randomness=randomness,
    )
    with torch.enable_grad():
        grads, losses = fn(params, tuple(inputs[k] for k in keys), tuple(head_args))
    return PerTupleResult(MaterializedGrads({name: g.detach() for name, g in grads.items()}), losses.detach())


def head_for_one(head: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A batched head applied to one tuple (vmap's view): ``h [2+k, d] → scalar``."""

    def one(h: Tensor, *args: Tensor) -> Tensor:
        return head(h.unsqueeze(0), *(a.unsqueeze(0) for a in args)).squeeze(0)

    return one
