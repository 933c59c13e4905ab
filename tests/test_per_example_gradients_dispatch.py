"""One entry point for per-example gradients (:class:`lightning_dprel.grad_sample.dispatch.GradSampler`).

Its providers (vmap, ghost clipping, a per-example loop, stacked copies) give the same per-example norms, clipped sums
and losses in float64; ``"auto"`` takes ghost only where it is provably exact, else vmap; and no method package holds a
per-example-gradient dispatch of its own (they import only ``grad_sample.base`` and ``grad_sample.dispatch``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.grad_sample.base import MaterializedGrads, TupleGradients, trainable_parameters
from lightning_dprel.grad_sample.dispatch import MODES, GradSampler
from lightning_dprel.grad_sample.ghost import GhostGrads, GhostUnsupported
from lightning_dprel.grad_sample.memory import auto_chunk_size
from lightning_dprel.methods.relational.losses import tuple_loss

ROOT = Path(__file__).resolve().parents[1]
B, K, D = 6, 3, 5


def _head(h, anchor):  # broadcasts over tuples (h [B, 2+K, d] → [B]) and scores one (h [2+K, d] → scalar)
    return tuple_loss(h, anchor, score="cosine", temperature=0.5, loss="infonce")


def _tuples():
    torch.manual_seed(0)
    enc = MLPEncoder(D, hidden_dim=8, out_dim=6, num_layers=3).double().train()
    g = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(B, 2 + K, D, generator=g, dtype=torch.float64)}
    return enc, inputs, torch.randint(0, 2, (B, K), generator=g)


def _one_at_a_time(enc, inputs, anchor):
    """The oracle: each tuple's loss from its own forward, one backward each (the loop provider)."""
    return GradSampler().loop(trainable_parameters(enc), (_head(enc(x=inputs["x"][i]), anchor[i]) for i in range(B)))


def _factors(ref: TupleGradients) -> torch.Tensor:
    clip = 0.5 * float(ref.norms().median())  # about half the examples clipped
    return clip / ref.norms().double().clamp_min(clip)


def _assert_same(got, want) -> None:
    """Same norms, same clipped sum (all parameters), same losses."""
    torch.testing.assert_close(got.grads.norms().double(), want.grads.norms().double(), rtol=1e-9, atol=1e-12)
    f = _factors(want.grads)
    a, b = got.grads.weighted_sum(f), want.grads.weighted_sum(f)
    assert set(a) == set(b)
    for name in b:
        torch.testing.assert_close(a[name].double(), b[name].double(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.losses.double(), want.losses.double(), rtol=1e-12, atol=1e-12)


# --- the providers agree ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [None, 2, "auto"])
def test_vmap_ghost_and_auto_equal_the_per_example_loop(chunk_size):
    enc, inputs, anchor = _tuples()
    want = _one_at_a_time(enc, inputs, anchor)
    got = {mode: GradSampler(mode, chunk_size).tuples(enc, inputs, _head, (anchor,)) for mode in MODES}
    assert isinstance(got["vmap"].grads, MaterializedGrads)
    assert isinstance(got["ghost"].grads, GhostGrads) and isinstance(got["auto"].grads, GhostGrads)  # the MLP: exact
    for mode, res in got.items():
        _assert_same(res, want)


class _Shared(nn.Module):
    """y = tanh(x W_cᵀ + b_c) with copy c = ``owner[row]`` of W ``[1, o, D]``, b ``[1, o]`` (copy 0 for every row without owners)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.weight = nn.Parameter(torch.randn(1, 4, D, generator=g, dtype=torch.float64))
        self.bias = nn.Parameter(torch.randn(1, 4, generator=g, dtype=torch.float64))

    def forward(self, x, owner=None):
        owner = torch.zeros(x.shape[0], dtype=torch.long) if owner is None else owner
        return torch.tanh(torch.einsum("ni,noi->no", x, self.weight[owner]) + self.bias[owner])


def _square(h, y):  # [B, 1, o] → [B] and [1, o] → scalar
    return (h - y).pow(2).sum((-2, -1))


def test_stacked_copies_equal_loop_vmap_and_ghost():
    """Four providers, one model: B stacked copies in one backward = one backward per example = vmap = ghost (fallback)."""
    m = _Shared()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(B, D, generator=g, dtype=torch.float64), torch.randn(B, 1, 4, generator=g, dtype=torch.float64)
    params, sampler = trainable_parameters(m), GradSampler()
    want = sampler.loop(params, (_square(m(x[i : i + 1]), y[i]) for i in range(B)))
    owner = torch.arange(B)
    stacked = sampler.stacked(params, lambda c: _square(functional_call(m, c, (x,), {"owner": owner}).unsqueeze(1), y), B)
    assert all(stacked.grads[n].shape == (B, *p.shape) for n, p in params.items())
    _assert_same(stacked, want)
    for mode in MODES:
        _assert_same(GradSampler(mode, None).tuples(m, {"x": x.unsqueeze(1)}, _square, (y,)), want)
    assert all(p.grad is None for p in params.values())  # no provider leaves gradients on the shared parameters


# --- "auto": ghost only where provably exact, else vmap -----------------------------------------------------------------
class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, 6)

    def forward(self, x):
        return self.lin(x)


class _Declared(_Plain):
    ghost_safe = True


class _DeclaredTwice(nn.Module):
    """Declares slot-wise rows but calls its layer twice: ghost's run-time check (a) refuses it."""

    ghost_safe = True

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


@pytest.mark.parametrize("cls, ghost", [(_Declared, True), (_Plain, False), (_Shared, False)])
def test_auto_takes_ghost_only_where_exact(cls, ghost):
    torch.manual_seed(0)
    enc = cls().double()
    _, inputs, anchor = _tuples()
    inputs = {"x": inputs["x"]} if cls is not _Shared else {"x": inputs["x"][:, :1]}
    head = _head if cls is not _Shared else (lambda h, a: h.pow(2).sum((-2, -1)))
    res = GradSampler("auto", None).tuples(enc, inputs, head, (anchor,))
    assert isinstance(res.grads, GhostGrads) == ghost and isinstance(res.grads, MaterializedGrads) == (not ghost)


def test_a_failed_run_time_check_sends_auto_to_vmap_for_good_and_forced_ghost_raises():
    torch.manual_seed(0)
    enc = _DeclaredTwice().double()
    _, inputs, anchor = _tuples()
    sampler = GradSampler("auto", None)
    first = sampler.tuples(enc, inputs, _head, (anchor,))
    assert isinstance(first.grads, MaterializedGrads)
    plan = sampler.plan(enc, trainable_parameters(enc))
    assert not plan.exact and "called 2 times" in plan.reason  # remembered: later steps go straight to vmap
    _assert_same(sampler.tuples(enc, inputs, _head, (anchor,)), _one_at_a_time(enc, inputs, anchor))
    with pytest.raises(GhostUnsupported, match="called 2 times"):
        GradSampler("ghost", None).tuples(enc, inputs, _head, (anchor,))


def test_materialize_forms_the_gradients_whatever_the_mode():
    enc, inputs, anchor = _tuples()
    for mode in MODES:
        res = GradSampler(mode, None).tuples(enc, inputs, _head, (anchor,), materialize=True)
        assert isinstance(res.grads, MaterializedGrads)
        assert dict(res.grads).keys() == trainable_parameters(enc).keys()  # read as name → [B, *shape]


# --- the plan cache and the chunk rule ---------------------------------------------------------------------------------
def test_one_plan_per_encoder_parameters_and_training_mode():
    enc, inputs, anchor = _tuples()
    sampler, params = GradSampler(), trainable_parameters(enc)
    plan = sampler.plan(enc, params)
    sampler.tuples(enc, inputs, _head, (anchor,))
    assert sampler.plan(enc, params) is plan and len(sampler.plans) == 1
    enc.eval()
    assert sampler.plan(enc, params) is not plan and len(sampler.plans) == 2
    other = MLPEncoder(D, hidden_dim=8, out_dim=6, num_layers=3).double()
    assert sampler.plan(other, trainable_parameters(other)) is not plan


def test_the_chunk_rule():
    enc, inputs, _ = _tuples()
    params = trainable_parameters(enc)
    assert GradSampler(chunk_size=3).chunk(enc, inputs, params, per_tuple_gradients=True) == 3
    assert GradSampler(chunk_size=None).chunk(enc, inputs, params, per_tuple_gradients=True) is None
    for per_tuple in (True, False):
        want = auto_chunk_size(enc, inputs, params, per_tuple_gradients=per_tuple)
        assert GradSampler().chunk(enc, inputs, params, per_tuple_gradients=per_tuple) == want


@pytest.mark.parametrize("kwargs, match", [({"mode": "fast"}, "per_tuple_mode"), ({"chunk_size": 0}, "chunk_size"),
                                           ({"chunk_size": "big"}, "chunk_size"), ({"chunk_size": True}, "chunk_size")])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GradSampler(**kwargs)


# --- edge cases of the loop and the stacked copies --------------------------------------------------------------------
def test_loop_gives_zero_to_an_example_without_loss_and_handles_an_empty_batch():
    m = _Shared()
    params, sampler = trainable_parameters(m), GradSampler()
    x = torch.randn(2, D, dtype=torch.float64)
    res = sampler.loop(params, [m(x[:1]).sum(), None])
    assert res.size == 2 and float(res.grads.norms()[1]) == 0.0 and float(res.grads.norms()[0]) > 0.0
    empty = sampler.loop(params, [])
    assert empty.size == 0 and all(t.shape == (0, *params[n].shape) for n, t in empty.grads.items())
    assert sampler.stacked(params, lambda c: None, 0).size == 0  # B = 0: the model is never called


def test_stacked_copies_refuse_what_they_cannot_route():
    sampler, wide = GradSampler(), {"w": nn.Parameter(torch.randn(2, 3))}
    with pytest.raises(ValueError, match="leading dimension 1"):
        sampler.stacked(wide, lambda c: c["w"].sum((1, 2)), 4)
    one = {"w": nn.Parameter(torch.randn(1, 3))}
    with pytest.raises(ValueError, match=r"one loss per example"):
        sampler.stacked(one, lambda c: c["w"].sum(), 4)


# --- layout: the dispatch lives in grad_sample/ only -------------------------------------------------------------------
ALLOWED = {"lightning_dprel.grad_sample.base", "lightning_dprel.grad_sample.dispatch"}  # the protocol, the entry point
PROVIDERS = {"per_tuple_grads", "ghost_grads", "ghost_plan", "GhostPlan", "GhostUnsupported", "GhostGrads", "auto_chunk_size",
             "per_example_loop", "stacked_copy_grads", "vmap", "_ghost_plans"}


def _method_files() -> list[Path]:
    files = sorted((ROOT / "lightning_dprel" / "methods").rglob("*.py"))
    assert len(files) > 20
    return files


def _violations(path: Path) -> list[str]:
    """Imports of a grad_sample provider, provider names used, per-example gradients taken by hand (``autograd.grad``,
    ``torch.func.grad``/``vmap``), or a comparison with a provider mode (``== "vmap"``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_dprel.grad_sample"):
            if node.module not in ALLOWED:
                found.append(f"imports {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch.func", "torch.autograd"):
            found += [f"imports {node.module}.{a.name}" for a in node.names if a.name in ("grad", "vmap", "grad_and_value")]
        elif isinstance(node, ast.Attribute) and node.attr == "grad" and getattr(node.value, "attr", getattr(node.value, "id", "")) == "autograd":
            found.append(f"uses autograd.grad (line {node.lineno})")
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.startswith("lightning_dprel.grad_sample")]
        elif isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
            if name in PROVIDERS:
                found.append(f"uses {name} (line {getattr(node, 'lineno', '?')})")
        elif isinstance(node, ast.Compare):
            consts = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            if any(v in ("ghost", "vmap") for v in consts):
                found.append(f"compares with a provider mode (line {node.lineno})")
    return found


def test_no_method_package_holds_a_per_example_gradient_dispatch():
    offenders = {str(p.relative_to(ROOT)): v for p in _method_files() if (v := _violations(p))}
    assert offenders == {}


def test_the_four_methods_ask_the_one_entry_point():
    methods = ("relational/module.py", "advsgm/module.py", "dp_gcn/module.py", "dp_gpl/dpsgd.py")
    for rel in methods:
        tree = ast.parse((ROOT / "lightning_dprel" / "methods" / rel).read_text())
        imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert ("lightning_dprel.grad_sample.dispatch", "GradSampler") in imported, rel


def test_the_layout_check_finds_a_dispatch(tmp_path):
    """The checker is not vacuous: the dispatch a method held before (import, provider call, mode test) is found."""
    bad = tmp_path / "module.py"
    bad.write_text(
        "import torch\n"
        "from lightning_dprel.grad_sample.ghost import ghost_grads\n"
        "def per_tuple(self, hp, loss, params):\n"
        "    if hp.per_tuple_mode == 'vmap':\n"
        "        return torch.autograd.grad(loss, params)\n"
        "    return ghost_grads(self.encoder)\n"
    )
    found = _violations(bad)
    assert any("imports lightning_dprel.grad_sample.ghost" in f for f in found)
    assert any("uses ghost_grads" in f for f in found) and any("compares" in f for f in found)
    assert any("autograd.grad" in f for f in found)
