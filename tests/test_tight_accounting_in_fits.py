"""A private fit accounts with the tight bound: σ calibrated on min(PLD, RDP), the bar's ε never below the exact value,
the halt exact, privacy.json naming the bound and showing both, and ``accountant="rdp"`` reproducing the RDP path.

The fit is the plain MLP project made private by the callback (example level, ``poisson_gaussian``, whose dominating
pair is the Poisson-subsampled Gaussian's); ε is checked against dp-accounting's own PLD accountant.
"""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from torch.utils.data import TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback
from lightning_dprel.accounting import Accountant, noise_multiplier_for
from lightning_dprel.accounting.accountant import LIVE_GRID_RATIO
from projects import tabular_classifier_private as private

N, B, DELTA = 500, 50.0, 1e-4


pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*(KeyedStream|DPDataLoader)\\(.*seed"),
              pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")]


def _fit(callback, *, max_steps=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(seed)
    model = private.MLPClassifier(6, 2)
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[callback])
    trainer.fit(model, train_dataloaders=DPDataLoader(TensorDataset(x, y), batch_size=B, seed=seed))
    return trainer, model, callback


def _dp_accounting_pld(q, sigma, steps, delta):
    acc = PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def test_calibration_spends_less_noise_and_the_fit_reports_the_pld_bound():
    tight = _fit(PrivacyCallback(target_epsilon=2.0, delta=DELTA, clip_norm=1.0, calibrate=True))[2]
    loose = _fit(PrivacyCallback(target_epsilon=2.0, delta=DELTA, clip_norm=1.0, calibrate=True, accountant="rdp"))[2]
    assert tight.noise_multiplier < loose.noise_multiplier  # the same guarantee for less noise
    assert 0.95 * 2.0 <= tight.epsilon <= 2.0 and 0.95 * 2.0 <= loose.epsilon <= 2.0
    bounds = tight.ledger.epsilon_bounds(DELTA)
    assert bounds["bound"] == "pld" and bounds["pld"] < bounds["rdp"] and tight.epsilon == bounds["pld"]
    # an independent reference: dp-accounting's PLD accountant on the same 30 steps (finer grid, so ≤ ours)
    ref = _dp_accounting_pld(B / N, tight.noise_multiplier, 30, DELTA)
    assert ref <= tight.epsilon <= ref + 2e-3
    assert loose.ledger.epsilon_bounds(DELTA, accountant="rdp") == {
        "epsilon": loose.epsilon, "bound": "rdp", "rdp": loose.epsilon, "pld": None}


def test_the_bar_never_shows_less_than_the_exact_epsilon_and_the_end_is_exact():
    trainer, model, cb = _fit(PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=0.9), max_steps=40)
    exact = Accountant("poisson_gaussian")
    spec = cb._sampling
    for t, live in cb.history:
        exact_t = Accountant("poisson_gaussian")
        exact_t.step(spec, 0.9, t)
        assert live >= exact_t.get_epsilon(DELTA) * (1 - 1e-9)  # FFT rounding only
        assert live <= LIVE_GRID_RATIO * exact_t.get_epsilon(DELTA)  # the grid is 1…10, then ×1.1 in steps
    exact.step(spec, 0.9, 40)
    assert cb.epsilon == pytest.approx(exact.get_epsilon(DELTA), rel=1e-9)


def test_the_halt_is_exact_on_the_reported_bound():
    sigma = 0.9
    probe = Accountant("poisson_gaussian")
    target = 1.5
    trainer, model, cb = _fit(PrivacyCallback(target_epsilon=target, delta=DELTA, clip_norm=1.0, noise_multiplier=sigma),
                              max_steps=400)
    spec = cb._sampling
    assert cb.stopped_step == cb.steps < 400
    probe.step(spec, sigma, cb.steps)
    assert probe.get_epsilon(DELTA) <= target < probe.epsilon_after(spec, sigma, DELTA, 1)
    for t, shown in cb.history[::7] + cb.history[-3:]:  # the bar: never below the exact ε, never above the budget
        exact = Accountant("poisson_gaussian")
        exact.step(spec, sigma, t)
        assert exact.get_epsilon(DELTA) * (1 - 1e-9) <= shown <= target
    rdp_only = Accountant("poisson_gaussian", accountant="rdp")
    rdp_only.step(spec, sigma, cb.steps)
    assert rdp_only.get_epsilon(DELTA) > target  # RDP would have stopped earlier: the PLD bought these steps


def test_calibration_after_spending_composes_what_was_spent():
    from lightning_dprel.core.specs import SamplingSpec

    sampling = SamplingSpec(num_nodes=N, num_edges=N, max_degree=1, sampling_rate=B / N, neg_per_pos=0,
                            expected_batch_size=B, steps_per_epoch=10, privacy_unit="example", num_units=N)
    spent = Accountant("poisson_gaussian")
    spent.step(sampling, 2.5, 50)
    fresh = noise_multiplier_for(3.0, delta=DELTA, steps=50, sampling=sampling, mechanism="poisson_gaussian")
    after = noise_multiplier_for(3.0, delta=DELTA, steps=50, sampling=sampling, mechanism="poisson_gaussian", spent=spent)
    assert after > fresh
    spent.step(sampling, after, 50)
    assert spent.get_epsilon(DELTA) <= 3.0
    with pytest.raises(ValueError, match="spent"):
        noise_multiplier_for(3.0, delta=DELTA, steps=5, sampling=sampling, mechanism="entity_items", spent=spent)


def test_bad_accountant_names_are_refused():
    with pytest.raises(ValueError, match="'pld'.*'rdp'"):
        PrivacyCallback(target_epsilon=1.0, accountant="prv")
    with pytest.raises(ValueError, match="accountant"):
        Accountant("poisson_gaussian", accountant="moments")
    with pytest.raises(ValueError, match="value_discretization"):
        Accountant("poisson_gaussian", value_discretization=0.0)
    assert math.isfinite(Accountant("poisson_gaussian").get_epsilon(DELTA))


def test_a_mechanism_without_a_proven_pair_calibrates_exactly_as_before():
    """Theorem C.1's coupled mixture (the main job's `standard`) has no dominating pair: the same σ, the same ε, RDP."""
    from lightning_dprel.core.specs import SamplingSpec

    spec = SamplingSpec(num_nodes=14000, num_edges=11600, max_degree=5, sampling_rate=1024 / 11600, neg_per_pos=1,
                        expected_batch_size=1024.0, steps_per_epoch=12)
    tight = noise_multiplier_for(10.0, delta=1e-5, steps=500, sampling=spec, mechanism="standard")
    loose = noise_multiplier_for(10.0, delta=1e-5, steps=500, sampling=spec, mechanism="standard", accountant="rdp")
    assert tight == loose
    acc = Accountant("standard")
    acc.step(spec, tight, 500)
    assert acc.epsilon_bounds(1e-5)["bound"] == "rdp" and acc.epsilon_bounds(1e-5)["pld"] is None
