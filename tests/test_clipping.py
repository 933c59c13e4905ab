"""FREQ-CLIP (Algorithm 1) and standard clipping: per-tuple norms end at or below their thresholds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_dprel.core.clipping import apply_factors, standard_clip
from lightning_dprel.methods.relational.clipping import freq_clip, freq_clip_factors
from lightning_dprel.grad_sample.sums import per_tuple_norms, weighted_sum
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq


def _random_batch(seed, size, k, num_nodes, shapes=((3, 4), (5,))):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, num_nodes, (size, 2), generator=g)
    neg = torch.randperm(max(num_nodes, size * k), generator=g)[: size * k].reshape(size, k) % num_nodes
    scale = torch.exp(torch.empty(size).uniform_(-5, 5, generator=g))
    grads = {f"p{i}": torch.randn((size,) + s, generator=g, dtype=torch.float64) * scale.view(-1, *([1] * len(s))) for i, s in enumerate(shapes)}
    return pos, neg, grads


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(0, 20), k=st.integers(0, 4), num_nodes=st.integers(2, 30), clip=st.floats(0.01, 10.0))
def test_freq_clip_norms_below_threshold(seed, size, k, num_nodes, clip):
    pos, neg, grads = _random_batch(seed, size, k, num_nodes)
    mf = max_freq(pos, neg)
    before = per_tuple_norms(grads)
    after = per_tuple_norms(freq_clip(grads, mf, clip_norm=clip))
    assert after.shape == (size,)
    assert bool((after <= clip / (2 * mf.double()) + 1e-6).all())
    small = before <= clip / (2 * mf.double())
    torch.testing.assert_close(after[small], before[small])  # below the threshold: untouched


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(0, 20), clip=st.floats(0.01, 10.0))
def test_standard_clip_norms_below_c(seed, size, clip):
    _, _, grads = _random_batch(seed, size, 1, 10)
    before = per_tuple_norms(grads)
    after = per_tuple_norms(standard_clip(grads, clip_norm=clip))
    assert bool((after <= clip + 1e-6).all())
    big = before > clip
    torch.testing.assert_close(after[big], torch.full_like(after[big], clip))
    torch.testing.assert_close(after[~big], before[~big])


def test_weighted_sum_equals_sum_of_clipped():
    pos, neg, grads = _random_batch(0, 9, 3, 12)
    factors = freq_clip_factors(grads, max_freq(pos, neg), clip_norm=1.0)
    clipped = apply_factors(grads, factors)
    summed = weighted_sum(grads, factors)
    for name in grads:
        torch.testing.assert_close(summed[name], clipped[name].sum(0))


def test_tensor_input_and_known_values():
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    mf = torch.tensor([1, 2, 3])
    out = freq_clip(g, mf, clip_norm=1.0)  # thresholds 1/2, 1/4, 1/6
    torch.testing.assert_close(per_tuple_norms(out), torch.tensor([0.5, 0.25, 0.0], dtype=torch.float64))
    torch.testing.assert_close(out[0], torch.tensor([0.3, 0.4], dtype=torch.float64))


def test_errors_name_the_parameter():
    g = torch.ones(2, 3)
    with pytest.raises(ValueError, match="max_freq.*>= 1"):
        freq_clip(g, torch.tensor([0, 1]), clip_norm=1.0)
    with pytest.raises(ValueError, match="max_freq.*shape"):
        freq_clip(g, torch.tensor([1, 1, 1]), clip_norm=1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        standard_clip(g, clip_norm=0.0)
    with pytest.raises(TypeError, match="grads"):
        per_tuple_norms([g])
