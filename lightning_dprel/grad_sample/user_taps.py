"""Ghost norms for a user's step with each example run alone: exact whatever the step does (Li et
al. 2022, Eq. 4).

Each example's loss is the user's ``training_step`` on that example alone, inside
``torch.func.vmap``, as in :mod:`~lightning_dprel.grad_sample.user_step`. Every layer with a
``user_step`` rule in :mod:`~lightning_dprel.grad_sample.layers` (``nn.Linear``, or a layer type
someone registered) that runs exactly once in the step gets a zero tap added to its output, and the
vmapped ``grad`` is taken with respect to the tap, so it returns that example's output gradient;
the layer's input comes back as an auxiliary output. Since the example ran alone, the layer's rule
gives that example's norm and clipped-sum pieces from them (ghost norms, book-keeping): no
per-example weight gradient is formed. Every other trainable parameter (a layer run twice, one
without a rule) gets its per-example gradient formed as in the vmap path, and so does a tapped
layer whose parameters are also used elsewhere: tied ones up front, other uses (a penalty) seen in
the pass, where the layer runs on its detached parameters so that only another use links the
losses to them (the step is then redone).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from lightning_dprel.core.example_views import ExampleView
from lightning_dprel.grad_sample.base import PerTupleResult
from lightning_dprel.grad_sample.layers import GhostGrads, LayerPieces, Taps, rule_for
from lightning_dprel.grad_sample.user_step import _Step, _slots, quiet_logging

__all__ = ["tapped_layers", "user_step_tapped_grads"]


def tapped_layers(module: nn.Module, params: Mapping[str, Tensor]) -> dict[str, nn.Module]:
    """The layers with a ``user_step`` rule (their class's forward, not overridden) whose trainable
    parameters are all in ``params`` and held by no other module or attribute (tied weights are
    formed; one module reached under two names is not tied), name → layer."""
    slots: dict[int, int] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                slots[id(p)] = slots.get(id(p), 0) + 1
    out = {}
    for name, m in module.named_modules():
        rule = rule_for(m, inherited=True)
        if rule is not None and rule.user_step and "forward" not in m.__dict__:
            own = [(f"{name}.{k}", p) for k, p in m.named_parameters(recurse=False)]
            if own and all(k in params and slots[id(p)] == 1 for k, p in own):
                out[name] = m
    return out


def user_step_tapped_grads(module: nn.Module, step: Any, view: ExampleView, batch: Any, batch_idx: int,
                           params: Mapping[str, Tensor], layers: Mapping[str, nn.Module],
                           outputs: MutableMapping[str, Tensor] | None = None) -> PerTupleResult | None:
    """Per-example norms and clipped sums of ``step(one example, batch_idx)`` with those ``layers``
    tapped that run
    exactly once per example (the others' gradients are formed); None when none does (the caller takes the vmap path).

    A layer whose parameters the step also uses elsewhere is removed from ``layers`` (for the rest of the fit) and the
    step is recomputed with its gradient formed. ``outputs`` (kept by the caller across steps): the tapped layers'
    outputs for one example, from a dry run of example 0; reused while every tap meets an output of its shape, dtype and
    device."""
    size = view.size(batch)
    stacked = view.stacked(batch)
    wrapper = _Step(module, step)
    outputs = {} if outputs is None else outputs
    fresh = not outputs  # taken by this call's dry run (else kept from an earlier step)
    taps = Taps(layers)
    tapping = layers
    try:
        if not outputs:  # a dry run of example 0: each layer once, its output's shape
            with quiet_logging(module), torch.no_grad():
                functional_call(wrapper, {}, (next(view.examples(batch)), batch_idx), strict=False)
            outputs.update({n: taps.outputs[n] for n in layers if taps.calls.get(n) == 1})  # others: formed
        layers = {n: m for n, m in layers.items() if n in outputs}
        if not layers:
            return None
        taps.detach_parameters(layers)  # the tapped parameters stay real: another use links the losses to them
        zeros = {n: outputs[n].new_zeros((size, *outputs[n].shape)) for n in layers}
        tapped = {f"{n}.{k}" for n, m in layers.items() for k, _ in m.named_parameters(recurse=False)}
        formed = {f"m.{n}": p.detach() for n, p in params.items() if n not in tapped}
        slots = _slots(wrapper, formed)

        def loss_of(p: dict[str, Tensor], t: dict[str, Tensor], example: Any):
            taps.given, taps.inputs = t, {}
            loss = functional_call(wrapper, {s: p[n] for s, n in slots.items()}, (view.one(example), batch_idx),
                                   strict=False, tie_weights=False)
            return loss, {n: taps.inputs[n] for n in layers}

        taps.calls, taps.on = {}, True
        with quiet_logging(module):
            (g_formed, g_taps), (losses, inputs) = vmap(
                grad_and_value(loss_of, argnums=(0, 1), has_aux=True), in_dims=(None, 0, view.in_dims(stacked)),
                randomness="different",
            )(formed, zeros, stacked)
        if any(taps.calls.get(n) != 1 for n in layers) and not taps.misfit:  # a tapped layer ran other than once
            return None
        elsewhere = set() if taps.misfit else _used_elsewhere(losses, layers)
    finally:
        taps.remove()  # before any rerun: its hooks and swapped parameters must not meet the next run's
    if taps.misfit:  # an output of another shape, dtype or device than the kept one's: tap anew (once; then form)
        outputs.clear()
        return None if fresh else user_step_tapped_grads(module, step, view, batch, batch_idx, params, tapping, outputs)
    if elsewhere:  # their pieces miss those uses: form their gradients, now and for the fit
        if isinstance(tapping, MutableMapping):
            for n in elsewhere:
                tapping.pop(n)
        else:
            tapping = {n: m for n, m in tapping.items() if n not in elsewhere}
        outputs.clear()
        return user_step_tapped_grads(module, step, view, batch, batch_idx, params, tapping, outputs) if tapping else None
    rows = {}
    for n, m in layers.items():
        names = {k: f"{n}.{k}" for k, _ in m.named_parameters(recurse=False)}
        rows[n] = LayerPieces(m, names, size)
        rows[n].take(inputs[n].detach(), g_taps[n].detach())
    formed = {n[2:]: g for n, g in g_formed.items()}
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    ref = next(iter(params.values()))
    grads = GhostGrads([(size, rows)], formed, shapes, size, ref.device, ref.dtype)
    return PerTupleResult(grads, losses.detach())


def _used_elsewhere(losses: Tensor, layers: Mapping[str, nn.Module]) -> set[str]:
    """The tapped layers whose parameters the losses depend on other than through the layer's own (detached) call."""
    if not losses.requires_grad:
        return set()
    owned = [(n, p) for n, m in layers.items() for p in m.parameters(recurse=False) if p.requires_grad]
    if not owned:
        return set()
    grads = torch.autograd.grad(losses.sum(), [p for _, p in owned], allow_unused=True)
    return {n for (n, _), g in zip(owned, grads) if g is not None}

