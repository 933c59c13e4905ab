"""The one protocol between per-example gradient providers and the DP optimizer (Algorithm 3, line 3 → line 4).

A provider (vmap in :mod:`~lightning_dprel.grad_sample.per_tuple`, ghost clipping in
:mod:`~lightning_dprel.grad_sample.ghost`, the per-example loop in :mod:`~lightning_dprel.grad_sample.loop`, stacked
copies in :mod:`~lightning_dprel.grad_sample.stacked`) returns a :class:`TupleGradients`: the per-example norms and
the re-weighted sum, which is all clipping, noising and accounting need. Methods reach the providers through one
entry point, :class:`~lightning_dprel.grad_sample.dispatch.GradSampler`.

References:
    Opacus ``grad_sample/`` (one provider per strategy behind one interface).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from lightning_dprel.grad_sample.sums import per_tuple_norms, weighted_sum

__all__ = ["TupleGradients", "MaterializedGrads", "PerTupleResult", "trainable_parameters", "uses_dropout"]


class TupleGradients:
    """What the private step needs from per-tuple gradients: their norms and their re-weighted sum (Algorithm 3, l. 4).

    :class:`MaterializedGrads` holds the gradients themselves; :class:`lightning_dprel.grad_sample.layers.GhostGrads` holds only
    what yields the norms and the sum (activations and output gradients, ghost clipping).
    """

    names: tuple[str, ...]
    size: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """name → the parameter's shape (without the leading B)."""
        raise NotImplementedError

    def norms(self) -> Tensor:
        """‖g(T_i)‖₂ over every parameter, ``[B]``."""
        raise NotImplementedError

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        """Σ_i factor_i·g(T_i) per parameter; a tuple with factor 0 contributes exactly 0 (even if non-finite)."""
        raise NotImplementedError


class MaterializedGrads(TupleGradients, Mapping):
    """Per-tuple gradients held as tensors name → ``[B, *param.shape]``; read like that mapping (``g[name]``, ``.items()``).

    Compared by identity (tensors have no single truth value).
    """

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, grads: Mapping[str, Tensor]) -> None:
        if not grads:
            raise ValueError("`grads` is empty; pass one per-tuple gradient tensor [B, *param.shape] per parameter.")
        self.grads = dict(grads)
        self.names = tuple(self.grads)
        sizes = {int(t.shape[0]) for t in self.grads.values()}
        if len(sizes) != 1:
            raise ValueError(f"All per-tuple gradients must share the leading batch size B, got sizes {sorted(sizes)}.")
        self.size = sizes.pop()

    def __getitem__(self, name: str) -> Tensor:
        return self.grads[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.grads)

    def __len__(self) -> int:
        return len(self.grads)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(t.shape[1:]) for n, t in self.grads.items()}

    def norms(self) -> Tensor:
        return per_tuple_norms(self.grads)

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        return dict(weighted_sum(self.grads, factors))


@dataclass
class PerTupleResult:
    """What every provider returns: the per-example :class:`TupleGradients` and the per-example losses ``[B]``."""

    grads: TupleGradients
    losses: Tensor

    @property
    def size(self) -> int:
        return int(self.losses.shape[0])


def trainable_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that get per-tuple gradients: those with ``requires_grad`` (LoRA adapters only, say)."""
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


def uses_dropout(module: nn.Module) -> bool:
    """True when ``module`` is in training mode and holds a dropout layer with p > 0."""
    if not module.training:
        return False
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training:
            return True
    return False
