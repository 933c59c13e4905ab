"""Issue 11, finding 2: what a model spent travels with it (the privacy ledger), whoever fits it next.

Fit twice, resume, fit without the callback, calibrate after private steps, change σ mid-run, use a
registered mechanism: every ε is checked against an independent Accountant of exactly the steps taken, and
every step's charged σ against the σ the noise stream was actually asked for.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_lightning import Callback

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.accounting import Accountant, get_mechanism, per_step_rdp, register_mechanism
from lightning_dprel.core.budget import PrivacyBudget
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.core.ledger import PrivacyLedger, StepRecord
from lightning_dprel.methods.relational.module import DPRelationalModule

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|does not have many workers|δ = ).*")

GRAPH = random_feature_graph(num_nodes=300, num_edges=900, dim=16, seed=0)


def _dm() -> RelationalDataModule:
    return RelationalDataModule(GRAPH, expected_batch_size=16.0, neg_per_pos=1, max_degree=4, sampling_seed=5)


def _module(sigma: float = 1.5, **kw) -> DPRelationalModule:
    torch.manual_seed(0)
    kw.setdefault("clipping", "standard")
    return DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), noise_multiplier=sigma, noise_seed=0, **kw)


def _independent_eps(mechanism: str, runs, delta: float) -> float:
    acc = Accountant(mechanism)
    for sampling, sigma, steps in runs:
        acc.step(sampling, sigma, steps)
    return acc.get_epsilon(delta)


def test_fitting_twice_continues_the_ledger():
    module, dm = _module(), _dm()
    first = PrivacyCallback(target_epsilon=50.0, delta=1e-5)
    quiet_trainer([first], max_steps=10).fit(module, datamodule=dm)
    after_first = first.epsilon
    second = PrivacyCallback(target_epsilon=50.0, delta=1e-5)  # a new trainer and a new callback
    quiet_trainer([second], max_steps=10).fit(module, datamodule=_dm())
    spec = dm.sampling_spec
    assert module.privacy_ledger.private_steps == second.steps == 20
    assert after_first == pytest.approx(_independent_eps("standard", [(spec, 1.5, 10)], 1e-5), rel=1e-12)
    assert second.epsilon == pytest.approx(_independent_eps("standard", [(spec, 1.5, 20)], 1e-5), rel=1e-12)
    assert second.epsilon > after_first and first.epsilon == second.epsilon  # both read the model's ledger


def test_a_second_fit_stops_where_the_budget_of_all_steps_ends():
    module, dm = _module(), _dm()
    dm.setup("fit")
    spec = dm.sampling_spec
    eps = [_independent_eps("standard", [(spec, 1.5, t)], 1e-5) for t in (14, 15)]
    target = 0.5 * (eps[0] + eps[1])
    quiet_trainer([PrivacyCallback(target_epsilon=target, delta=1e-5)], max_steps=10).fit(module, datamodule=dm)
    again = PrivacyCallback(target_epsilon=target, delta=1e-5)
    quiet_trainer([again], max_steps=10).fit(module, datamodule=_dm())
    assert module.privacy_ledger.private_steps == 14 and again.epsilon <= target  # 4 more, not 10


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")  # resumed without the ModelCheckpoint, on purpose
def test_resume_from_an_earlier_checkpoint_charges_every_ledger_step(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    module, dm = _module(), _dm()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}")
    quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5), ckpt], max_steps=10, enable_checkpointing=True).fit(module, datamodule=dm)
    resumed_module, resumed = _module(), PrivacyCallback(target_epsilon=50.0, delta=1e-5)
    quiet_trainer([resumed], max_steps=12).fit(resumed_module, datamodule=_dm(), ckpt_path=str(tmp_path / "step=4.ckpt"))
    spec = dm.sampling_spec
    assert resumed_module.privacy_ledger.private_steps == resumed.steps == 12  # 4 in the checkpoint + 8
    assert resumed.epsilon == pytest.approx(_independent_eps("standard", [(spec, 1.5, 12)], 1e-5), rel=1e-12)


def test_a_private_fit_without_the_callback_refuses_or_records():
    module = _module()
    with pytest.raises(RuntimeError, match="no PrivacyCallback"):
        quiet_trainer(max_steps=3).fit(module, datamodule=_dm())
    assert module.privacy_ledger.steps == 0
    opted = _module(allow_untracked=True)
    with pytest.warns(UserWarning, match="without a PrivacyCallback"):
        quiet_trainer(max_steps=3).fit(opted, datamodule=_dm())
    assert opted.privacy_ledger.private_steps == 3
    later = PrivacyCallback(target_epsilon=50.0, delta=1e-5)
    quiet_trainer([later], max_steps=2).fit(opted, datamodule=_dm())  # the untracked steps are charged too
    assert later.steps == 5


def test_a_non_private_fit_makes_every_later_epsilon_infinite():
    module = _module(sigma=0.0, clipping="standard")
    quiet_trainer(max_steps=2).fit(module, datamodule=_dm())
    assert module.privacy_ledger.unprotected_steps == 2
    module.set_noise_multiplier(1.5)
    with pytest.raises(ValueError, match="without noise"):
        quiet_trainer([PrivacyCallback(target_epsilon=50.0)], max_steps=2).fit(module, datamodule=_dm())
    assert module.privacy_ledger.epsilon(1e-5) == float("inf")


def test_calibration_after_private_steps_records_a_new_segment():
    module, dm = _module(sigma=1.5), _dm()
    quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5)], max_steps=10).fit(module, datamodule=dm)
    spec = dm.sampling_spec
    spent = _independent_eps("standard", [(spec, 1.5, 10)], 1e-5)
    target = 2.0 * spent
    calibrated = PrivacyCallback(target_epsilon=target, delta=1e-5, calibrate=True)
    quiet_trainer([calibrated], max_steps=10).fit(module, datamodule=_dm())
    segs = module.privacy_ledger.segments
    assert [s.steps for s in segs] == [10, 10] and segs[0].noise_multiplier == 1.5
    sigma = segs[1].noise_multiplier
    assert sigma != 1.5 and calibrated.noise_multiplier == pytest.approx(sigma)
    total = _independent_eps("standard", [(spec, 1.5, 10), (spec, sigma, 10)], 1e-5)
    assert calibrated.epsilon == pytest.approx(total, rel=1e-12)
    assert 0.98 * target <= total <= target  # calibrated for what was left, not for a fresh model


class _ChangeSigma(Callback):
    def __init__(self, at: int, sigma: float) -> None:
        self.at, self.sigma = at, sigma

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if pl_module.privacy_ledger.steps == self.at:
            pl_module.set_noise_multiplier(self.sigma)


def test_every_charged_sigma_is_the_sigma_the_noise_was_drawn_with():
    module, dm = _module(sigma=1.5, clip_norm=0.7), _dm()
    drawn = []
    original = module.noise_source.normal

    def spy(n, std=1.0, **kw):
        drawn.append(std)
        return original(n, std, **kw)

    module.noise_source.normal = spy
    cb = PrivacyCallback(target_epsilon=100.0, delta=1e-5)
    quiet_trainer([_ChangeSigma(3, 2.5), cb], max_steps=7).fit(module, datamodule=dm)
    charged = [seg.noise_multiplier * seg.clip_norm for seg in module.privacy_ledger.segments for _ in range(seg.steps)]
    assert drawn == pytest.approx(charged, rel=1e-15) and len(drawn) == 7
    assert [s.noise_multiplier for s in module.privacy_ledger.segments] == [1.5, 2.5]
    spec = dm.sampling_spec
    assert cb.epsilon == pytest.approx(_independent_eps("standard", [(spec, 1.5, 3), (spec, 2.5, 4)], 1e-5), rel=1e-12)


def test_a_record_that_contradicts_itself_or_the_sampling_is_refused():
    ledger = PrivacyLedger()
    dm = _dm()
    dm.setup("fit")
    ledger.open(dm.sampling_spec)
    with pytest.raises(RuntimeError, match="σ·C"):
        ledger.charge(StepRecord("standard", 1.0, 1.0, "standard", 2.0, dm.sampling_spec.expected_batch_size))
    with pytest.raises(RuntimeError, match="b = "):
        ledger.charge(StepRecord("standard", 1.0, 1.0, "standard", 1.0, 3.0))
    ledger.charge(StepRecord("standard", 1.0, 1.0, "standard", 1.0, dm.sampling_spec.expected_batch_size))
    with pytest.raises(ValueError, match="cannot continue with 'freq_corrected'"):
        ledger.charge(StepRecord("freq_corrected", 1.0, 1.0, "freq", 1.0, dm.sampling_spec.expected_batch_size))
    restored = PrivacyLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.segments == ledger.segments


def test_changing_the_clipping_of_a_trained_model_is_refused():
    trained = _module(sigma=1.5, clipping="standard")
    quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5)], max_steps=2).fit(trained, datamodule=_dm())
    other = _module(sigma=1.5, clipping="freq")
    other.privacy_ledger.load_state_dict(trained.privacy_ledger.state_dict())
    with pytest.raises(ValueError, match="already spent 2 private steps"):
        quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5)], max_steps=2).fit(other, datamodule=_dm())


def test_a_registered_mechanism_is_usable_end_to_end():
    name = "standard_times_two_for_test"

    def doubled(sampling, sigma, orders):
        return 2.0 * per_step_rdp("standard", sampling, sigma, orders)

    if name not in __import__("lightning_dprel.accounting", fromlist=["x"]).registered_mechanisms():
        register_mechanism(name, doubled, clipping=("standard",), label="standard ×2 (test)", coupled=True,
                           privacy_unit="entity",
                           description="twice Theorem C.1 (a looser bound, for the test)")
    module, dm = _module(sigma=1.5, clipping="standard", accounting=name), _dm()
    cb = PrivacyCallback(target_epsilon=80.0, delta=1e-5)
    quiet_trainer([cb], max_steps=4).fit(module, datamodule=dm)
    assert cb.mechanism == name and get_mechanism(name).label in cb.summary
    assert cb.epsilon == pytest.approx(_independent_eps(name, [(dm.sampling_spec, 1.5, 4)], 1e-5), rel=1e-12)
    assert cb.epsilon > _independent_eps("standard", [(dm.sampling_spec, 1.5, 4)], 1e-5)
    with pytest.raises(ValueError, match="does not bound clipping='freq'"):
        quiet_trainer([PrivacyCallback(target_epsilon=80.0)], max_steps=1).fit(_module(clipping="freq", accounting=name), datamodule=_dm())


def test_budget_is_a_pure_decision():
    dm = _dm()
    dm.setup("fit")
    spec = dm.sampling_spec
    acc = Accountant("standard")
    acc.step(spec, 1.5, 10)
    eps11 = _independent_eps("standard", [(spec, 1.5, 11)], 1e-5)
    assert PrivacyBudget(eps11, 1e-5).next_step(acc, spec, 1.5) == (False, None)  # ε_next only when stopping
    stop, nxt = PrivacyBudget(0.999 * eps11, 1e-5).next_step(acc, spec, 1.5)
    assert stop and nxt == pytest.approx(eps11, rel=1e-12) and acc.steps == 10  # asking changes nothing
    assert np.all(acc.rdp() == 10 * per_step_rdp("standard", spec, 1.5))
    with pytest.raises(ValueError, match="delta"):
        PrivacyBudget(1.0, 1.5)


def test_a_run_accounted_by_eq3_can_be_charged_with_the_corrected_bound_but_not_the_reverse():
    """Issue 15: the audit reports the corrected ε of a FREQ-CLIP run trained with the paper's accounting."""
    module, dm = _module(clipping="freq", accounting="paper"), _dm()
    with pytest.warns(UserWarning, match="Proposition 4.1"):  # the paper's Eq. 3 is named as such
        quiet_trainer([PrivacyCallback(target_epsilon=500.0, delta=1e-5)], max_steps=6).fit(module, datamodule=dm)
    ledger = module.privacy_ledger
    paper, corrected = ledger.epsilon(1e-5), ledger.epsilon(1e-5, mechanism="freq_corrected")
    assert corrected == pytest.approx(_independent_eps("freq_corrected", [(dm.sampling_spec, 1.5, 6)], 1e-5), rel=1e-9)
    assert corrected > paper
    module2, dm2 = _module(clipping="freq"), _dm()
    quiet_trainer([PrivacyCallback(target_epsilon=500.0, delta=1e-5)], max_steps=2).fit(module2, datamodule=dm2)
    with pytest.raises(ValueError, match="contradicts the module"):
        module2.privacy_ledger.epsilon(1e-5, mechanism="freq_paper")
