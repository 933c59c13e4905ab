"""Per-example gradients of a user's own ``training_step`` (DP-SGD, Abadi et al. 2016, Alg. 1, line "compute gradient").

Example i's loss is the user's ``training_step`` on the batch of example i alone (an :class:`ExampleView` says what that
is), so its gradient involves no other example whatever the loss's reduction. Stackable examples take one
``torch.func.vmap`` of ``grad`` over ``functional_call`` (the user's parameters swapped for the traced ones); others one
backward each (:mod:`.loop`). ``self.log`` is silenced while examples run alone: the step's logs come from the full batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from lightning_dprel.core.example_views import ExampleView
from lightning_dprel.grad_sample.base import MaterializedGrads, PerTupleResult
from lightning_dprel.grad_sample.loop import per_example_loop

__all__ = ["step_loss", "quiet_logging", "user_step_grads"]


def step_loss(output: Any) -> Tensor:
    """The loss of a ``training_step``'s output: a tensor, or the ``"loss"`` of a dict (Lightning's two forms)."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise ValueError(
            "A private training_step must return its loss: a scalar tensor or a dict with a scalar 'loss' "
            f"(got {type(output).__name__}); returning None to skip a batch is refused (skipping reveals the sample)."
        )
    return loss.reshape(())


def _silent(*args: Any, **kwargs: Any) -> None:
    """``log`` / ``log_dict`` of an example run alone."""


@contextlib.contextmanager
def quiet_logging(module: nn.Module) -> Iterator[None]:
    """``module.log`` / ``log_dict`` do nothing in the body (an example run alone must not log); what the module's
    ``__dict__`` held for them before (a guard of the privacy callback) is put back."""
    if module.__dict__.get("log") is _silent:  # already silenced by an outer block
        yield
        return
    saved = {k: module.__dict__[k] for k in ("log", "log_dict") if k in module.__dict__}
    module.__dict__["log"] = module.__dict__["log_dict"] = _silent
    try:
        yield
    finally:
        for k in ("log", "log_dict"):
            module.__dict__.pop(k, None)
        module.__dict__.update(saved)


class _Step(nn.Module):
    """The user's step as a module's forward, so ``functional_call`` can swap its parameters."""

    def __init__(self, module: nn.Module, step: Any) -> None:
        super().__init__()
        self.m = module
        self._step = step

    def forward(self, batch: Any, batch_idx: int) -> Tensor:
        return step_loss(self._step(batch, batch_idx))


def user_step_grads(module: nn.Module, step: Any, view: ExampleView, batch: Any, batch_idx: int,
                    params: Mapping[str, Tensor], *, chunk_size: int | None = None) -> PerTupleResult:
    """Per-example gradients (name → ``[B, *shape]``) and losses ``[B]`` of ``step(one example, batch_idx)``.

    Args:
        module: the LightningModule whose parameters ``params`` are (names as in ``module.named_parameters()``).
        step: the user's training step (the original bound method).
        view: how ``batch`` splits into examples.
        params: the trainable parameters, by name.
        chunk_size: examples per vmap chunk (None: all at once).
    """
    size = view.size(batch)
    if size == 0:
        return PerTupleResult(MaterializedGrads({n: p.new_zeros((0, *p.shape)) for n, p in params.items()}),
                              torch.zeros(0))
    with quiet_logging(module):
        if not view.stacks:
            return per_example_loop(params, (step_loss(step(ex, batch_idx)) for ex in view.examples(batch)))
        wrapper = _Step(module, step)
        detached = {f"m.{n}": p.detach() for n, p in params.items()}
        slots = _slots(wrapper, detached)

        def loss_of(p: dict[str, Tensor], example: Any) -> Tensor:
            return functional_call(wrapper, {s: p[n] for s, n in slots.items()}, (view.one(example), batch_idx),
                                   strict=False, tie_weights=False)

        stacked = view.stacked(batch)
        in_dims = (None, view.in_dims(stacked))
        grads, losses = vmap(grad_and_value(loss_of), in_dims=in_dims, randomness="different",
                             chunk_size=chunk_size)(detached, stacked)
    return PerTupleResult(MaterializedGrads({n: grads[f"m.{n}"] for n in params}), losses.detach())


def _slots(wrapper: nn.Module, names: Mapping[str, Tensor]) -> dict[str, str]:
    """Every name these parameters are reached under (tied ones too), one per module → the name given (as
    ``named_parameters`` names it). ``functional_call`` would swap a module reached under two names twice and restore
    the traced tensor (torch 2.x)."""
    first: dict[int, str] = {}
    out = {}
    for prefix, m in wrapper.named_modules():  # each module once
        for k, p in m._parameters.items():
            if p is not None:
                name = f"{prefix}.{k}" if prefix else k
                given = first.setdefault(id(p), name)
                if given in names:
                    out[name] = given
    return out
