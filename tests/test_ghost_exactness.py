"""Ghost clipping is used only where it is exact (issue 20, finding 4: shape coincidences).

Five custom encoders break "row r of a covered layer is node slot r" without changing any shape the ghost path
could check: a Linear applied sequence-first with T = B·(2+k) positions, position embeddings over an index of that
length, a [1, T] position index picked back with ``[0]``, one Linear used twice (tokens, then the pooled row) and
centring across slots. For each, the module's ``per_tuple_mode="auto"`` must give the per-tuple norms and clipped sum
of explicitly formed per-tuple gradients (a loop of ``torch.autograd.grad``, float64), and forced ghost must refuse.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.grad_sample.ghost import GhostGrads, GhostUnsupported
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.grad_sample.per_tuple import MaterializedGrads, TupleGradients, trainable_parameters
from lightning_dprel.datamodules.edge_tuples.batch import tuple_inputs
from lightning_dprel.demos.tuple_batches import build_tuple_batch

B, K = 3, 2
T = B * (2 + K)  # sequence length equal to the number of node slots: the coincidence


class SeqFirst(nn.Module):
    """Pattern 1: a Linear applied to ``x.transpose(0, 1)`` (rows = the T positions, not the slots)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x.transpose(0, 1)).mean(0)


class Positions(nn.Module):
    """Pattern 2: position embeddings over ``arange(T)`` (rows = positions)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos, self.lin = nn.Embedding(T, 4), nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x + self.pos(torch.arange(x.shape[1]))).mean(1)


class PositionsPicked(nn.Module):
    """Pattern 3: ``pos(arange(T)[None])[0]`` (one shared row, picked back out)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos, self.lin = nn.Embedding(T, 4), nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x + self.pos(torch.arange(x.shape[1])[None])[0]).mean(1)


class Twice(nn.Module):
    """Pattern 4: one Linear on the tokens and again on the pooled row."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(self.lin(x).mean(1))


class DeclaredTwice(Twice):
    """Pattern 4 in an encoder that (wrongly) declares itself ghost-safe: the call count still catches it."""

    ghost_safe = True


class Centred(nn.Module):
    """Pattern 5: centring across the node slots after a covered layer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        h = self.lin(x)
        return h - h.mean(0)


PATTERNS = {  # encoder, shape of one node's input
    "seq_first": (SeqFirst, (T, 4)),
    "positions": (Positions, (T, 4)),
    "positions_picked": (PositionsPicked, (T, 4)),
    "twice": (Twice, (4, 8)),
    "declared_twice": (DeclaredTwice, (4, 8)),
    "centred": (Centred, (4,)),
}


def _setup(name: str, mode: str):
    cls, shape = PATTERNS[name]
    torch.manual_seed(0)
    enc = cls().double()
    g = torch.Generator().manual_seed(1)
    nodes = torch.randperm(20, generator=g)
    pos, neg = nodes[: 2 * B].reshape(B, 2), nodes[2 * B : 2 * B + B * K].reshape(B, K)
    anchor = torch.randint(0, 2, (B, K), generator=g)
    x = torch.randn((20,) + shape, generator=g, dtype=torch.float64)
    batch = build_tuple_batch(pos, neg, anchor, {"x": x}, expected_batch_size=float(B))
    module = DPRelationalModule(enc, per_tuple_mode=mode, chunk_size=None, clipping="standard", noise_multiplier=0.0)
    return module, batch


def _loop(module: DPRelationalModule, batch):
    """Per-tuple gradients formed one tuple at a time (plain autograd, each tuple encoded on its own)."""
    inputs, params = tuple_inputs(batch), trainable_parameters(module.encoder)
    out = {n: [] for n in params}
    for i in range(batch.size):
        loss = module._tuple_head(module.encoder(**{k: v[i] for k, v in inputs.items()}), batch.neg_anchor[i].long())
        for (n, p), gi in zip(params.items(), torch.autograd.grad(loss, list(params.values()), allow_unused=True)):
            out[n].append(torch.zeros_like(p) if gi is None else gi)
    return MaterializedGrads({n: torch.stack(v) for n, v in out.items()})


def _clipped(rec: TupleGradients, clip: float) -> torch.Tensor:
    factors = (clip / rec.norms().clamp_min(clip)).double()
    return torch.cat([t.reshape(-1) for _, t in sorted(rec.weighted_sum(factors).items())])


@pytest.mark.parametrize("name", list(PATTERNS))
def test_auto_mode_matches_explicit_per_tuple_gradients(name):
    module, batch = _setup(name, "auto")
    ref = _loop(module, batch)
    res = module.per_tuple(batch).grads
    got = res if isinstance(res, TupleGradients) else MaterializedGrads(res)
    torch.testing.assert_close(got.norms().double(), ref.norms(), rtol=1e-6, atol=0)
    clip = 0.5 * float(ref.norms().median())  # some tuples clipped
    torch.testing.assert_close(_clipped(got, clip), _clipped(ref, clip), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_forced_ghost_refuses_patterns_it_can_detect(name):
    module, batch = _setup(name, "ghost")
    with pytest.raises(GhostUnsupported, match="per_tuple_mode='vmap'") as err:
        module.per_tuple(batch)
    if "twice" in name:
        assert "called 2 times" in str(err.value)


def test_auto_keeps_ghost_only_for_declared_encoders():
    """The library's MLP and an encoder that declares ``ghost_safe = True`` take ghost; the same layers undeclared, vmap."""
    module, batch = _setup("centred", "auto")
    mlp = DPRelationalModule(MLPEncoder(4, hidden_dim=8, out_dim=6).double(), chunk_size=None, noise_multiplier=0.0)
    assert isinstance(mlp.per_tuple(batch).grads, GhostGrads)

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            return self.lin(x)

    class Declared(Plain):
        ghost_safe = True

    class Inherited(Declared):  # a declaration is not inherited: this forward could mix slots
        pass

    for cls, ghost in ((Declared, True), (Plain, False), (Inherited, False)):
        m = DPRelationalModule(cls().double(), chunk_size=None, noise_multiplier=0.0)
        assert isinstance(m.per_tuple(batch).grads, GhostGrads) == ghost, cls.__name__
