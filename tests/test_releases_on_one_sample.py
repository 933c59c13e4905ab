"""Several noised releases on one sample are one sampled Gaussian release with σ_eff = (Σσ_r⁻²)^(-1/2).

Two ``private_step`` calls on one batch (or two DP optimizers) are not two independent Poisson steps: the unit is in
both sums or in neither. The reference is dp-accounting's PLD accountant (worst case, tight): for q = 0.05, σ = 1,
500 samples, δ = 1e-5, charging 1,000 independent steps gives ε ≈ 10.99, the joint release ε ≈ 16.08.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dprel.accounting import Accountant
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
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
    quiet_trainer([callback], max_steps=20).fit(module, datamodule=dm)
    spec = dm.sampling_spec
    joint, independent = Accountant("standard"), Accountant("standard")
    joint.step(spec, 1.0 / math.sqrt(2), 10)
    independent.step(spec, 1.0, 20)
    assert callback.steps == 10  # ten sampled batches, two noised releases each
    assert callback.epsilon == pytest.approx(joint.get_epsilon(1e-5), rel=1e-12)
    assert callback.epsilon > independent.get_epsilon(1e-5)  # what was reported before


# ---------------------------------------------------------------------- every path to the ledger merges releases
def _dm():
    return RelationalDataModule(random_feature_graph(300, 900, dim=8, seed=0), expected_batch_size=12, neg_per_pos=1,
                                max_degree=3, sampling_seed=1)


class OverridesBatchHooks(TwoReleasesPerBatch):
    """Overrides Lightning's batch hooks without calling super(): the sample must still be the batch."""

    def on_train_batch_start(self, batch, batch_idx):
        pass

    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass


class SecondOptimizerBuiltByHand(DPRelationalModule):
    """A second DPOptimizer built directly (not by build_dp_optimizer): it must charge the ledger too."""

    def configure_optimizers(self):
        from lightning_dprel.core.optim import DPOptimizer
        from lightning_dprel.grad_sample.base import trainable_parameters

        params = trainable_parameters(self.encoder)
        names = list(params)
        first, rest = {n: params[n] for n in names[:2]}, {n: params[n] for n in names[2:]}
        other = DPOptimizer(torch.optim.Adam(rest.values(), lr=0.01), named_params=rest, noise_multiplier=1.0,
                            clip_norm=1.0, clipping="standard")
        return [self.build_dp_optimizer(first), other]

    def training_step(self, batch, batch_idx):
        grads = self.per_tuple(batch).grads
        for opt in self.optimizers():
            opt.optimizer.record({n: grads[n] for n in opt.optimizer.named_params}, max_freq=batch.max_freq,
                                 expected_batch_size=batch.expected_batch_size)
            opt.step()


@pytest.mark.parametrize("cls", [OverridesBatchHooks, SecondOptimizerBuiltByHand])
def test_releases_of_one_batch_merge_whatever_the_module_overrides(cls):
    torch.manual_seed(0)
    dm = _dm()
    module = cls(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0, noise_seed=0,
                 per_tuple_mode="vmap")  # formed per-tuple gradients, split between the two optimizers
    callback = PrivacyCallback(delta=1e-5)
    quiet_trainer([callback], max_steps=10).fit(module, datamodule=dm)
    joint = Accountant("standard")
    joint.step(dm.sampling_spec, 1.0 / math.sqrt(2), 5)
    assert callback.steps == 5 and module.privacy_ledger.last_releases == 2
    assert callback.epsilon == pytest.approx(joint.get_epsilon(1e-5), rel=1e-12)


def test_a_gaussian_release_between_two_releases_of_one_sample_keeps_them_one_step():
    ledger = PrivacyLedger()
    ledger.open(SPEC)
    record = StepRecord("standard", SIGMA, 1.0, "standard", SIGMA, SPEC.expected_batch_size)
    ledger.charge(record, sample=0)
    ledger.charge(GaussianRelease(4.0, "entity"))
    ledger.charge(record, sample=0)
    assert ledger.private_steps == 1
    assert [s.releases for s in ledger.segments if s.mechanism == "standard"] == [2]


class DeclaresTwoReleases(TwoReleasesPerBatch):
    releases_per_sample = 2


def test_a_declared_release_count_keeps_the_budget_and_calibration_exact():
    torch.manual_seed(0)
    dm = _dm()
    dm.setup("fit")
    joint = [Accountant("standard") for _ in range(2)]
    joint[0].step(dm.sampling_spec, 1.0 / math.sqrt(2), 3)
    joint[1].step(dm.sampling_spec, 1.0 / math.sqrt(2), 4)
    target = 0.5 * (joint[0].get_epsilon(1e-5) + joint[1].get_epsilon(1e-5))
    module = DeclaresTwoReleases(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0,
                                 noise_seed=0)
    callback = PrivacyCallback(delta=1e-5, target_epsilon=target)
    quiet_trainer([callback], max_steps=40).fit(module, datamodule=_dm())
    assert callback.steps == 3 and callback.epsilon <= target  # the fourth batch would exceed: never run
    calibrated = DeclaresTwoReleases(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_seed=0)
    cb = PrivacyCallback(delta=1e-5, target_epsilon=8.0, calibrate=True)
    quiet_trainer([cb], max_steps=12).fit(calibrated, datamodule=_dm())  # 12 optimizer steps = 6 batches of 2 releases
    assert cb.steps == 6 and 0.97 * 8.0 <= cb.epsilon <= 8.0


def test_an_undeclared_second_release_that_overshoots_is_an_error_naming_the_fix():
    torch.manual_seed(0)
    dm = _dm()
    dm.setup("fit")
    one, two = Accountant("standard"), Accountant("standard")
    one.step(dm.sampling_spec, 1.0, 1)
    two.step(dm.sampling_spec, 1.0 / math.sqrt(2), 1)
    target = 0.5 * (one.get_epsilon(1e-5) + two.get_epsilon(1e-5))
    module = TwoReleasesPerBatch(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0,
                                 noise_seed=0)
    with pytest.raises(RuntimeError, match="releases_per_sample = 2"):
        quiet_trainer([PrivacyCallback(delta=1e-5, target_epsilon=target)], max_steps=10).fit(module, datamodule=_dm())


def test_the_gaussian_release_is_dp_accountings_gaussian_event():
    """The `gaussian` mechanism against an independent reference: dp-accounting's RDP of GaussianDpEvent(σ)."""
    import numpy as np

    from lightning_dprel.accounting import DEFAULT_ORDERS, per_step_rdp

    for sigma in (0.8, 2.0, 5.0):
        ref = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
        ref.compose(dp_accounting.GaussianDpEvent(sigma), 3)
        ours = 3 * per_step_rdp("gaussian", None, sigma)
        np.testing.assert_allclose(ours, ref._rdp, rtol=1e-12)
