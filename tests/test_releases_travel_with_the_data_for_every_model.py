"""Releases made on a datamodule's data are charged to every model that trains on it, a plain module made private
included: once, by id, kept in its ledger; ``dp_item_popularity`` records its release on the datamodule it read; and a
plain module made private exports the same ``privacy.json`` / ``ledger.json`` as a library module.

The audit that found the gap: an ``EntityItemRanker`` on a datamodule carrying ``record_release(GaussianRelease(0.5,
…))``, or with an ``item_prior`` from ``dp_item_popularity`` (ε_pop ≈ 4), reported 0.9409 with or without them.
"""

from __future__ import annotations

import json

import dp_accounting
import pytest
import pytorch_lightning as pl
import torch

from lightning_dprel import PrivacyCallback, export_model
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.methods.entity_items import EntityItemRanker, dp_item_popularity
from test_entities_linked_to_public_items import D, dm_of, make_data

pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*KeyedStream.*seed.*")]

STEPS, SIGMA, DELTA = 5, 1.0, 1e-5


def _fit(dm, model=None, *, steps=STEPS):
    model = model or EntityItemRanker(dim=D, item_bias=True, temperature=0.5, lr=1e-2)
    cb = PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=SIGMA)
    pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[cb]).fit(model, dm)
    return model, cb


def _releases(ledger):
    """Noise multipliers of the releases charged that are not optimizer steps."""
    return [seg.noise_multiplier for seg in ledger.segments for _ in range(seg.steps) if seg.sampling is None]


def _dp_accounting(q, steps, release_sigmas):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(SIGMA)), steps)
    for s in release_sigmas:
        acc.compose(dp_accounting.GaussianDpEvent(s))
    return acc.get_epsilon(DELTA)


@pytest.fixture(scope="module")
def data():
    return make_data(ne=200, ni=30, max_deg=8)


def test_a_recorded_release_is_charged_to_a_plain_module_as_dp_accounting_composes_it(data):
    plain_dm = dm_of(data, recipe="entity")
    _, without = _fit(plain_dm)
    dm = dm_of(data, recipe="entity")
    dm.record_release(GaussianRelease(0.5, dm.privacy_unit))
    model, cb = _fit(dm)
    q = dm.sampling_spec.sampling_rate
    reference = _dp_accounting(q, STEPS, [0.5])
    assert cb.steps == STEPS and _releases(cb.ledger) == [0.5]
    assert reference - 1e-6 <= cb.epsilon <= reference + 5e-3
    assert cb.epsilon > without.epsilon + 1.0  # the release is not free
    assert without.epsilon == pytest.approx(_dp_accounting(q, STEPS, []), abs=5e-3)


def test_each_release_is_charged_once_by_id_across_fits_and_kept_in_the_ledger(data):
    dm = dm_of(data, recipe="entity")
    first = dm.record_release(GaussianRelease(0.5, dm.privacy_unit))
    model, cb = _fit(dm)
    model, again = _fit(dm, model)  # the same model, a second fit on the same data
    assert again.ledger is cb.ledger and cb.ledger.steps == 2 * STEPS and _releases(cb.ledger) == [0.5]
    assert cb.ledger.state_dict()["data_releases"] == [first]
    q = dm.sampling_spec.sampling_rate
    assert again.epsilon == pytest.approx(_dp_accounting(q, 2 * STEPS, [0.5]), abs=5e-3)


def test_dp_item_popularity_records_its_release_on_the_datamodule_it_read(data):
    dm = dm_of(data, recipe="entity")
    counts, ledger = dp_item_popularity(dm, 4.0, DELTA, seed=0)
    assert len(dm.data_releases) == 1 and ledger.epsilon(DELTA) <= 4.0
    (release_id, event), = dm.data_releases
    model, cb = _fit(dm, EntityItemRanker(dim=D, temperature=0.5, lr=1e-2, item_prior=counts))
    q = dm.sampling_spec.sampling_rate
    assert cb.epsilon == pytest.approx(_dp_accounting(q, STEPS, [event.noise_multiplier]), abs=5e-3)
    assert cb.epsilon > 4.0 * 0.98
    _, same = dp_item_popularity(dm, 4.0, DELTA, ledger=cb.ledger, seed=1)  # a model's own ledger: charged once
    assert same is cb.ledger and len(dm.data_releases) == 2 and len(_releases(cb.ledger)) == 2


def test_a_plain_module_made_private_exports_privacy_json_and_ledger_json(data, tmp_path):
    dm = dm_of(data, recipe="entity")
    dm.record_release(GaussianRelease(0.5, dm.privacy_unit))
    model, cb = _fit(dm)
    out = export_model(model, tmp_path / "export")
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["epsilon"] == pytest.approx(cb.epsilon, rel=1e-9) and privacy["delta"] == DELTA
    assert privacy["privacy_unit"].startswith("one private entity with all its raw relations to public items")
    assert privacy["clip_norm"] == 1.0 and privacy["steps"] == STEPS and privacy["mechanism"] == "entity_items"
    assert privacy["noise_multiplier"] == SIGMA
    validation = privacy["public_data"]["validation_entities"]
    assert validation.endswith("entities declared public for model selection: not protected")
    assert int(validation.split()[0]) == int((dm.part == 1).sum()) > 0
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger == json.loads(json.dumps(cb.ledger.state_dict())) and len(ledger["data_releases"]) == 1
    from safetensors.torch import load_file

    weights = load_file(str(out / "weights.safetensors"))
    assert torch.equal(weights["adapter.weight"], model.adapter.weight.detach())


def test_exporting_a_plain_module_that_never_trained_privately_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"EntityItemRanker has no privacy ledger: it was never trained with PrivacyCallback"):
        export_model(EntityItemRanker(dim=D), tmp_path)
