"""Settings that travel to a new graph (issue 24): K from a DP estimate of the degree distribution whose sensitivity is
checked by removing every entity, charged to the ledger and composed with training; b and σ from public sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_dprel.accounting import Accountant
from lightning_dprel.core.events import GaussianRelease, StepRecord
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import GraphPair, GraphSource
from lightning_dprel.datamodules.edge_tuples.sampling import cap_degree, to_simple_undirected
from lightning_dprel.datamodules.edge_tuples.settings import (
    DPDegreeCap, choose_settings, suggest_settings, survival_counts, survival_sensitivity,
)
from lightning_dprel.demos import random_feature_graph

pytestmark = pytest.mark.filterwarnings("ignore:(DPRelationalModule\\(noise_seed|RelationalDataModule\\(sampling_seed)=<int>\\)")


def _capped_graph(n: int, m: int, k_max: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, n, (2, m), generator=g)
    hub = torch.stack([torch.zeros(n // 2, dtype=torch.long), torch.arange(1, n // 2 + 1)])  # a hub: caps bite
    simple = to_simple_undirected(torch.cat([raw, hub], 1), n)
    return cap_degree(simple, n, k_max, generator=torch.Generator().manual_seed(seed + 1))


def _without(edges: torch.Tensor, v: int) -> torch.Tensor:
    return edges[:, (edges[0] != v) & (edges[1] != v)]


def _seeded(seed: int = 0) -> KeyedStream:
    return KeyedStream.seeded(seed, "test-degree-cap", warn=False)


def test_survival_counts_are_the_number_of_entities_with_at_least_j_relations():
    edges = _capped_graph(60, 150, 7, seed=0)
    deg = torch.bincount(edges.flatten(), minlength=60)
    expected = [int((deg >= j).sum()) for j in range(1, 8)]
    assert survival_counts(edges, 60, 7).tolist() == expected
    assert float(survival_counts(edges, 60, 7).sum()) == 2 * edges.shape[1]  # Σ_j c_j = Σ_u d_u


@pytest.mark.parametrize("k_max", [3, 6])
def test_removing_any_entity_moves_the_counts_by_at_most_the_stated_sensitivity(k_max):
    bound, worst = survival_sensitivity(k_max), 0.0
    for seed in range(3):
        edges = _capped_graph(50, 120, k_max, seed)
        c = survival_counts(edges, 50, k_max)
        for v in range(50):
            worst = max(worst, float(torch.linalg.vector_norm(c - survival_counts(_without(edges, v), 50, k_max))))
    assert 0.0 < worst <= bound + 1e-9
    # the bound is attained: an entity of degree k_max whose neighbours have no other relation
    star = torch.stack([torch.zeros(k_max, dtype=torch.long), torch.arange(1, k_max + 1)])
    moved = survival_counts(star, k_max + 1, k_max) - survival_counts(_without(star, 0), k_max + 1, k_max)
    assert math.isclose(float(torch.linalg.vector_norm(moved)), bound, rel_tol=1e-12)


def test_with_negligible_noise_K_is_the_smallest_cap_keeping_the_stated_share():
    edges = _capped_graph(80, 260, 10, seed=4)
    c = survival_counts(edges, 80, 10)
    share = (c.cumsum(0) / c.sum()).tolist()
    for keep in (0.5, 0.8, 0.95, 1.0):
        est = DPDegreeCap(keep=keep, k_max=10, noise_multiplier=1e-9, stream=_seeded()).estimate(edges, 80)
        assert est.max_degree == next(k + 1 for k, s in enumerate(share) if s >= keep - 1e-9)
        assert est.kept_fraction >= keep - 1e-6


def test_an_empty_graph_gives_the_smallest_cap_and_delta_follows_the_sizes():
    class _Below(KeyedStream):  # noise that clamps every count of an empty graph to 0
        def normal(self, n, std=1.0, *, dtype=torch.float32):
            return -torch.ones(n, dtype=dtype)

    est = DPDegreeCap(k_max=4, stream=_Below("t", seed=0, _warn=False)).estimate(torch.empty(2, 0, dtype=torch.long), 10)
    assert (est.max_degree, est.kept_fraction, est.noisy_counts) == (1, 1.0, (0.0,) * 4)
    assert suggest_settings(200_000, 300_000, target_epsilon=10.0, max_degree=5).delta == 1.0 / 300_000
    assert suggest_settings(200_000, 150_000, target_epsilon=10.0, max_degree=5).delta == 1.0 / 200_000


def test_the_noise_has_the_stated_scale_and_comes_from_the_keyed_stream():
    edges = _capped_graph(1500, 4000, 8, seed=1)
    exact, std = survival_counts(edges, 1500, 8), 2.0 * survival_sensitivity(8)
    assert int((exact > 5 * std).sum()) >= 3  # counts far from the clamp at 0
    cap = DPDegreeCap(k_max=8, noise_multiplier=2.0, stream=_seeded(5))
    draws = torch.stack([torch.tensor(cap.estimate(edges, 1500).noisy_counts, dtype=torch.float64) for _ in range(400)])
    spread = (draws - exact)[:, exact > 5 * std]
    assert abs(float(spread.std()) / std - 1.0) < 0.1 and abs(float(spread.mean())) < 0.2 * std
    again = DPDegreeCap(k_max=8, noise_multiplier=2.0, stream=_seeded(5)).estimate(edges, 1500)
    assert again.noisy_counts == tuple(draws[0].tolist())  # same key, same first draw; the default is secret
    assert DPDegreeCap().stream.is_secret


def test_the_estimate_is_charged_as_a_gaussian_release_and_composes_with_training():
    import dp_accounting

    est = DPDegreeCap(noise_multiplier=3.0, stream=_seeded()).estimate(_capped_graph(60, 150, 32, seed=2), 60)
    assert est.release == GaussianRelease(3.0, "entity")
    orders = [2.0, 4.0, 8.0, 16.0, 32.0]
    acc = dp_accounting.rdp.RdpAccountant(orders=orders)
    acc.compose(dp_accounting.GaussianDpEvent(3.0))
    ours = Accountant("standard", orders=np.array(orders))
    ours.step(None, 3.0, 1, mechanism="gaussian")
    np.testing.assert_allclose(ours.rdp(), acc._rdp, rtol=1e-9)

    spec = _spec(m=5000, n=6000, b=450, k=5)
    settings = suggest_settings(5000, 6000, target_epsilon=10.0, max_degree=5, spent=(est.release,), steps=200)
    alone = suggest_settings(5000, 6000, target_epsilon=10.0, max_degree=5, steps=200)
    assert settings.expected_batch_size == alone.expected_batch_size == 450 and settings.delta == 1e-5
    assert settings.noise_multiplier > alone.noise_multiplier  # the sliver is paid for
    ledger = PrivacyLedger()
    ledger.open(spec)
    ledger.charge(est.release)
    for _ in range(200):
        ledger.charge(StepRecord("standard", settings.noise_multiplier, 1.0, "standard", settings.noise_multiplier, 450.0))
    assert 0.98 * 10.0 <= ledger.epsilon(1e-5) <= 10.0 + 1e-9


def _spec(m: int, n: int, b: int, k: int):
    from lightning_dprel.datamodules.edge_tuples.coupled_stream import make_spec

    return make_spec(n, m, max_degree=k, expected_batch_size=b, neg_per_pos=1, steps_per_epoch=None, max_overflow_probability=1e-6)


def _module():
    from lightning_dprel.encoders import ResidualAdapter
    from lightning_dprel.methods.relational.module import DPRelationalModule

    return DPRelationalModule(ResidualAdapter(8, rank=2, directed=True), score="directed_cosine", loss="hinge", margin=2.0,
                              temperature=0.5, clipping="standard", clip_norm=1.0, noise_seed=1)


class _Source(GraphSource):
    def load(self) -> GraphPair:
        train, val, test = (random_feature_graph(n, e, dim=8, seed=s) for n, e, s in ((300, 900, 0), (80, 200, 1), (80, 200, 2)))
        return GraphPair(train=train, val=val, test=test, name="synthetic")


def test_choose_settings_caps_at_the_estimated_K_and_sizes_the_batch_from_m():
    def make(**kw):
        return RelationalDataModule(_Source(), neg_per_pos=1, sampling_seed=1, directed=True, **kw)

    module = _module()
    dm, settings = choose_settings(make, target_epsilon=4.0, module=module, degree_cap=DPDegreeCap(keep=0.8, k_max=12, stream=_seeded()),
                                   steps=50)
    assert [s.mechanism for s in module.privacy_ledger.segments] == ["gaussian"]  # charged by choose_settings itself
    probe = make(max_degree=12, expected_batch_size=1)  # the estimate read the graph capped at k_max, not the raw or K-capped one
    probe.setup("fit")
    again = DPDegreeCap(keep=0.8, k_max=12, stream=_seeded()).estimate(probe.train_edges, probe.sampling_spec.num_nodes)
    assert again == settings.degree_cap
    dm.setup("fit")
    spec = dm.sampling_spec
    assert spec.max_degree == settings.max_degree == settings.degree_cap.max_degree
    assert int(torch.bincount(dm.train_edges.flatten()).max()) <= settings.max_degree
    assert spec.expected_batch_size == settings.expected_batch_size == round(0.09 * spec.num_edges)
    assert settings.describe()["degree_cap"]["k_max"] == 12 and settings.signal_to_noise > 0


def test_bad_inputs_are_refused():
    for kw in ({"keep": 0.0}, {"keep": 1.5}, {"k_max": 0}, {"noise_multiplier": 0.0}, {"noise_multiplier": math.inf}):
        with pytest.raises(ValueError):
            DPDegreeCap(**kw)
    with pytest.raises(TypeError, match="KeyedStream"):
        DPDegreeCap(stream=torch.Generator())
    with pytest.raises(ValueError, match="k_max"):  # the sensitivity needs the graph capped at k_max first
        DPDegreeCap(k_max=2, stream=_seeded()).estimate(_capped_graph(60, 150, 6, seed=0), 60)
    with pytest.raises(ValueError, match="num_relations"):
        suggest_settings(0, 10, target_epsilon=1.0, max_degree=2)
    with pytest.raises(ValueError, match="unit"):  # a release for another unit is not composed with entity-level training
        suggest_settings(100, 200, target_epsilon=4.0, max_degree=2, spent=(GaussianRelease(3.0, "labelled_node"),))
    with pytest.raises(TypeError, match="max_degree"):
        choose_settings(lambda **kw: None, target_epsilon=4.0, module=_module(), max_degree=3)
    with pytest.raises(TypeError, match="PrivateModule"):
        choose_settings(lambda **kw: None, target_epsilon=4.0, module=object())
    with pytest.raises(ValueError, match="sampling_rate"):
        suggest_settings(100, 200, target_epsilon=1.0, max_degree=2, sampling_rate=0.0)


def test_a_fit_after_the_estimate_spends_at_most_the_budget_with_the_sliver_in_the_ledger():
    from pytorch_lightning import Trainer

    from lightning_dprel.callbacks import PrivacyCallback

    def make(**kw):
        return RelationalDataModule(_Source(), neg_per_pos=1, sampling_seed=1, directed=True, **kw)

    module = _module()
    dm, settings = choose_settings(make, target_epsilon=4.0, module=module, degree_cap=DPDegreeCap(k_max=12, stream=_seeded()), steps=8)
    priv = PrivacyCallback(target_epsilon=4.0, delta=settings.delta, calibrate=True)
    Trainer(max_steps=settings.steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0,
            callbacks=[priv]).fit(module, dm)
    assert module.privacy_ledger.private_steps == settings.steps
    assert [s.mechanism for s in module.privacy_ledger.segments][0] == "gaussian"
    assert math.isclose(priv.noise_multiplier, settings.noise_multiplier, rel_tol=0.02)  # the callback paid for the sliver too
    assert 0.97 * 4.0 <= priv.epsilon <= 4.0


def test_the_estimate_travels_with_the_data_so_any_model_trained_on_it_is_charged_once():
    from pytorch_lightning import Trainer

    from lightning_dprel.callbacks import PrivacyCallback

    def make(**kw):
        return RelationalDataModule(_Source(), neg_per_pos=1, sampling_seed=1, directed=True, **kw)

    dm, settings = choose_settings(make, target_epsilon=4.0, module=_module(), degree_cap=DPDegreeCap(k_max=12, stream=_seeded()),
                                   steps=8)
    other = _module()  # not the module choose_settings was given: it trains on the same data, so it pays for the estimate
    for callback in (PrivacyCallback(target_epsilon=4.0, delta=settings.delta, calibrate=True), PrivacyCallback(delta=settings.delta)):
        Trainer(max_steps=settings.steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0,
                callbacks=[callback]).fit(other, dm)
        releases = [s for s in other.privacy_ledger.segments if s.mechanism == "gaussian"]
        assert len(releases) == 1 and releases[0].steps == 1  # a second fit on the same data charges it no second time
        if callback.target_epsilon is not None:
            assert other.privacy_ledger.private_steps == settings.steps and 0.97 * 4.0 <= callback.epsilon <= 4.0
    assert other.privacy_ledger.state_dict()["data_releases"] == [dm.data_releases[0][0]]
