"""Per-layer rules for per-example gradient norms and clipped sums (ghost clipping).

One registry and one tap serve the tuple path (:mod:`.ghost`) and the user-step path
(:mod:`.user_taps`). A tapped layer's output gets a zero added (its tap): the gradient with
respect to the tap is the layer's output gradient g, and the layer's input x is kept. A
:class:`LayerRule` turns (x, g), rows grouped by example (``[B, ...]``), into per-example pieces:
gradients it forms (a bias, a LayerNorm) and outer products G_i = Σ_p g_p a_pᵀ it keeps
(:class:`Outer`), of squared norm

    ‖G_i‖² = Σ_{p,q∈i} (a_p·a_q)(g_p·g_q)              (ghost norm, O(L²(d_in + d_out)))

(ids: "same token" for a_p·a_q), or formed when that is cheaper (mixed ghost clipping: formed when
2L² ≥ d_in·d_out, or when the Gram products cost more time than forming and G_i is at most 4× the memory of
its a and g). The clipped sum Σ_i f_i·G_i is one matmul with re-weighted g (book-keeping):
no second backward. :func:`register_layer_rule` adds a rule for any layer type; the parameters
of layers without one are formed (vmap).

References:
    Li, Tramèr, Liang, Hashimoto 2022 (ghost clipping); Bu, Mao, Xu 2022 (mixed ghost clipping);
    Bu, Wang, Zha, Karypis 2023 (book-keeping). Per-layer formulas and the registry as in Opacus
    ``grad_sample/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprel.grad_sample.base import TupleGradients

__all__ = ["LayerRule", "Outer", "register_layer_rule", "rule_for", "LayerPieces", "GhostGrads",
           "Taps", "watching"]


@dataclass(frozen=True)
class Outer:
    """Example i's gradient Σ_p g_p a_pᵀ, kept: ``a`` ``[B, L, d_in]`` (or ids ``[B, L]``), ``g``
    ``[B, L, d_out]``."""

    a: Tensor
    g: Tensor

    @property
    def ids(self) -> bool:
        return not self.a.is_floating_point()

    def cheaper_formed(self) -> bool:
        """Mixed ghost clipping: form G_i when 2L² ≥ d_in·d_out (never for ids), or when its ghost norm costs more time
        than forming (L²(d_in + d_out) ≥ 2·d_in·d_out multiply-adds) and G_i takes at most 4× the memory of (a, g)."""
        if self.ids:
            return False
        rows, d_in, d_out = self.a.shape[1], self.a.shape[-1], self.g.shape[-1]
        slower = rows**2 * (d_in + d_out) >= 2 * d_in * d_out and d_in * d_out <= 4 * rows * (d_in + d_out)
        return slower or 2 * rows**2 >= d_in * d_out

    def formed(self) -> Tensor:
        return torch.einsum("blo,bli->boi", self.g, self.a)

    def norms_sq(self) -> Tensor:
        a, g = self.a, self.g
        if a.shape[1] == 1 and not self.ids:  # one row per example: ‖g aᵀ‖² = ‖a‖²‖g‖², no Gram matrices
            return _sq_norms(a, a.shape[0]) * _sq_norms(g, g.shape[0])
        if self.ids:
            same = (a.unsqueeze(2) == a.unsqueeze(1)).to(g.dtype)
        else:
            same = torch.bmm(a, a.transpose(1, 2))
        return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

    def summed(self, gf: Tensor, a: Tensor, shape: tuple[int, ...]) -> Tensor:
        """Σ_i Σ_p gf_p a_pᵀ for re-weighted output gradients ``gf``, shaped as the parameter."""
        total = torch.zeros(shape, dtype=gf.dtype, device=gf.device)
        if self.ids:
            return total.index_add_(0, a.reshape(-1), gf.reshape(-1, gf.shape[-1]))
        return total.addmm_(gf.reshape(-1, gf.shape[-1]).t(), a.reshape(-1, a.shape[-1]))


Pieces = Mapping[str, "Tensor | Outer"]  # local parameter name → formed [B, *shape], or an Outer


@dataclass(frozen=True)
class LayerRule:
    """How a layer type's per-example gradients come from its input ``x`` and output gradient
    ``g`` (both ``[B, ...]``: rows grouped by example).

    Attributes:
        pieces: ``(layer, x, g) → {local parameter name: formed [B, *shape] or Outer}``.
        applies: whether this layer's configuration is covered (not an Embedding with max_norm).
        broadcast_rows: a ``[1, ...]`` input may be broadcast onto every row (position ids).
        user_step: tapped on a user's step too; else vmap forms its gradients there (the
            built-in LayerNorm rule: its per-example gradients are as small as its pieces).
    """

    pieces: Callable[[nn.Module, Tensor, Tensor], Pieces]
    applies: Callable[[nn.Module], bool] = lambda module: True
    broadcast_rows: bool = False
    user_step: bool = True


_RULES: dict[type, LayerRule] = {}
_BUILT_IN: set[type] = set()  # filled after the built-in rules are registered


def register_layer_rule(layer_type: type, pieces: Callable[[nn.Module, Tensor, Tensor], Pieces],
                        *, applies: Callable[[nn.Module], bool] | None = None,
                        broadcast_rows: bool = False, user_step: bool = True) -> LayerRule:
    """Cover ``layer_type`` by ghost clipping with ``pieces(layer, x, g)`` (see
    :class:`LayerRule`); returns the rule."""
    if layer_type in _BUILT_IN:
        raise ValueError(f"{layer_type.__name__} has the library's own rule; register a subclass instead.")
    rule = LayerRule(pieces, applies or (lambda module: True), broadcast_rows, user_step)
    _RULES[layer_type] = rule
    return rule


def rule_for(module: nn.Module, *, inherited: bool = False) -> LayerRule | None:
    """The rule covering ``module``: registered for its own class, or (``inherited``) for a class
    whose ``forward`` it runs unchanged; None when there is none or it does not apply."""
    classes = type(module).__mro__ if inherited else (type(module),)
    cls = next((c for c in classes if c in _RULES), None)
    if cls is None or type(module).forward is not cls.forward:
        return None
    rule = _RULES[cls]
    return rule if rule.applies(module) else None


def _linear(m: nn.Linear, x: Tensor, g: Tensor) -> Pieces:
    a, gb = x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
    return {"weight": Outer(a, gb), "bias": gb.sum(1)}


def _embedding(m: nn.Embedding, ids: Tensor, g: Tensor) -> Pieces:
    ids, gb = ids.reshape(ids.shape[0], -1), g.reshape(g.shape[0], -1, g.shape[-1])
    if m.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
        gb = gb * (ids != m.padding_idx).unsqueeze(-1).to(gb.dtype)
    return {"weight": Outer(ids, gb)}


def _layer_norm(m: nn.LayerNorm, x: Tensor, g: Tensor) -> Pieces:
    shape = tuple(m.normalized_shape)
    xhat = F.layer_norm(x, shape, eps=m.eps).reshape((x.shape[0], -1) + shape)
    gb = g.reshape((g.shape[0], -1) + shape)
    return {"weight": (gb * xhat).sum(1), "bias": gb.sum(1)}


def _plain_embedding(m: nn.Embedding) -> bool:
    return m.max_norm is None and not m.sparse and not m.scale_grad_by_freq


register_layer_rule(nn.Linear, _linear)
register_layer_rule(nn.Embedding, _embedding, applies=_plain_embedding, broadcast_rows=True)
register_layer_rule(nn.LayerNorm, _layer_norm, user_step=False)
_BUILT_IN.update(_RULES)


def _work_dtype(t: Tensor) -> torch.dtype:
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def _clean(t: Tensor, dropped: Tensor | None) -> Tensor:
    """``t`` with dropped examples' rows zeroed (0·NaN is NaN), without a device sync; ``t`` itself if None."""
    return t if dropped is None else torch.where(dropped.reshape((-1,) + (1,) * (t.dim() - 1)), 0.0, t)


def _dropped(factors: Tensor) -> Tensor | None:
    """The rows with factor 0, or None when there are none on CPU (no pass over the pieces; a GPU is not synced)."""
    dropped = factors == 0
    return None if factors.device.type == "cpu" and not bool(dropped.any()) else dropped


def _sq_norms(t: Tensor, size: int) -> Tensor:
    """Each example's squared norm of a formed ``[B, ...]`` piece, in float64 (one pass: no float64 copy of ``t``)."""
    return torch.linalg.vector_norm(t.reshape(size, -1), dim=1).double().pow(2)


def _add(out: dict[str, Tensor], name: str, t: Tensor) -> None:
    out[name] = out[name] + t if name in out else t


class LayerPieces:
    """One tapped layer's pieces over ``size`` examples: formed gradients, kept outer products."""

    def __init__(self, module: nn.Module, names: Mapping[str, str], size: int) -> None:
        self.module, self.names, self.size = module, dict(names), int(size)  # local → param name
        self.formed: dict[str, Tensor] = {}
        self.kept: dict[str, Outer] = {}

    def take(self, x: Tensor, g: Tensor) -> None:
        """Consume the layer's input ``x`` and output gradient ``g`` (leading: the rows)."""
        dt, rows = _work_dtype(g), (self.size, -1)
        x = x.reshape(rows + tuple(x.shape[1:]))
        x = x.to(dt) if x.is_floating_point() else x
        g = g.to(dt).reshape(rows + tuple(g.shape[1:]))
        for local, piece in rule_for(self.module, inherited=True).pieces(self.module, x, g).items():
            if local not in self.names:
                continue
            if isinstance(piece, Outer) and piece.cheaper_formed():
                piece = piece.formed()
            if isinstance(piece, Outer):
                self.kept[local] = piece
            else:
                _add(self.formed, local, piece)

    def norms_sq(self) -> Tensor | None:
        """Σ over this layer's parameters of ‖G_i‖², ``[B]`` (None: no output gradient came)."""
        parts = [_sq_norms(t, self.size) for t in self.formed.values()]
        parts += [o.norms_sq() for o in self.kept.values()]
        return torch.stack([p.double() for p in parts]).sum(0) if parts else None

    def weighted_sum(self, factors: Tensor, dropped: Tensor | None) -> dict[str, Tensor]:
        """Parameter name → Σ_i f_i·G_i (book-keeping for kept pieces); ``dropped``: f_i = 0 (None: no row)."""
        out = {self.names[k]: torch.tensordot(factors.to(t.dtype), _clean(t, dropped), dims=1)
               for k, t in self.formed.items()}
        for k, o in self.kept.items():
            gf = _clean(o.g, dropped) * factors.to(o.g.dtype).reshape(-1, 1, 1)
            a = o.a if o.ids else _clean(o.a, dropped)
            _add(out, self.names[k], o.summed(gf, a, tuple(getattr(self.module, k).shape)))
        return out


class GhostGrads(TupleGradients):
    """Per-example norms and re-weighted sums from tapped layers' pieces (``chunks``: per run of
    consecutive examples, their count and layer name → pieces) and from the formed gradients
    ``[B, *shape]`` of every other parameter; ``dtype``: the norms'."""

    def __init__(self, chunks: list[tuple[int, dict[str, LayerPieces]]],
                 formed: Mapping[str, Tensor], shapes: Mapping[str, tuple[int, ...]], size: int,
                 device: torch.device, dtype: torch.dtype = torch.float64) -> None:
        self.chunks, self.formed, self._shapes = chunks, dict(formed), dict(shapes)
        self.size, self.device, self.dtype = int(size), device, dtype
        self.names = tuple(self._shapes)
        self._norms: Tensor | None = None

    @property
    def rows(self) -> dict[str, list[LayerPieces]]:
        """Tapped layer name → its pieces, one per chunk."""
        out: dict[str, list[LayerPieces]] = {}
        for _, layers in self.chunks:
            for name, pieces in layers.items():
                out.setdefault(name, []).append(pieces)
        return out

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def _zeros(self, count: int) -> Tensor:
        return torch.zeros(count, dtype=torch.float64, device=self.device)

    def norms(self) -> Tensor:
        if self._norms is None:
            parts = []
            for count, layers in self.chunks:
                sq = [s for s in (p.norms_sq() for p in layers.values()) if s is not None]
                parts.append(torch.stack(sq).sum(0) if sq else self._zeros(count))
            sq = torch.cat(parts) if parts else self._zeros(self.size)
            for t in self.formed.values():
                sq = sq + _sq_norms(t, self.size).to(sq.device)
            # a Gram sum of a ~0 gradient can round below 0 (NaN stays NaN)
            self._norms = sq.clamp(min=0.0).sqrt().to(self.dtype)
        return self._norms

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        dropped = _dropped(factors)
        out: dict[str, Tensor] = {}
        start = 0
        for count, layers in self.chunks:
            part = slice(start, start + count)
            for pieces in layers.values():
                for name, t in pieces.weighted_sum(factors[part], None if dropped is None else dropped[part]).items():
                    _add(out, name, t)
            start += count
        for name, t in self.formed.items():
            out[name] = torch.tensordot(factors.to(t.dtype), _clean(t, dropped), dims=1)
        zeros = torch.zeros((), dtype=factors.dtype, device=self.device)  # no output gradient came
        return {name: out[name] if name in out else zeros.expand(shape).clone()
                for name, shape in self._shapes.items()}  # in the parameters' order


Check = Callable[[str, int, object, object], tuple]
Sink = Callable[[str, Tensor, Tensor], None]


class Taps:
    """Forward hooks on the tapped layers. Each call is counted (and passed to ``check``); while
    :attr:`on`, the output gets its tap added and the input is kept. A tap is ``given[name]`` (a
    zero the caller differentiates, e.g. inside ``vmap``) or made per call, with its output
    gradient handed to ``sink(name, x, g)`` by :meth:`backward`."""

    def __init__(self, layers: Mapping[str, nn.Module], *, check: Check | None = None,
                 sink: Sink | None = None) -> None:
        self.layers, self.check, self.sink = dict(layers), check, sink
        self.on, self.given, self.misfit = False, None, False  # given: name → tap, or None (made per call)
        self.calls: dict[str, int] = {}
        self.inputs: dict[str, Tensor] = {}
        self.outputs: dict[str, Tensor] = {}  # with taps off: the last output (the taps' shapes)
        self.made: list[Tensor] = []
        self._swapped: dict[int, tuple[nn.Module, dict[str, Tensor]]] = {}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.layers.items()]

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            self.calls[name] = self.calls.get(name, 0) + 1
            x = args[0] if args else None
            if self.check is not None:
                x, output = self.check(name, self.calls[name], x, output)
            if not self.on:
                self.outputs[name] = output
                return output
            if self.given is not None:  # the caller differentiates its taps and reads the inputs
                if name not in self.given:
                    return output
                self.inputs[name] = x.detach()
                tap = self.given[name]
                if output.shape != tap.shape or output.dtype != tap.dtype or output.device != tap.device:  # not added
                    self.misfit = True
                    return output
                return output + tap
            leaf, saved = output.new_zeros((), requires_grad=True), x.detach()
            tap = leaf.expand(output.shape)  # expanded: no memory per row
            tap.register_hook(lambda g: self.sink(name, saved, g.detach()))
            self.made.append(leaf)
            return output + tap
        return hook

    def backward(self, loss: Tensor, *, retain_graph: bool = False) -> None:
        """Differentiate ``loss`` down to the taps made in the forward (each sink gets its layer's
        output gradient); no parameter gradient is computed."""
        if self.made and loss.requires_grad:
            torch.autograd.grad(loss, self.made, allow_unused=True, retain_graph=retain_graph)

    def detach_parameters(self, names: Iterable[str]) -> None:
        """These layers compute on their detached parameters (until :meth:`remove`): only another
        use of the parameters links the losses to them."""
        for n in names:
            self.handles.append(self.layers[n].register_forward_pre_hook(self._swap))
            self.handles.append(self.layers[n].register_forward_hook(self._restore))

    def _swap(self, module: nn.Module, args: tuple) -> None:
        own = {k: p for k, p in module._parameters.items() if p is not None}
        self._swapped[id(module)] = (module, own)
        module._parameters.update({k: p.detach() for k, p in own.items()})

    def _restore(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        module._parameters.update(self._swapped.pop(id(module))[1])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        for module, own in self._swapped.values():  # a step that raised inside a detached layer
            module._parameters.update(own)
        self.handles, self._swapped = [], {}


@contextlib.contextmanager
def watching(modules: Iterable[nn.Module],
             hook: Callable[[nn.Module, tuple, object], None]) -> Iterator[None]:
    """``hook(module, args, output)`` after every forward of ``modules`` within the block."""
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
