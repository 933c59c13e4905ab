"""Per-tuple gradient norms and clipped sums without per-tuple gradients (ghost clipping for tuples, Alg. 3 l. 3-4).

The private step needs only ‖g(T_i)‖ and Σ_i f_i·g(T_i). One forward of all B·(2+k) node slots and one backward
give each covered layer its inputs a and output gradients g; tuple i owns the L = (2+k)·T rows of its slots
(T positions per slot: tokens, or 1 for dense features). For a linear layer G_i = Σ_{p∈i} g_p a_pᵀ, so

    ‖G_i‖² = Σ_{p,q∈i} (a_p·a_q)(g_p·g_q)                                     (ghost norm, O(L²(d_in + d_out)))

or G_i is formed directly (O(L·d_in·d_out)), whichever is cheaper (mixed ghost clipping: ghost when 2L² < d_in·d_out).
Embeddings use the same Gram with "same token" in place of a_p·a_q; LayerNorm and biases are formed directly (small).
The clipped sum Σ_p f_{i(p)} g_p a_pᵀ is one matmul with re-weighted output gradients (book-keeping): no second
backward. The backward asks autograd for the gradient of one zero scalar tapped onto every covered layer's output,
so no parameter gradient is computed twice. Parameters of other layers fall back to :func:`per_tuple_grads` (vmap).

Exact when (a) every covered layer is called once per forward, (b) row r of its input and output is node slot r,
from slot r's inputs only (or a ``[1, ...]`` index broadcast onto all slots: BERT's position ids), and (c) nothing after
a covered layer mixes rows. Shapes cannot show (b), (c) (T = B·(2+k) positions look like slots), so they are declared:
:func:`ghost_safe` (library encoders, a lone covered layer, a class setting ``ghost_safe = True`` itself). ``"auto"``
(:class:`~lightning_dprel.grad_sample.dispatch.GradSampler`) takes ghost only then and when every parameter is covered (:attr:`GhostPlan.exact`), else vmap (also after a failed
check). Checks: a second call raises :class:`GhostUnsupported`; a layer whose rows are not B·(2+k) moves to vmap; on an
undeclared encoder (forced ghost) a second backward with per-tuple loss weights c must scale each covered row by its
tuple's c (else :class:`GhostUnsupported`). Mixing raw inputs before the first covered layer is not detectable.

References:
    Li, Tramèr, Liang, Hashimoto 2022 (ghost clipping); Bu, Mao, Xu 2022 (mixed ghost clipping, the 2T² < pd rule);
    Bu, Wang, Zha, Karypis 2023 (book-keeping: the clipped sum from the first pass's output gradients).
    Per-layer formulas as in Opacus ``grad_sample/linear.py``, ``embedding.py``, ``layer_norm.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprel.encoders import MLPEncoder, ResidualAdapter, TextEncoder
from lightning_dprel.grad_sample.per_tuple import (
    PerTupleResult, TupleGradients, check_per_tuple_args, head_for_one, per_tuple_grads, trainable_parameters,
)
from lightning_dprel.grad_sample.sums import weighted_sum

__all__ = ["GhostUnsupported", "GhostPlan", "GhostGrads", "ghost_safe", "ghost_plan", "ghost_grads"]
_TEXT_MODELS = ("bert", "roberta", "xlm-roberta")  # each sequence on its own, each layer called once


class GhostUnsupported(RuntimeError):
    """The encoder cannot use the ghost path (it mixes node slots, or calls a covered layer twice)."""


class _NotSlotwise(Exception):
    """A covered layer (``args[0]``: its name) was called on rows that are not the node slots (its parameters: vmap)."""


@dataclass
class GhostPlan:
    """Which trainable parameters the ghost path covers (by owning layer) and which fall back to vmap."""

    modules: dict[str, nn.Module] = field(default_factory=dict)  # module name → covered layer
    names: dict[tuple[str, str], str] = field(default_factory=dict)  # (module name, local name) → parameter name
    fallback: dict[str, Tensor] = field(default_factory=dict)  # parameter name → parameter (vmap)
    reason: str | None = None  # why the ghost path cannot be used at all
    declared: bool = False  # the encoder is declared slot-wise (:func:`ghost_safe`)

    @property
    def usable(self) -> bool:
        return self.reason is None and bool(self.modules)

    @property
    def exact(self) -> bool:
        """Ghost is provably exact here: declared encoder, every parameter covered (what ``"auto"`` requires)."""
        return self.usable and self.declared and not self.fallback


def _mixes_rows(m: nn.Module) -> bool:
    if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
        return True
    return any(c.__name__ == "MessagePassing" for c in type(m).__mro__)


def _covered(m: nn.Module) -> bool:
    if type(m) in (nn.Linear, nn.LayerNorm):
        return True
    return type(m) is nn.Embedding and m.max_norm is None and not m.sparse and not m.scale_grad_by_freq


def ghost_safe(encoder: nn.Module) -> bool:
    """Whether ``encoder`` is declared to meet the exactness conditions (a)-(c) of this module's docstring."""
    cls = type(encoder)
    if cls.__dict__.get("ghost_safe") is True or cls in (MLPEncoder, ResidualAdapter) or _covered(encoder):
        return True
    return cls is TextEncoder and getattr(getattr(encoder.model, "config", None), "model_type", None) in _TEXT_MODELS


def ghost_plan(encoder: nn.Module, params: Mapping[str, Tensor] | None = None) -> GhostPlan:
    """Assign each trainable parameter to the ghost path (owned by one covered layer) or to the vmap fallback."""
    params = trainable_parameters(encoder) if params is None else params
    mixing = [name or type(m).__name__ for name, m in encoder.named_modules() if _mixes_rows(m)]
    plan = GhostPlan(declared=ghost_safe(encoder))
    if mixing:
        plan.reason = f"layers {mixing[:3]} mix node slots (BatchNorm in training mode or message passing)"
    owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mname, m in encoder.named_modules(remove_duplicate=False):
        for lname, p in m.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((mname, m, lname))
    for name, p in params.items():
        own = {(o[0], o[2]): o for o in owners.get(id(p), [])}
        if len(own) == 1 and _covered(next(iter(own.values()))[1]):
            mname, m, lname = next(iter(own.values()))
            plan.modules[mname] = m
            plan.names[(mname, lname)] = name
        else:
            plan.fallback[name] = p
    return plan


def demote(plan: GhostPlan, module_name: str) -> None:
    """Move a layer's parameters from the ghost path to the vmap fallback (the plan remembers it)."""
    module = plan.modules.pop(module_name)
    for (mname, lname), pname in list(plan.names.items()):
        if mname == module_name:
            plan.fallback[pname] = getattr(module, lname)
            del plan.names[(mname, lname)]


class _Tap(torch.autograd.Function):
    """Identity on a layer's output whose backward hands the output gradient to ``sink`` (and a zero to ``dummy``)."""

    @staticmethod
    def forward(ctx, output: Tensor, dummy: Tensor, sink: Callable[[Tensor], None]) -> Tensor:  # type: ignore[override]
        ctx.sink, ctx.dummy_meta = sink, (dummy.dtype, dummy.device)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        ctx.sink(grad.detach())
        dtype, device = ctx.dummy_meta
        return grad, torch.zeros((), dtype=dtype, device=device), None


def _work_dtype(t: Tensor) -> torch.dtype:
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


class _Layer:
    """One covered layer's per-tuple pieces within one chunk: formed gradients, or (a, g) kept for ghost norms."""

    def __init__(self, module: nn.Module, names: dict[str, str], tuples: int) -> None:
        self.module, self.names, self.tuples = module, names, tuples  # names: local → parameter name
        self.formed: dict[str, Tensor] = {}
        self.kept: tuple[Tensor, Tensor] | None = None  # (a [B, L, d_in] or ids [B, L], g [B, L, d_out])

    def _add(self, local: str, value: Tensor) -> None:
        if local in self.names:
            self.formed[local] = self.formed[local] + value if local in self.formed else value

    def take(self, x: Tensor, g: Tensor) -> None:
        """Consume the layer's one call: input ``x`` and output gradient ``g`` (leading dimension: the B·(2+k) slots)."""
        m, b = self.module, self.tuples
        dt = _work_dtype(g)
        if isinstance(m, nn.Embedding):
            ids, gb = x.reshape(b, -1), g.reshape(b, -1, g.shape[-1]).to(dt)
            if m.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
                gb = gb * (ids != m.padding_idx).unsqueeze(-1).to(dt)
            self.kept = (ids, gb)
            return
        if isinstance(m, nn.LayerNorm):
            shape = tuple(m.normalized_shape)
            xhat = F.layer_norm(x.to(dt), shape, eps=m.eps).reshape((b, -1) + shape)
            gb = g.to(dt).reshape((b, -1) + shape)
            self._add("weight", (gb * xhat).sum(1))
            self._add("bias", gb.sum(1))
            return
        xb, gb = x.to(dt).reshape(b, -1, x.shape[-1]), g.to(dt).reshape(b, -1, g.shape[-1])
        self._add("bias", gb.sum(1))
        if "weight" not in self.names:
            return
        length = xb.shape[1]
        if 2 * length * length < xb.shape[-1] * gb.shape[-1]:
            self.kept = (xb, gb)  # ghost norm + book-keeping
        else:
            self._add("weight", torch.einsum("blo,bli->boi", gb, xb))

    def norms_sq(self) -> Tensor:
        """Σ over this layer's parameters of ‖G_i‖², ``[B]``."""
        total = None
        for local, t in self.formed.items():
            part = t.reshape(self.tuples, -1).pow(2).sum(1)
            total = part if total is None else total + part
        if self.kept is not None:
            a, gg = self.kept
            same = (a.unsqueeze(2) == a.unsqueeze(1)).to(gg.dtype) if isinstance(self.module, nn.Embedding) else torch.bmm(a, a.transpose(1, 2))
            part = (same * torch.bmm(gg, gg.transpose(1, 2))).sum((1, 2))
            total = part if total is None else total + part
        return total

    def weighted_sum(self, factors: Tensor, dropped: Tensor) -> dict[str, Tensor]:
        """name → Σ_i f_i·G_i over this chunk's tuples (book-keeping for the kept pieces); ``dropped``: f_i = 0 rows."""

        def clean(t: Tensor) -> Tensor:  # 0·NaN is NaN: a dropped tuple's rows are zeroed, without a device sync
            return torch.where(dropped.reshape((-1,) + (1,) * (t.dim() - 1)), 0.0, t)

        out = {self.names[local]: torch.tensordot(factors.to(t.dtype), clean(t), dims=([0], [0])) for local, t in self.formed.items()}
        if self.kept is None:
            return out
        (x, g), name, weight = self.kept, self.names["weight"], self.module.weight
        total = torch.zeros(weight.shape, dtype=g.dtype, device=weight.device)
        gf = clean(g) * factors.to(g.dtype).reshape(-1, 1, 1)
        if isinstance(self.module, nn.Embedding):
            total.index_add_(0, x.reshape(-1), gf.reshape(-1, gf.shape[-1]))
        else:
            total.addmm_(gf.reshape(-1, gf.shape[-1]).t(), clean(x).reshape(-1, x.shape[-1]))
        out[name] = out[name] + total if name in out else total
        return out


class GhostGrads(TupleGradients):
    """Per-tuple norms and re-weighted sums from the ghost pass (plus the vmap fallback's formed gradients)."""

    def __init__(self, chunks: list[tuple[int, list[_Layer]]], fallback: dict[str, Tensor], shapes: dict[str, tuple[int, ...]],
                 size: int, device: torch.device) -> None:
        self.chunks, self.fallback, self._shapes, self.size, self.device = chunks, fallback, shapes, size, device
        self.names = tuple(shapes)
        self._norms: Tensor | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def norms(self) -> Tensor:
        if self._norms is None:
            parts = []
            for _, layers in self.chunks:
                sq = [s.double() for s in (layer.norms_sq() for layer in layers) if s is not None]
                parts.append(torch.stack(sq).sum(0) if sq else torch.zeros(layers[0].tuples, dtype=torch.float64, device=self.device))
            sq = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=self.device)
            if self.fallback:
                extra = torch.stack([t.reshape(self.size, -1).double().pow(2).sum(1) for t in self.fallback.values()]).sum(0)
                sq = extra if not parts else sq + extra.to(sq.device)
            self._norms = sq.clamp(min=0.0).sqrt()  # a Gram sum of a ~0 gradient can round below 0 (NaN stays NaN)
        return self._norms

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        dropped = factors == 0
        out: dict[str, Tensor] = {}
        for start, layers in self.chunks:
            stop = start + (layers[0].tuples if layers else 0)
            for layer in layers:
                for name, t in layer.weighted_sum(factors[start:stop], dropped[start:stop]).items():
                    out[name] = out[name] + t if name in out else t
        if self.fallback:
            out.update(weighted_sum(self.fallback, factors))
        for name, shape in self._shapes.items():  # a layer that got no output gradient (unused) contributes 0
            if name not in out:
                out[name] = torch.zeros(shape, dtype=factors.dtype, device=self.device)
        return out


def _chunk_pass(encoder: nn.Module, plan: GhostPlan, inputs: Mapping[str, Tensor], head: Callable[..., Tensor],
                head_args: tuple[Tensor, ...], params: Mapping[str, Tensor]) -> tuple[list[_Layer], Tensor]:
    """One forward of the chunk's B·(2+k) slots, one backward to a tapped zero scalar (+ the check's, undeclared)."""
    b, width = next(iter(inputs.values())).shape[:2]
    rows = b * width
    flat = {k: v.reshape((rows,) + tuple(v.shape[2:])) for k, v in inputs.items()}
    layers: dict[str, _Layer] = {}
    for mname, m in plan.modules.items():
        local = {lname: pname for (mn, lname), pname in plan.names.items() if mn == mname}
        layers[mname] = _Layer(m, local, b)
    ref = next(iter(params.values()))
    dummy = torch.zeros((), dtype=ref.dtype if ref.is_floating_point() else torch.float32, device=ref.device, requires_grad=True)
    calls: dict[str, int] = {}
    first: dict[str, Tensor] | None = None if plan.declared or b < 2 else {}  # backward 1's row gradients (the check)
    weights: list[Tensor] = []  # the check's per-tuple loss weights c (set for its backward)
    mixed: list[str] = []

    def hook_for(mname: str) -> Callable:
        layer = layers[mname]

        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            calls[mname] = calls.get(mname, 0) + 1
            if calls[mname] > 1:  # condition (a)
                raise GhostUnsupported(f"layer {mname!r} is called {calls[mname]} times in one forward; ghost clipping needs "
                                       "each covered layer called once; use per_tuple_mode='vmap'.")
            x = args[0] if args else None
            if isinstance(module, nn.Embedding) and isinstance(x, Tensor) and x.shape[0] == 1 < rows:
                x, output = x.expand((rows,) + tuple(x.shape[1:])), output.expand((rows,) + tuple(output.shape[1:]))
            if not isinstance(x, Tensor) or x.shape[0] != rows or not isinstance(output, Tensor):
                raise _NotSlotwise(mname)
            saved = x.detach()

            def sink(g: Tensor) -> None:
                if weights:  # the check: tuple j's rows must get c_j × backward 1's gradient, nothing from other tuples
                    want = first.pop(mname).double() * weights[0].repeat_interleave(width).reshape((-1,) + (1,) * (g.dim() - 1))
                    tol = min(1e3 * torch.finfo(g.dtype).eps, 1e-2) * torch.nan_to_num(want.abs()).max()
                    if torch.nan_to_num((g.double() - want).abs()).max() > tol:
                        mixed.append(mname)
                    return
                layer.take(saved, g)
                if first is not None:
                    first[mname] = g

            return _Tap.apply(output, dummy, sink)

        return hook

    handles = [m.register_forward_hook(hook_for(mname)) for mname, m in plan.modules.items()]
    try:
        with torch.enable_grad():
            h = encoder(**flat)
            h = h.reshape((b, width) + tuple(h.shape[1:]))
            losses = head(h, *head_args)
            if losses.shape != (b,):
                raise ValueError(
                    f"The tuple head must broadcast over tuples (h [B, 2+k, d] → losses [B] = [{b}]), got "
                    f"{tuple(losses.shape)}; use lightning_dprel.methods.relational.losses.tuple_loss or per_tuple_mode='vmap'."
                )
            if losses.requires_grad:
                torch.autograd.grad(losses.sum(), [dummy], allow_unused=True, retain_graph=first is not None)
            if losses.requires_grad and first is not None:  # undeclared encoder: check (b), (c)
                weights.append(torch.rand(b, generator=torch.Generator().manual_seed(0), dtype=torch.float64).add_(0.5).to(ref.device))
                torch.autograd.grad((losses * weights[0].to(losses.dtype)).sum(), [dummy], allow_unused=True)
                if mixed:
                    raise GhostUnsupported(f"layers {mixed[:3]}: a tuple's loss reaches other tuples' rows (rows that are not "
                                           "the node slots, or slots mixed after the layer); use per_tuple_mode='vmap'.")
    finally:
        for handle in handles:
            handle.remove()
    return list(layers.values()), losses.detach()


def ghost_grads(
    encoder: nn.Module,
    inputs: Mapping[str, Tensor],
    head: Callable[..., Tensor],
    head_args: tuple[Tensor, ...] = (),
    *,
    params: Mapping[str, Tensor] | None = None,
    chunk_size: int | None = None,
    plan: GhostPlan | None = None,
) -> PerTupleResult:
    """Per-tuple norms and clipped sums by ghost clipping + book-keeping (vmap for uncovered parameters).

    Args:
        encoder: maps node inputs ``[N, ...]`` to embeddings ``[N, d]``, each row from its own inputs only.
        inputs: per-tuple node inputs ``[B, 2 + k, ...]`` (see :func:`~lightning_dprel.datamodules.edge_tuples.batch.tuple_inputs`).
        head: per-tuple losses from embeddings; must broadcast: ``head(h [B, 2+k, d], *args) -> [B]``.
        head_args: tensors with leading dimension B.
        params: the trainable parameters (default: all with ``requires_grad``).
        chunk_size: tuples per forward/backward (None: all at once).
        plan: a precomputed :func:`ghost_plan`.

    Returns:
        :class:`PerTupleResult` whose ``grads`` is a :class:`GhostGrads` (norms, weighted sums).
    """
    params = check_per_tuple_args(encoder, inputs, head_args, params, chunk_size)
    plan = plan or ghost_plan(encoder, params)
    if plan.reason is not None:
        raise GhostUnsupported(f"ghost clipping needs node slots processed independently: {plan.reason}; use per_tuple_mode='vmap'.")
    size = next(iter(inputs.values())).shape[0]
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    step = size if chunk_size is None else chunk_size
    chunks, losses = [], []
    start = 0
    while plan.modules and start < size:
        part = {k: v[start : start + step] for k, v in inputs.items()}
        try:
            layers, loss = _chunk_pass(encoder, plan, part, head, tuple(a[start : start + step] for a in head_args), params)
        except _NotSlotwise as err:  # this layer's rows are not the slots: vmap takes its parameters; start again
            demote(plan, err.args[0])
            chunks, losses, start = [], [], 0
            continue
        chunks.append((start, layers))
        losses.append(loss)
        start += step
    fallback: dict[str, Tensor] = {}
    if plan.fallback and size:
        res = per_tuple_grads(encoder, inputs, head_for_one(head), head_args, params=plan.fallback, chunk_size=chunk_size)
        fallback = dict(res.grads)
        losses = losses or [res.losses]
    elif plan.fallback:
        fallback = {n: p.new_zeros((0,) + tuple(p.shape)) for n, p in plan.fallback.items()}
    ref = next(iter(params.values()))
    loss = torch.cat(losses) if losses else ref.new_zeros(0)
    return PerTupleResult(GhostGrads(chunks, fallback, shapes, size, ref.device), loss)
