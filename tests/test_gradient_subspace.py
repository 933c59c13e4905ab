"""The public gradient subspace (GEP): the released update depends on private data only through the clipped, noised
k coordinates; removing a node moves them within the entity bound; the basis reads public data only."""

from __future__ import annotations

import pytest
import torch

from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.subspace import SUBSPACE, GradientSubspace, ProjectedGrads
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq
from lightning_dprel.demos.tuple_batches import entity_removal_pair
from lightning_dprel.encoders import ResidualAdapter
from lightning_dprel.grad_sample.per_tuple import MaterializedGrads, per_tuple_grads, trainable_parameters
from lightning_dprel.methods.relational.losses import tuple_loss

K = 2


def _head(h, anchor):
    return tuple_loss(h, anchor, score="directed_cosine", temperature=0.5, loss="hinge", margin=2.0)


def _adapter():
    enc = ResidualAdapter(6, rank=2, directed=True).double()
    with torch.no_grad():
        enc.up.normal_(generator=torch.Generator().manual_seed(5))
    return enc


def _grads(enc, x, pos, neg, anchor):
    return per_tuple_grads(enc, {"x": x[torch.cat([pos, neg], 1)]}, _head, (anchor,)).grads


def _public_basis(enc, k, seed=9):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 6, dtype=torch.float64, generator=g)
    pos = torch.randint(0, 40, (30, 2), generator=g)
    neg = torch.randint(0, 40, (30, K), generator=g)
    return GradientSubspace.fit(_grads(enc, x, pos, neg, torch.randint(0, 2, (30, K), generator=g)), k)


def test_fit_gives_the_top_singular_directions():
    g = torch.Generator().manual_seed(0)
    directions = torch.linalg.qr(torch.randn(20, 3, dtype=torch.float64, generator=g)).Q
    grads = {"w": (torch.randn(50, 3, dtype=torch.float64, generator=g) * torch.tensor([5.0, 3.0, 2.0], dtype=torch.float64)) @ directions.t()}
    sub = GradientSubspace.fit(grads, 3)
    torch.testing.assert_close(sub.basis.t() @ sub.basis, torch.eye(3, dtype=torch.float64))
    # the span is that of the planted directions: projecting them loses nothing
    torch.testing.assert_close(sub.basis @ (sub.basis.t() @ directions), directions)
    lifted = sub.lift(sub.coordinates(grads["w"][:1])[0])
    torch.testing.assert_close(lifted["w"], grads["w"][0])


def test_bad_inputs_are_refused():
    grads = {"w": torch.randn(4, 10)}
    with pytest.raises(ValueError, match="k=5 exceeds the rank bound"):
        GradientSubspace.fit(grads, 5)
    with pytest.raises(ValueError, match="`k` must be an int >= 1"):
        GradientSubspace.fit(grads, 0)
    with pytest.raises(ValueError, match="non-finite"):
        GradientSubspace.fit({"w": torch.full((4, 10), float("nan"))}, 2)
    with pytest.raises(ValueError, match="orthonormal"):
        GradientSubspace(torch.ones(10, 2), {"w": (10,)})
    with pytest.raises(ValueError, match="rows"):
        GradientSubspace(torch.eye(10)[:, :2], {"w": (9,)})
    enc = _adapter()
    params = trainable_parameters(enc)
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=0.0, clip_norm=1.0, clipping="standard")
    with pytest.raises(ValueError, match="the subspace covers"):
        dp.set_subspace(GradientSubspace(torch.eye(10)[:, :2], {"w": (10,)}))
    with pytest.raises(TypeError, match="GradientSubspace or None"):
        dp.set_subspace(torch.eye(3))
    sub = _public_basis(enc, 3)
    with pytest.raises(TypeError, match="per-example gradients as tensors"):
        sub.project(object())


def _released(enc, sub, pos, neg, anchor, x, *, sigma=0.0, clip=1e-3, clipping="standard", b=8.0, seed=0):
    """Σ of the DP optimizer's projected step, read from p.grad·b (stages 1-5 of the real optimizer)."""
    params = trainable_parameters(enc)
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=0.0), named_params=params, noise_multiplier=sigma, clip_norm=clip,
                     clipping=clipping, noise=KeyedStream("noise", seed=seed, _warn=False))
    dp.set_subspace(sub)
    dp.record(_grads(enc, x, pos, neg, anchor), max_freq=max_freq(pos, neg), expected_batch_size=b)
    dp.step()
    return torch.cat([p.grad.reshape(-1) for p in params.values()]).double() * b


@pytest.mark.parametrize("clipping", ["standard", "freq"])
def test_removing_a_node_moves_the_projected_release_within_the_entity_bound(clipping):
    """Entity-level neighbours through the real projected step (σ = 0): u's two positive tuples dropped, its negative
    slot given to a fresh z; the released sum moves by at most C(i + 2j) (standard) or the corrected FREQ-CLIP profile."""
    enc = _adapter()
    sub = _public_basis(enc, 3)
    x = torch.randn(60, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (pos, neg, anchor), (pos2, neg2, anchor2) = entity_removal_pair(K)
    clip = 1e-3
    full = _released(enc, sub, pos, neg, anchor, x, clip=clip, clipping=clipping)
    near = _released(enc, sub, pos2, neg2, anchor2, x, clip=clip, clipping=clipping)
    i, j = 2, 1
    bound = clip * (i + 2 * j) if clipping == "standard" else clip * (0.5 + 0.75 * j + i * (1 + K) / 4)
    moved = float(torch.linalg.vector_norm(full - near))
    assert 0 < moved <= bound * (1 + 1e-6), (moved, bound)
    # the release lies in the public span: what is orthogonal to it never leaves the step
    basis = sub.basis
    torch.testing.assert_close(basis @ (basis.t() @ full), full)


def test_the_noise_has_k_dimensions_and_the_clip_acts_on_the_projection():
    enc = _adapter()
    sub = _public_basis(enc, 4)
    x = torch.zeros(30, 6, dtype=torch.float64)  # zero inputs: every gradient is 0, the release is the noise alone
    pos, neg = torch.tensor([[0, 1], [2, 3]]), torch.tensor([[4, 5], [6, 7]])
    anchor = torch.zeros(2, K, dtype=torch.long)
    sigma, clip = 2.0, 0.5
    noise = torch.stack([_released(enc, sub, pos, neg, anchor, x, sigma=sigma, clip=clip, seed=s) for s in range(400)])
    torch.testing.assert_close(noise @ sub.basis @ sub.basis.t(), noise, atol=1e-5, rtol=1e-5)  # in the span only
    coords = noise @ sub.basis  # N(0, σ²C²) per coordinate, k = 4 of them
    assert abs(float(coords.std()) - sigma * clip) < 0.08 * sigma * clip
    # per-tuple norms are taken after projection: a gradient orthogonal to the span is clipped to nothing
    ortho = torch.randn(3, sub.basis.shape[0], dtype=torch.float64)
    ortho = ortho - (ortho @ sub.basis) @ sub.basis.t()
    shapes = sub.shapes
    grads, offset = {}, 0
    for n, s in shapes.items():
        numel = int(torch.Size(s).numel())
        grads[n] = ortho[:, offset : offset + numel].reshape((3,) + s)
        offset += numel
    projected = sub.project(MaterializedGrads(grads))
    assert isinstance(projected, ProjectedGrads) and projected.names == (SUBSPACE,)
    assert float(projected.norms().max()) < 1e-10



def test_projected_coordinates_are_checked_against_the_optimizer_subspace():
    enc = _adapter()
    sub = _public_basis(enc, 5)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(30, 6, dtype=torch.float64, generator=g)
    pos, neg = torch.randint(0, 30, (9, 2), generator=g), torch.randint(0, 30, (9, K), generator=g)
    coords = sub.project(MaterializedGrads(_grads(enc, x, pos, neg, torch.randint(0, 2, (9, K), generator=g))))
    params = trainable_parameters(enc)
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=0.0), named_params=params, noise_multiplier=0.0, clip_norm=1.0, clipping="standard")
    with pytest.raises(ValueError, match="no subspace"):
        dp.record(coords, max_freq=None, expected_batch_size=4.0)
    dp.set_subspace(_public_basis(enc, 5, seed=10))
    with pytest.raises(ValueError, match="another subspace"):
        dp.record(coords, max_freq=None, expected_batch_size=4.0)
