"""Accounting of private entities linked to public items (mechanism ``entity_items``, unit ``entity_public_items``).

Removing an entity removes only its i ≤ K sampled tuples (negatives are public items), so Δ = C·i: Theorem C.1's mixture
with no negative-slot term. Entity-as-example sampling (K = 1) is exactly the Poisson subsampled Gaussian (Mironov et
al. 2019), checked against dp-accounting and Opacus on the datamodule's own SamplingSpec; with K > 1 it never exceeds
the standard bound Δ = C(i + 2j), grows with K, and is the same function as AdvSGM's ``skipgram_public_ids``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.data import HeteroData

from lightning_dprel.accounting import DEFAULT_ORDERS, get_mechanism, per_step_rdp
from lightning_dprel.accounting.calibration import epsilon_for
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.methods.entity_items import MECHANISM, EntityItemDataModule, EntityItemRanker

dp_accounting = pytest.importorskip("dp_accounting")

REL = ("user", "bought", "item")
#: Rényi orders on which dp-accounting's fractional-order series converges at q ≈ 0.1, σ = 1.3.
ORDERS = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0)
INTEGER = DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)


pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*")]


def make_data(ne=500, ni=60, max_deg=12, seed=0) -> HeteroData:
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["user"].ids, data["user"].x = [f"u{i}" for i in range(ne)], torch.randn(ne, 8, generator=g)
    data["item"].ids, data["item"].x = [f"i{j}" for j in range(ni)], torch.randn(ni, 8, generator=g)
    deg = torch.randint(1, max_deg + 1, (ne,), generator=g)
    data[REL].edge_index = torch.tensor(
        [(e, int(j)) for e in range(ne) for j in torch.randperm(ni, generator=g)[: int(deg[e])]]).t()
    return data


DATA = make_data()


def dm_of(**kw) -> EntityItemDataModule:
    opts = dict(relation=REL, recipe="entity", max_relations=4, expected_batch_size=16.0, seed=0)
    return EntityItemDataModule(DATA, **{**opts, **kw})


def _dp_accounting(q, sigma, steps, orders):
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc


def _dp_accounting_pld(q, sigma, steps, delta):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def _eps(mechanism, spec, sigma, steps=100, delta=1e-5, accountant="rdp"):
    """ε of the RDP bound (the properties below are the mixture's; its PLD is checked in test_pld_accounting.py)."""
    return epsilon_for(delta=delta, steps=steps, sampling=spec, noise_multiplier=sigma, mechanism=mechanism,
                       accountant=accountant)[0]


# ---------------------------------------------------------------------- 1. entity-as-example = Poisson Gaussian
@pytest.mark.parametrize("b,sigma,steps,delta", [(4.0, 1.0, 1000, 1e-5), (40.0, 1.3, 100, 1e-5),
                                                 (100.0, 3.0, 50, 1e-6), (8.0, 0.7, 300, 1e-5)])
def test_entity_as_example_epsilon_equals_dp_accounting(b, sigma, steps, delta):
    spec = dm_of(expected_batch_size=b).sampling_spec
    q = b / spec.num_edges
    assert spec.max_degree == 1 and spec.sampling_rate == pytest.approx(q, rel=1e-12)
    ours = per_step_rdp(MECHANISM, spec, sigma)
    ref = _dp_accounting(q, sigma, steps, DEFAULT_ORDERS)
    # dp-accounting equals the exact series at integer orders; at fractional ones its series adds |C(α, i)|
    # (a looser upper bound; see test_accounting_reference.py), so ours must not exceed it there.
    np.testing.assert_allclose(steps * ours[INTEGER], ref._rdp[INTEGER], rtol=1e-6, atol=0)
    assert np.all(steps * ours[~INTEGER] <= ref._rdp[~INTEGER] * (1 + 1e-9))
    opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")  # the signed series, every order
    np.testing.assert_allclose(ours, opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                                            orders=list(DEFAULT_ORDERS)), rtol=1e-6, atol=0)
    eps, _ = epsilon_for(delta=delta, steps=steps, sampling=spec, noise_multiplier=sigma, mechanism=MECHANISM,
                         accountant="rdp")
    assert eps <= ref.get_epsilon(delta) * (1 + 1e-9) and eps == pytest.approx(ref.get_epsilon(delta), rel=1e-3)
    # on orders where both series agree, the ε agree to rounding
    eps_orders, _ = epsilon_for(delta=delta, steps=steps, sampling=spec, noise_multiplier=sigma, mechanism=MECHANISM,
                                orders=ORDERS, accountant="rdp")
    assert eps_orders == pytest.approx(_dp_accounting(q, sigma, steps, ORDERS).get_epsilon(delta), rel=1e-6)
    # the reported ε: the Poisson Gaussian's PLD (dp-accounting's PLD accountant, 10⁻⁴ grid), below RDP
    tight, bound = epsilon_for(delta=delta, steps=steps, sampling=spec, noise_multiplier=sigma, mechanism=MECHANISM)
    pld = _dp_accounting_pld(q, sigma, steps, delta)
    assert bound == "pld" and tight < eps and pld - 1e-6 <= tight <= pld + 5e-3


def test_the_callback_charges_the_entity_recipe_as_the_poisson_gaussian():
    dm = dm_of(expected_batch_size=40.0)
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.3, orders=ORDERS)
    torch.manual_seed(0)
    pl.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
               callbacks=[cb]).fit(EntityItemRanker(dim=8, lr=1e-2), dm)
    assert cb.steps == 6 and cb.mechanism == MECHANISM
    ref = _dp_accounting(40.0 / dm.num_entities, 1.3, 6, ORDERS)
    bounds = cb.ledger.epsilon_bounds(1e-5, orders=ORDERS)
    assert bounds["rdp"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)
    pld = _dp_accounting_pld(40.0 / dm.num_entities, 1.3, 6, 1e-5)
    assert cb.epsilon == bounds["pld"] < bounds["rdp"] and pld - 1e-6 <= cb.epsilon <= pld + 5e-3


# ---------------------------------------------------------------------- 2. relation recipe, K > 1
@pytest.mark.parametrize("k_cap", [2, 4, 8])
def test_relation_recipe_is_between_k1_and_the_standard_bound(k_cap):
    spec = dm_of(recipe="relation", max_relations=k_cap, expected_batch_size=32.0, neg_per_pos=3).sampling_spec
    assert spec.max_degree == k_cap and spec.neg_per_pos == 0  # negatives are public: no slot term
    sigma = 1.0
    ours = per_step_rdp(MECHANISM, spec, sigma)
    as_entity = dataclasses.replace(spec, privacy_unit="entity")
    # the standard bound at the same sampling: Δ = C(i + 2j); with no negatives (j = 0) the two coincide
    np.testing.assert_allclose(ours, per_step_rdp("standard", as_entity, sigma), rtol=1e-9, atol=0)
    with_negs = per_step_rdp("standard", dataclasses.replace(as_entity, neg_per_pos=3), sigma)
    assert np.all(ours <= with_negs * (1 + 1e-9)) and np.any(ours < with_negs)
    eps = _eps(MECHANISM, spec, sigma)
    assert eps < _eps("standard", dataclasses.replace(as_entity, neg_per_pos=3), sigma)
    k1 = dataclasses.replace(spec, max_degree=1)
    assert np.all(ours >= per_step_rdp(MECHANISM, k1, sigma) * (1 - 1e-9)) and eps > _eps(MECHANISM, k1, sigma)


@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_epsilon_grows_with_k(sigma):
    spec = dm_of(recipe="relation", max_relations=8, expected_batch_size=32.0).sampling_spec
    curves = [per_step_rdp(MECHANISM, dataclasses.replace(spec, max_degree=k), sigma) for k in (1, 2, 3, 5, 8)]
    assert all(np.all(a <= b * (1 + 1e-9)) for a, b in zip(curves, curves[1:]))
    eps = [_eps(MECHANISM, dataclasses.replace(spec, max_degree=k), sigma) for k in (1, 2, 3, 5, 8)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


# ---------------------------------------------------------------------- 3. shared with AdvSGM's public ids
@pytest.mark.parametrize("recipe,k_cap", [("entity", 4), ("relation", 1), ("relation", 5)])
def test_advsgm_public_ids_gives_the_same_numbers(recipe, k_cap):
    spec = dm_of(recipe=recipe, max_relations=k_cap, expected_batch_size=24.0).sampling_spec
    ours, advsgm = get_mechanism(MECHANISM), get_mechanism("skipgram_public_ids")
    assert ours.rdp is advsgm.rdp and ours.pld is advsgm.pld  # the functions are shared
    assert ours.unit.name == "entity_public_items" and ours.clipping == ("standard",) and not ours.coupled
    public_ids = dataclasses.replace(spec, privacy_unit="node_public_ids")
    for sigma in (0.7, 1.5):
        assert np.array_equal(per_step_rdp(MECHANISM, spec, sigma), per_step_rdp("skipgram_public_ids", public_ids, sigma))
        assert _eps(MECHANISM, spec, sigma, steps=250) == _eps("skipgram_public_ids", public_ids, sigma, steps=250)


# ---------------------------------------------------------------------- K above the number of entities
def test_an_entity_with_more_kept_relations_than_there_are_entities_is_charged_for_all_of_them():
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["user"].ids, data["user"].x = [f"u{i}" for i in range(8)], torch.randn(8, 8, generator=g)
    data["item"].ids, data["item"].x = [f"i{j}" for j in range(50)], torch.randn(50, 8, generator=g)
    data[REL].edge_index = torch.tensor([(e, j) for e in range(8) for j in range(30)]).t()
    dm = EntityItemDataModule(data, relation=REL, recipe="relation", max_relations=20, expected_batch_size=16.0,
                              split=(1.0, 0.0, 0.0), seed=0)
    assert int((dm.train_pairs[0] == 0).sum()) == 20 and dm.num_entities == 8  # one entity releases 20 clipped tuples
    spec = dm.sampling_spec
    many_entities = dataclasses.replace(spec, num_nodes=10**6)  # n no longer binds K: the K = 20 mixture
    assert np.all(per_step_rdp(MECHANISM, spec, 1.0) >= per_step_rdp(MECHANISM, many_entities, 1.0) * (1 - 1e-9))
