"""Ghost clipping of a user's step on row examples: per-example norms and the clipped sum without forming per-example
gradients (book-keeping, Bu et al. 2022; Li et al. 2022, Eq. 4 for a linear layer on rows).

Exact only where every trainable parameter is an ``nn.Linear``'s, each such layer runs once per step on an input whose
row i is example i's ``[B, in]``, every other leaf module is row-wise (activations, dropout), and the loss is the mean or
the sum of the examples' own (the privacy callback checks it on the first batch). Then example i's gradient of the
weight is s·g_iᵀa_i (s = B for a mean, 1 for a sum), whose norm is s‖g_i‖‖a_i‖, and Σ_i c_i·s·g_iᵀa_i is one matmul.
Anything else raises :class:`GhostUnsupported`, and the caller takes the vmap path, which needs none of this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from lightning_dprel.grad_sample.base import TupleGradients
from lightning_dprel.grad_sample.ghost import GhostUnsupported

__all__ = ["ROW_WISE", "row_ghost_reason", "LinearRowGrads", "capture_linear_rows"]

#: Leaf modules that map row i of their input to row i of their output and hold no trainable parameter of their own.
ROW_WISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Mish, nn.Identity,
            nn.Dropout, nn.Linear)


def row_ghost_reason(module: nn.Module) -> str | None:
    """Why ghost clipping is not exact for ``module``'s trainable parameters (None: it is, given rows as examples)."""
    linear_params = {id(p) for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False)}
    for name, p in module.named_parameters():
        if p.requires_grad and id(p) not in linear_params:
            return f"the trainable parameter `{name}` is not an nn.Linear's"
    for name, m in module.named_modules():
        if next(m.children(), None) is None and m is not module and not isinstance(m, ROW_WISE):
            return f"`{name}` ({type(m).__name__}) is not a row-wise layer"
    return None


class LinearRowGrads(TupleGradients):
    """Per-example norms and re-weighted sums of the ``nn.Linear`` weights from their inputs a and output gradients g."""

    def __init__(self, rows: Mapping[str, tuple[nn.Linear, Tensor, Tensor]], scale: float, size: int) -> None:
        self.rows, self.scale, self.size = dict(rows), float(scale), int(size)
        self.names = tuple(f"{prefix}.{kind}" for prefix, (layer, _, _) in self.rows.items()
                           for kind in ("weight", "bias") if getattr(layer, kind) is not None)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{prefix}.{kind}": tuple(getattr(layer, kind).shape) for prefix, (layer, _, _) in self.rows.items()
                for kind in ("weight", "bias") if getattr(layer, kind) is not None}

    def norms(self) -> Tensor:
        total = None
        for layer, a, g in self.rows.values():
            g2 = g.double().pow(2).sum(1)
            sq = a.double().pow(2).sum(1) * g2 + (g2 if layer.bias is not None else 0.0)
            total = sq if total is None else total + sq
        return (self.scale * total.sqrt()).to(torch.float32)

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        out, dropped = {}, bool((factors == 0).any())
        for prefix, (layer, a, g) in self.rows.items():
            w = (factors.to(g.dtype) * self.scale).unsqueeze(1)
            gw = g * w
            if dropped:  # a dropped example (non-finite norm, factor 0) adds exactly 0, even if non-finite
                keep = (factors != 0).unsqueeze(1)
                gw = torch.where(keep, gw, torch.zeros_like(gw))
                a = torch.where(keep, a, torch.zeros_like(a))
            out[f"{prefix}.weight"] = gw.T @ a
            if layer.bias is not None:
                out[f"{prefix}.bias"] = gw.sum(0)
        return out


@contextlib.contextmanager
def capture_linear_rows(module: nn.Module, size: int) -> Iterator[dict[str, list]]:
    """Record, for every ``nn.Linear`` of ``module`` with trainable parameters, its input and output in the body."""
    seen: dict[str, list] = {}
    handles = []

    def hook(name: str):
        def record(layer: nn.Module, inputs: tuple, output: Tensor) -> None:
            a = inputs[0]
            if name in seen:
                raise GhostUnsupported(f"`{name}` ran twice in one step (shared weights): its rows are not one example's")
            if a.dim() != 2 or a.shape[0] != size:
                raise GhostUnsupported(f"`{name}` got an input of shape {tuple(a.shape)}, not one row per example [{size}, in]")
            seen[name] = [layer, a.detach(), output]
        return record

    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and any(p.requires_grad for p in m.parameters(recurse=False)):
            handles.append(m.register_forward_hook(hook(name)))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def linear_row_grads(seen: dict[str, list], loss: Tensor, scale: float, size: int) -> LinearRowGrads:
    """The output gradients of the captured layers (one ``autograd.grad`` of the batch loss), as :class:`LinearRowGrads`."""
    names = list(seen)
    outputs = [seen[n][2] for n in names]
    grads = torch.autograd.grad(loss, outputs, allow_unused=True)
    rows = {n: (seen[n][0], seen[n][1], (torch.zeros_like(o) if g is None else g).detach()) for n, o, g in zip(names, outputs, grads)}
    return LinearRowGrads(rows, scale, size)
