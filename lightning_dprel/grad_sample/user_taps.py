"""Ghost norms for a user's step with each example run alone: exact whatever the step does (Li et al. 2022, Eq. 4).

Each example's loss is the user's ``training_step`` on that example alone, inside ``torch.func.vmap``, as in
:mod:`~lightning_dprel.grad_sample.user_step`. For every ``nn.Linear`` that runs exactly once in the step, a zero "tap"
is added to its output and the vmapped ``grad`` is taken with respect to the tap, so it returns that example's output
gradient G_i ``[T, out]``; the layer's input A_i ``[T, in]`` comes back as an auxiliary output. Example i's weight
gradient is G_iᵀA_i (its own, since the example ran alone), of squared norm Σ (A_iA_iᵀ)⊙(G_iG_iᵀ), and the clipped
sum Σ_i c_i G_iᵀA_i is one contraction: no per-example weight gradient is formed. Every other trainable parameter (a
layer run twice, an embedding, a norm) gets its per-example gradient formed as in the vmap path, and so does a Linear
whose weight or bias is also used elsewhere: tied ones up front, other uses (a penalty) seen in the pass, where the
layer runs on its detached parameters so that only another use links the losses to them (the step is then redone).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from lightning_dprel.core.example_views import ExampleView
from lightning_dprel.grad_sample.base import PerTupleResult, TupleGradients
from lightning_dprel.grad_sample.sums import dropped_rows, per_tuple_norms, weighted_sum, zero_rows
from lightning_dprel.grad_sample.user_step import _Step, _slots, quiet_logging

__all__ = ["TappedGrads", "tapped_layers", "user_step_tapped_grads"]


class _Taps:
    """Forward hooks that add the current taps to the watched layers' outputs and keep their inputs."""

    def __init__(self, layers: Mapping[str, nn.Linear]) -> None:
        self.layers, self.taps, self.inputs, self.calls, self.outputs = dict(layers), None, {}, {}, {}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.layers.items()]
        self.detached: list[nn.Linear] = []

    def detach_parameters(self, names) -> None:
        """These layers compute on their detached weight and bias (until :meth:`remove`)."""
        for n in names:
            m = self.layers[n]
            bias = None if m.bias is None else m.bias.detach()
            m.__dict__["forward"] = partial(F.linear, weight=m.weight.detach(), bias=bias)
            self.detached.append(m)

    def _hook(self, name: str):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor | None:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.taps is None:  # the dry run: the output's shape and dtype, for the taps
                self.outputs[name] = output
                return output
            if name in self.taps:
                self.inputs[name] = inputs[0]
                return output + self.taps[name]
            return output
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        for m in self.detached:
            m.__dict__.pop("forward", None)
        self.detached = []


def tapped_layers(module: nn.Module, params: Mapping[str, Tensor]) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers (plain forward) whose trainable parameters are all in ``params`` and held by no other
    module or attribute (tied weights are formed; one module reached under two names is not tied), name → layer."""
    slots: dict[int, int] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                slots[id(p)] = slots.get(id(p), 0) + 1
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and "forward" not in m.__dict__:
            own = [(f"{name}.{k}", p) for k, p in m.named_parameters(recurse=False)]
            if own and all(k in params and slots[id(p)] == 1 for k, p in own):
                out[name] = m
    return out


class TappedGrads(TupleGradients):
    """Per-example norms and re-weighted sums: tapped layers from (A_i, G_i), the rest from formed gradients."""

    def __init__(self, rows: Mapping[str, tuple[nn.Linear, Tensor, Tensor]], formed: Mapping[str, Tensor], size: int) -> None:
        self.rows, self.formed, self.size = dict(rows), dict(formed), int(size)
        self._shapes = {f"{n}.{k}": tuple(p.shape) for n, (layer, _, _) in self.rows.items()
                        for k, p in layer.named_parameters(recurse=False)}
        self._shapes.update({n: tuple(t.shape[1:]) for n, t in self.formed.items()})
        self.names = tuple(self._shapes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def norms(self) -> Tensor:
        total = per_tuple_norms(self.formed).pow(2) if self.formed else torch.zeros(self.size)
        for layer, a, g in self.rows.values():
            rows, width = a.shape[1], a.shape[2] * g.shape[2]
            if rows == 1:  # one row: ‖gaᵀ‖ = ‖g‖‖a‖
                total = total + a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
            elif 2 * rows * rows < width:  # rows of one example (a sequence): ‖Σ_t g_t a_tᵀ‖² = Σ (AAᵀ)⊙(GGᵀ)
                total = total + (a @ a.transpose(1, 2) * (g @ g.transpose(1, 2))).sum((1, 2))
            else:  # long sequences, narrow layer: form this layer's per-example gradient (mixed ghost clipping)
                total = total + (g.transpose(1, 2) @ a).pow(2).sum((1, 2))
            if layer.bias is not None:
                total = total + g.sum(1).pow(2).sum(1)
        return total.sqrt()

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        out = dict(weighted_sum(self.formed, factors)) if self.formed else {}
        dropped = dropped_rows(factors)
        for name, (layer, a, g) in self.rows.items():
            gf = zero_rows(g, dropped) * factors.to(g.dtype).view(-1, 1, 1)
            out[f"{name}.weight"] = torch.einsum("bto,bti->oi", gf, zero_rows(a, dropped))
            if layer.bias is not None:
                out[f"{name}.bias"] = gf.sum((0, 1))
        return out


def user_step_tapped_grads(module: nn.Module, step: Any, view: ExampleView, batch: Any, batch_idx: int,
                           params: Mapping[str, Tensor], layers: Mapping[str, nn.Linear]) -> PerTupleResult | None:
    """Per-example norms and clipped sums of ``step(one example, batch_idx)`` with those Linear ``layers`` tapped that run
    exactly once per example (the others' gradients are formed); None when none does (the caller takes the vmap path).

    A layer whose parameters the step also uses elsewhere is removed from ``layers`` (for the rest of the fit) and the
    step is recomputed with its gradient formed."""
    size = view.size(batch)
    stacked = view.stacked(batch)
    wrapper = _Step(module, step)
    taps = _Taps(layers)
    tapping = layers
    try:
        with quiet_logging(module), torch.no_grad():  # a dry run of example 0: each layer once, its output's shape
            functional_call(wrapper, {}, (next(view.examples(batch)), batch_idx), strict=False)
        layers = {n: m for n, m in layers.items() if taps.calls.get(n) == 1}  # others: their gradients are formed
        if not layers:
            return None
        taps.detach_parameters(layers)  # the tapped parameters stay real: another use links the losses to them
        zeros = {n: taps.outputs[n].new_zeros((size, *taps.outputs[n].shape)) for n in layers}
        tapped = {f"{n}.{k}" for n, m in layers.items() for k, _ in m.named_parameters(recurse=False)}
        formed = {f"m.{n}": p.detach() for n, p in params.items() if n not in tapped}
        slots = _slots(wrapper, formed)

        def loss_of(p: dict[str, Tensor], t: dict[str, Tensor], example: Any):
            taps.taps, taps.inputs = t, {}
            loss = functional_call(wrapper, {s: p[n] for s, n in slots.items()}, (view.one(example), batch_idx),
                                   strict=False, tie_weights=False)
            return loss, {n: taps.inputs[n] for n in layers}

        taps.calls = {}
        with quiet_logging(module):
            (g_formed, g_taps), (losses, inputs) = vmap(
                grad_and_value(loss_of, argnums=(0, 1), has_aux=True), in_dims=(None, 0, view.in_dims(stacked)),
                randomness="different",
            )(formed, zeros, stacked)
        if any(taps.calls.get(n) != 1 for n in layers):  # the traced step ran a tapped layer other than once
            return None
        elsewhere = _used_elsewhere(losses, layers)
    finally:
        taps.taps = None
        taps.remove()
    if elsewhere:  # their G_iᵀA_i misses those uses: form their gradients, now and for the rest of the fit
        if isinstance(tapping, MutableMapping):
            for n in elsewhere:
                tapping.pop(n)
        else:
            tapping = {n: m for n, m in tapping.items() if n not in elsewhere}
        return user_step_tapped_grads(module, step, view, batch, batch_idx, params, tapping) if tapping else None
    rows = {n: (layers[n], inputs[n].reshape(size, -1, inputs[n].shape[-1]).detach(),
                g_taps[n].reshape(size, -1, g_taps[n].shape[-1]).detach()) for n in layers}
    grads = TappedGrads(rows, {n[2:]: g for n, g in g_formed.items()}, size)
    return PerTupleResult(grads, losses.detach())


def _used_elsewhere(losses: Tensor, layers: Mapping[str, nn.Linear]) -> set[str]:
    """The tapped layers whose parameters the losses depend on other than through the layer's own (detached) call."""
    if not losses.requires_grad:
        return set()
    owned = [(n, p) for n, m in layers.items() for p in m.parameters(recurse=False) if p.requires_grad]
    if not owned:
        return set()
    grads = torch.autograd.grad(losses.sum(), [p for _, p in owned], allow_unused=True)
    return {n for (n, _), g in zip(owned, grads) if g is not None}

