"""Several noised releases on one sample are one sampled Gaussian release with σ_eff = (Σσ_r⁻²)^(-1/2).

Two ``private_step`` calls on one batch (or two DP optimizers) are not two independent Poisson steps: the unit is in
both sums or in neither. The reference is dp-accounting's PLD accountant (worst case, tight): for q = 0.05, σ = 1,
500 samples, δ = 1e-5, charging 1,000 independent steps gives ε ≈ 10.99, the joint release ε ≈ 16.08.
"""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_lightning import Trainer

from lightning_dprel.accounting import Accountant
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.core.events import GaussianRelease, SampledGaussianStep, StepRecord, effective_noise_multiplier
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.specs import SamplingSpec

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import PLDAccountant  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|does not have many workers|δ = ).*")

Q, SIGMA, SAMPLES, DELTA = 0.05, 1.0, 500, 1e-5
# K = 1, k = 0: Theorem C.1's mixture is the Poisson-subsampled Gaussian of one example (tested against Opacus).
SPEC = SamplingSpec(num_nodes=100_000, num_edges=20_000, max_degree=1, sampling_rate=Q, neg_per_pos=0,
                    expected_batch_size=Q * 20_000, steps_per_epoch=20)


def _pld(sigma: float, count: int) -> float:
    acc = PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), count)
    return acc.get_epsilon(DELTA)


def test_two_releases_per_sample_are_charged_as_one_release_at_sigma_over_sqrt2():
    ledger = PrivacyLedger()
    ledger.open(SPEC)
    record = StepRecord("standard", SIGMA, 1.0, "standard", SIGMA, SPEC.expected_batch_size)
    for t in range(SAMPLES):
        ledger.charge(record, sample=t)
        ledger.charge(record, sample=t)
    independent, joint = _pld(SIGMA, 2 * SAMPLES), _pld(SIGMA / math.sqrt(2), SAMPLES)
    assert independent == pytest.approx(10.99, abs=0.01) and joint == pytest.approx(16.08, abs=0.01)
    charged = ledger.epsilon(DELTA)
    assert ledger.private_steps == SAMPLES and ledger.segments[-1].releases == 2
    assert charged >= joint > independent  # RDP bounds the tight PLD ε of what was released from above
    acc = Accountant("standard")
    acc.step(SPEC, SIGMA / math.sqrt(2), SAMPLES)
    assert charged == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


def test_releases_on_different_samples_stay_independent_steps():
    ledger = PrivacyLedger()
    ledger.open(SPEC)
    record = StepRecord("standard", SIGMA, 1.0, "standard", SIGMA, SPEC.expected_batch_size)
    for t in range(4):
        ledger.charge(record, sample=t)
    ledger.charge(record)  # no token: a fresh sample
    ledger.charge(record)
    assert ledger.private_steps == 6 and ledger.segments[-1].releases == 1 and len(ledger.segments) == 1


def test_effective_sigma_and_refusals():
    assert effective_noise_multiplier([2.0, 2.0]) == pytest.approx(2.0 / math.sqrt(2))
    assert effective_noise_multiplier([1.0, 0.0]) == 0.0  # an un-noised release voids the step
    a = StepRecord("standard", 1.0, 1.0, "standard", 1.0, 10.0)
    with pytest.raises(ValueError, match="different mechanisms"):
        SampledGaussianStep((a, StepRecord("freq_corrected", 1.0, 1.0, "freq", 1.0, 10.0)))
    ledger = PrivacyLedger()
    ledger.open(SPEC)
    ledger.charge(StepRecord("standard", SIGMA, 1.0, "standard", SIGMA, SPEC.expected_batch_size), sample=0)
    ledger.charge(StepRecord("standard", 0.0, 1.0, "standard", 0.0, SPEC.expected_batch_size), sample=0)
    assert ledger.epsilon(DELTA) == math.inf and ledger.steps == 1


def test_a_gaussian_release_that_is_not_an_optimizer_step_is_composed_with_the_steps():
    ledger = PrivacyLedger()
    ledger.open(SPEC)
    ledger.charge(StepRecord("standard", SIGMA, 1.0, "standard", SIGMA, SPEC.expected_batch_size))
    ledger.charge(GaussianRelease(4.0, "entity", count=3))
    acc = Accountant("standard")
    acc.step(SPEC, SIGMA, 1)
    acc.step(None, 4.0, 3, mechanism="gaussian")
    assert ledger.epsilon(DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12) and ledger.private_steps == 1
    with pytest.raises(ValueError, match="Privacy unit mismatch"):
        ledger.charge(GaussianRelease(4.0, "node_in_subgraph"))
    restored = PrivacyLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.segments == ledger.segments and restored.epsilon(DELTA) == ledger.epsilon(DELTA)


class TwoReleasesPerBatch(DPRelationalModule):
    """Calls private_step twice on one sampled batch (as a module with two noised tables might)."""

    def training_step(self, batch, batch_idx):
        for _ in range(2):
            self.private_step(self.per_tuple(batch).grads, max_freq=batch.max_freq,
                              expected_batch_size=batch.expected_batch_size)


def test_a_module_releasing_twice_per_batch_reports_the_joint_epsilon():
    torch.manual_seed(0)
    dm = RelationalDataModule(random_feature_graph(300, 900, dim=8, seed=0), expected_batch_size=12, neg_per_pos=1,
                              max_degree=3, sampling_seed=1)
    module = TwoReleasesPerBatch(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0,
                                 noise_seed=0)
    callback = PrivacyCallback(delta=1e-5)
    Trainer(callbacks=[callback], max_steps=20, max_epochs=-1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
            accelerator="cpu").fit(module, datamodule=dm)
    spec = dm.sampling_spec
    joint, independent = Accountant("standard"), Accountant("standard")
    joint.step(spec, 1.0 / math.sqrt(2), 10)
    independent.step(spec, 1.0, 20)
    assert callback.steps == 10  # ten sampled batches, two noised releases each
    assert callback.epsilon == pytest.approx(joint.get_epsilon(1e-5), rel=1e-12)
    assert callback.epsilon > independent.get_epsilon(1e-5)  # what was reported before
