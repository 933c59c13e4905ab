"""The one entry point for per-example gradients (Algorithm 3, line 3): which provider, the ghost plans, the chunk rule.

Every method asks a :class:`GradSampler`; every provider returns a :class:`~lightning_dprel.grad_sample.base.PerTupleResult`
whose ``grads`` is a :class:`~lightning_dprel.grad_sample.base.TupleGradients`:

- tuples of node slots (:meth:`GradSampler.tuples`): ``mode="auto"`` takes ghost clipping
  (:mod:`~lightning_dprel.grad_sample.ghost`) only where it is provably exact (:attr:`GhostPlan.exact`: a declared
  slot-wise encoder, every trainable parameter covered) and its run-time checks pass, else vmap
  (:mod:`~lightning_dprel.grad_sample.per_tuple`, the reference); ``"ghost"`` forces ghost (vmap for uncovered
  parameters, errors raised); ``"vmap"`` forms every tuple's gradient. ``materialize=True`` (a projected step needs the
  gradients as tensors) takes vmap whatever the mode.
- examples with graphs of their own (:meth:`GradSampler.loop`): one backward per example (:mod:`.loop`).
- examples routed to stacked copies of shared parameters (:meth:`GradSampler.stacked`): one backward (:mod:`.stacked`).

Chunks: ``chunk_size="auto"`` sizes tuples per chunk from the free memory
(:func:`~lightning_dprel.grad_sample.memory.auto_chunk_size`; the vmap path and ghost's fallback count their per-tuple
gradients), an int is used as given, None takes the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from torch import Tensor, nn

from lightning_dprel.core.checks import check_choice
from lightning_dprel.grad_sample.base import PerTupleResult, trainable_parameters
from lightning_dprel.grad_sample.ghost import GhostPlan, GhostUnsupported, ghost_grads, ghost_plan
from lightning_dprel.grad_sample.loop import per_example_loop
from lightning_dprel.grad_sample.memory import auto_chunk_size
from lightning_dprel.grad_sample.per_tuple import per_tuple_grads
from lightning_dprel.grad_sample.stacked import stacked_copy_grads

__all__ = ["MODES", "GradSampler", "check_chunk_size"]

MODES = ("auto", "ghost", "vmap")


def check_chunk_size(chunk_size: int | str | None) -> int | str | None:
    """``chunk_size`` if it is ``"auto"``, a positive int or None, else a ValueError naming it."""
    if chunk_size is None or chunk_size == "auto" or (isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size >= 1):
        return chunk_size
    raise ValueError(f"`chunk_size` must be 'auto', a positive int or None, got {chunk_size!r}.")


class GradSampler:
    """Per-example norms and clipped sums of a batch, by the provider the mode and the model allow.

    Args:
        mode: for tuples, ``"auto"`` (default: ghost where provably exact, else vmap), ``"ghost"`` or ``"vmap"``.
        chunk_size: tuples per forward/backward chunk: ``"auto"`` (default: from the free memory), an int, or None.

    Attributes:
        plans: the ghost plan per (encoder, trainable parameter names, training mode); a plan whose run-time check
            failed keeps the reason, so ``"auto"`` stays on vmap for that encoder from then on.
    """

    def __init__(self, mode: str = "auto", chunk_size: int | str | None = "auto") -> None:
        check_choice("per_tuple_mode", mode, MODES)
        self.mode, self.chunk_size = mode, check_chunk_size(chunk_size)
        self.plans: dict[tuple, GhostPlan] = {}

    def __repr__(self) -> str:
        return f"GradSampler(mode={self.mode!r}, chunk_size={self.chunk_size!r})"

    def plan(self, encoder: nn.Module, params: Mapping[str, Tensor]) -> GhostPlan:
        """The cached :func:`ghost_plan` of ``encoder`` for these parameters in its current training mode."""
        key = (id(encoder), tuple(params), encoder.training)
        if key not in self.plans:
            self.plans[key] = ghost_plan(encoder, params)
        return self.plans[key]

    def chunk(self, encoder: nn.Module, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor], *,
              per_tuple_gradients: bool) -> int | None:
        """Tuples per chunk: ``chunk_size`` as given, or sized from the free memory for ``"auto"``."""
        if self.chunk_size != "auto":
            return self.chunk_size
        return auto_chunk_size(encoder, inputs, params, per_tuple_gradients=per_tuple_gradients) if params else None

    def tuples(self, encoder: nn.Module, inputs: Mapping[str, Tensor], head: Callable[..., Tensor],
               head_args: tuple[Tensor, ...] = (), *, materialize: bool = False) -> PerTupleResult:
        """Per-tuple norms / clipped sums and losses of ``head(encoder(**inputs_i), *head_args_i)`` over tuples i.

        Args:
            encoder: maps node inputs ``[N, ...]`` to embeddings ``[N, d]``.
            inputs: per-tuple node inputs, each ``[B, 2 + k, ...]``.
            head: the tuple loss; broadcasts over tuples (``h [B, 2+k, d] → [B]``) and works on one (``h [2+k, d]``).
            head_args: tensors with leading dimension B passed per tuple to ``head``.
            materialize: form every tuple's gradient as a tensor (vmap), whatever the mode.
        """
        params = trainable_parameters(encoder)
        mode = "vmap" if materialize else self.mode
        if mode != "vmap" and params:
            plan = self.plan(encoder, params)
            if mode == "ghost" or plan.exact:
                size = self.chunk(encoder, inputs, params, per_tuple_gradients=bool(plan.fallback))
                try:
                    return ghost_grads(encoder, inputs, head, head_args, params=params, chunk_size=size, plan=plan)
                except GhostUnsupported as err:
                    if mode == "ghost":
                        raise
                    plan.reason = str(err)  # auto: a run-time check failed; vmap from now on
        size = self.chunk(encoder, inputs, params, per_tuple_gradients=True)
        return per_tuple_grads(encoder, inputs, head, head_args, chunk_size=size)

    def loop(self, params: Mapping[str, Tensor], losses: Iterable[Tensor | None]) -> PerTupleResult:
        """Per-example gradients of examples with inputs of their own, one backward each (``None``: gradient 0)."""
        return per_example_loop(params, losses)

    def stacked(self, params: Mapping[str, Tensor], losses_of: Callable[[dict[str, Tensor]], Tensor], size: int) -> PerTupleResult:
        """Per-example gradients of shared ``params`` (leading dimension 1) from B stacked copies, one backward."""
        return stacked_copy_grads(params, losses_of, size)
