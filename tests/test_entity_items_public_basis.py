"""The public-feature adapter of the entities & items ranker: A = V·M·Vᵀ (+ V·w), V from the public items alone.

V must be a function of the public item embeddings only (the entities' data never reaches it), the ranker starts as
the base encoder, only k² + k coordinates are trained (and noised), the reported ε is the Poisson subsampled
Gaussian's (dp-accounting), removing one entity moves the released sum by at most C through the real step, the
basis survives a checkpoint, and bad settings are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from ddp_helpers import SaveReleasedSums
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.methods.entity_items import EntityItemRanker
from lightning_dprel.methods.entity_items.public_basis import PublicBasisAdapter, public_item_basis
from test_entities_linked_to_public_items import D, K, dm_of, make_data

dp_accounting = pytest.importorskip("dp_accounting")

pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*")]


def test_the_basis_is_the_items_top_singular_subspace_and_ignores_the_entities():
    data = make_data()
    dm = dm_of(data, recipe="entity")
    v = public_item_basis(dm.item_x, 3)
    assert torch.allclose(v.t() @ v, torch.eye(3), atol=1e-5)
    _, _, vh = np.linalg.svd(dm.item_x.double().numpy(), full_matrices=False)
    ref = vh[:3].T
    assert np.allclose(v.double().numpy() @ v.double().numpy().T, ref @ ref.T, atol=1e-5)
    other = make_data(seed=1)  # other entities and relations, the same public items
    other["item"].x = data["item"].x.clone()
    assert torch.equal(public_item_basis(dm_of(other, recipe="entity").item_x, 3), v)


def test_the_ranker_starts_as_the_base_encoder_and_trains_k_squared_plus_k_coordinates():
    items = torch.nn.functional.normalize(torch.randn(30, D), dim=1)
    base = EntityItemRanker(items, dim=D, temperature=0.5)
    model = EntityItemRanker(items, dim=D, temperature=0.5, public_basis=3)
    q = torch.randn(5, D)
    assert torch.equal(model(q), base(q))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 3 * 3 + 3
    assert sum(p.numel() for p in base.parameters() if p.requires_grad) == D * D


def test_the_preconditioner_is_a_full_rank_reparametrisation_of_the_plain_adapter():
    items = torch.nn.functional.normalize(torch.randn(30, D), dim=1)
    plain = EntityItemRanker(items, dim=D, temperature=0.5)
    model = EntityItemRanker(items, dim=D, temperature=0.5, precondition=0.5)
    q = torch.randn(5, D)
    assert torch.equal(model(q), plain(q))  # zero at the start: the base encoder
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == D * D
    with torch.no_grad():
        plain.adapter.weight.normal_()
        # A = V_out·M with V_out invertible: M = V_out⁻¹·A gives the same scores
        model.adapter.inner.weight.copy_(torch.linalg.solve(model.adapter.basis_out, plain.adapter.weight))
    assert torch.allclose(model(q), plain(q), atol=1e-4)
    s = torch.linalg.svdvals(items.double()).float()
    scale = model.adapter.basis_out.norm(dim=0)
    assert torch.allclose(scale, (s / s.mean()) ** -0.5, rtol=1e-4)  # rare item directions scaled up


def _fit(dm, model, steps, **cb):
    cb = PrivacyCallback(delta=1e-5, clip_norm=1.0, **cb)
    torch.manual_seed(0)
    pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
               callbacks=[cb]).fit(model, dm)
    return cb


@pytest.mark.parametrize("lever", [dict(public_basis=4), dict(precondition=0.5)])
def test_made_private_it_is_charged_as_the_poisson_gaussian_of_dp_accounting(lever):
    dm = dm_of(make_data(ne=500), recipe="entity", expected_batch_size=40.0)
    model = EntityItemRanker(dim=D, lr=1e-2, **lever)  # the basis is read from the datamodule at setup
    cb = _fit(dm, model, 5, noise_multiplier=1.3)
    assert cb.steps == 5 and model.adapter.ready
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    q = 40.0 / dm.num_entities
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.3)), 5))
    ref = acc.get_epsilon(1e-5)
    assert ref - 1e-6 <= cb.epsilon <= ref + 5e-3
    assert torch.any(model.adapter.inner.weight != 0)  # it trained


@pytest.mark.parametrize("clip", [0.01, 10.0])
def test_removing_one_entity_moves_the_released_sum_by_at_most_c(tmp_path, clip):
    dm = dm_of(make_data(), recipe="entity")
    rows = torch.arange(24, 64)
    full = {"query": dm.entity_x[dm.train_entities[rows]], "items": dm.entity_items[rows]}
    without = {k: v[:-1] for k, v in full.items()}

    def released(batch, tag):
        dm.next_batch = lambda: batch
        (tmp_path / tag).mkdir()
        saver = SaveReleasedSums(tmp_path / tag)
        torch.manual_seed(0)
        model = EntityItemRanker(dm.item_x, dim=D, temperature=0.5, public_basis=3, item_bias=True)
        cb = PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0)
        pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                   callbacks=[cb, saver]).fit(model, dm)
        return saver.sums[0]

    move = float((released(full, "a") - released(without, "b")).norm())
    assert 0 < move <= clip * (1 + 1e-5)
    if clip == 0.01:  # every entity is clipped: removing one moves the sum by exactly C
        assert move >= 0.999 * clip


def test_the_basis_and_the_adapter_survive_a_checkpoint(tmp_path):
    items = torch.nn.functional.normalize(torch.randn(30, D), dim=1)
    model = EntityItemRanker(items, dim=D, public_basis=3)
    with torch.no_grad():
        model.adapter.inner.weight.normal_()
    path = tmp_path / "m.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    ckpt = torch.load(path, weights_only=False)
    back = EntityItemRanker(**ckpt["hyper_parameters"])
    back.on_load_checkpoint(ckpt)
    back.load_state_dict(ckpt["state_dict"])
    q = torch.randn(4, D)
    assert back.adapter.ready and torch.equal(back(q), model(q))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(public_basis=3, rank=2), ValueError, "rank.*public_basis"),
    (dict(public_basis=0), ValueError, "public_basis"),
    (dict(public_basis=D + 1), ValueError, "public_basis"),
    (dict(public_basis=2.5), TypeError, "public_basis"),
    (dict(precondition=float("nan")), ValueError, "precondition"),
    (dict(precondition=0.5, rank=2), ValueError, "rank.*precondition"),
])
def test_bad_settings_are_refused(kwargs, error, match):
    items = torch.randn(30, D)
    with pytest.raises(error, match=match):
        EntityItemRanker(items, dim=D, **kwargs)


def test_an_unset_basis_is_refused_rather_than_used_as_zero():
    adapter = PublicBasisAdapter(D, 3)
    with pytest.raises(RuntimeError, match="no basis"):
        adapter(torch.randn(2, D))
    with pytest.raises(ValueError, match="dimensions"):
        adapter.fit(torch.randn(10, D + 1))
