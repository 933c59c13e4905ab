"""Per-tuple gradient norms and clipped sums without per-tuple gradients (ghost clipping for
tuples, Alg. 3 l. 3-4).

The private step needs only ‖g(T_i)‖ and Σ_i f_i·g(T_i). One forward of all B·(2+k) node slots
and one backward give each covered layer (one with a rule in
:mod:`~lightning_dprel.grad_sample.layers`: Linear, Embedding, LayerNorm, or a layer type someone
registered) its inputs and output gradients; tuple i owns the L = (2+k)·T rows of its slots (T
positions per slot: tokens, or 1 for dense features), and the layer's rule gives the norms and the
clipped sum from them (:class:`~lightning_dprel.grad_sample.layers.GhostGrads`). The backward
reaches only the zero taps on the covered layers' outputs, so no parameter gradient is computed
twice. Parameters of other layers fall back to :func:`per_tuple_grads` (vmap).

Exact when (a) every covered layer is called once per forward, (b) row r of its input and output
is node slot r, from slot r's inputs only (or a ``[1, ...]`` index broadcast onto all slots:
BERT's position ids), and (c) nothing after a covered layer mixes rows. Shapes cannot show (b),
(c) (T = B·(2+k) positions look like slots), so the encoder declares them: :func:`ghost_safe` (its
own class sets ``ghost_safe``, to True or a property; or it is a lone covered layer). ``"auto"``
(:class:`~lightning_dprel.grad_sample.dispatch.GradSampler`) takes ghost only then and when every
parameter is covered (:attr:`GhostPlan.exact`), else vmap (also after a failed check). Checks: a
second call raises :class:`GhostUnsupported`; a layer whose rows are not B·(2+k) moves to vmap; on
an undeclared encoder (forced ghost) a second backward with per-tuple loss weights c must scale
each covered row by its tuple's c (else :class:`GhostUnsupported`). Mixing raw inputs before the
first covered layer is not detectable.

References:
    Li, Tramèr, Liang, Hashimoto 2022 (ghost clipping); Bu, Mao, Xu 2022 (mixed ghost clipping);
    Bu, Wang, Zha, Karypis 2023 (book-keeping: the clipped sum from the first pass's output
    gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lightning_dprel.grad_sample.layers import GhostGrads, LayerPieces, Taps, rule_for
from lightning_dprel.grad_sample.per_tuple import (
    PerTupleResult, check_per_tuple_args, head_for_one, per_tuple_grads, trainable_parameters,
)

__all__ = ["GhostUnsupported", "GhostPlan", "GhostGrads", "ghost_safe", "ghost_plan", "ghost_grads"]


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


def ghost_safe(encoder: nn.Module) -> bool:
    """Whether ``encoder`` declares the exactness conditions (a)-(c) of this module's docstring:
    its own class sets ``ghost_safe`` (True, or a property that is True for it; not inherited), or
    it is a lone covered layer."""
    declared = type(encoder).__dict__.get("ghost_safe")
    if isinstance(declared, property):
        declared = declared.__get__(encoder)
    return declared is True or rule_for(encoder) is not None


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
        if len(own) == 1 and rule_for(next(iter(own.values()))[1]) is not None:
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


def _chunk_pass(encoder: nn.Module, plan: GhostPlan, inputs: Mapping[str, Tensor],
                head: Callable[..., Tensor], head_args: tuple[Tensor, ...],
                params: Mapping[str, Tensor]) -> tuple[dict[str, LayerPieces], Tensor]:
    """One forward of the chunk's B·(2+k) slots, one backward to the taps (+ the check's)."""
    b, width = next(iter(inputs.values())).shape[:2]
    rows = b * width
    flat = {k: v.reshape((rows,) + tuple(v.shape[2:])) for k, v in inputs.items()}
    layers = {mname: LayerPieces(m, {ln: pn for (mn, ln), pn in plan.names.items() if mn == mname},
                                 b) for mname, m in plan.modules.items()}
    ref = next(iter(params.values()))
    first: dict[str, Tensor] | None = None if plan.declared or b < 2 else {}  # backward 1's row gradients (the check)
    weights: list[Tensor] = []  # the check's per-tuple loss weights c (set for its backward)
    mixed: list[str] = []

    def check(mname: str, calls: int, x, output):
        if calls > 1:  # condition (a)
            raise GhostUnsupported(f"layer {mname!r} is called {calls} times in one forward; ghost "
                                   "clipping needs each covered layer called once; use "
                                   "per_tuple_mode='vmap'.")
        broadcast = rule_for(plan.modules[mname]).broadcast_rows
        if broadcast and isinstance(x, Tensor) and x.shape[0] == 1 < rows:
            x = x.expand((rows,) + tuple(x.shape[1:]))
            output = output.expand((rows,) + tuple(output.shape[1:]))
        if not isinstance(x, Tensor) or x.shape[0] != rows or not isinstance(output, Tensor):
            raise _NotSlotwise(mname)
        return x, output

    def sink(mname: str, x: Tensor, g: Tensor) -> None:
        if weights:  # the check: tuple j's rows get c_j × backward 1's gradient, nothing else
            c = weights[0].repeat_interleave(width).reshape((-1,) + (1,) * (g.dim() - 1))
            want = first.pop(mname).double() * c
            tol = min(1e3 * torch.finfo(g.dtype).eps, 1e-2) * torch.nan_to_num(want.abs()).max()
            if torch.nan_to_num((g.double() - want).abs()).max() > tol:
                mixed.append(mname)
            return
        layers[mname].take(x, g)
        if first is not None:
            first[mname] = g

    taps = Taps(plan.modules, check=check, sink=sink)
    taps.on = True
    try:
        with torch.enable_grad():
            h = encoder(**flat)
            h = h.reshape((b, width) + tuple(h.shape[1:]))
            losses = head(h, *head_args)
            if losses.shape != (b,):
                raise ValueError(
                    f"The tuple head must broadcast over tuples (h [B, 2+k, d] → losses [B] = [{b}]), got "
                    f"{tuple(losses.shape)}; use "
                    "lightning_dprel.methods.relational.losses.tuple_loss or per_tuple_mode='vmap'."
                )
            taps.backward(losses.sum(), retain_graph=first is not None)
            if losses.requires_grad and first is not None:  # undeclared encoder: check (b), (c)
                rng = torch.Generator().manual_seed(0)
                c = torch.rand(b, generator=rng, dtype=torch.float64).add_(0.5)
                weights.append(c.to(ref.device))
                taps.backward((losses * weights[0].to(losses.dtype)).sum())
                if mixed:
                    raise GhostUnsupported(
                        f"layers {mixed[:3]}: a tuple's loss reaches other tuples' rows (rows that "
                        "are not the node slots, or slots mixed after the layer); use "
                        "per_tuple_mode='vmap'.")
    finally:
        taps.remove()
    return layers, losses.detach()


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
        chunks.append((len(loss), layers))
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
