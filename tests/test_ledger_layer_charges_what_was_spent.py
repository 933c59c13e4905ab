"""The ledger layer charges what was spent: batches drawn at another b than the accounted spec are refused, a loaded
ledger re-checks its mechanism, data releases reach DP-GPL too, and privacy.json names the σ the votes used."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.core.events import GaussianRelease, StepRecord
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec
from lightning_dprel.demos.boring_classes import quiet_trainer, tiny_prompt_dm, tiny_relational_dm
from lightning_dprel.demos.specs import make_spec

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
SMALL = dict(hidden_dim=16, pretrain_epochs=3, teacher_epochs=5, threshold=None)


def test_batches_drawn_at_another_b_than_the_accounted_spec_are_refused():
    """At 7ac3611 the ledger refused a step whose batch b differed from the SamplingSpec's; private_step now takes b from
    the spec, so batches drawn at q = 0.17 are accounted at q = 0.005 (ε 7.2 reported, 44 spent)."""
    from lightning_dprel.encoders import MLPEncoder
    from lightning_dprel.methods.relational.module import DPRelationalModule

    real = tiny_relational_dm(expected_batch_size=32)

    class NoSpec(pl.LightningDataModule):  # a user's datamodule that does not expose sampling_spec
        def train_dataloader(self):
            return real.train_dataloader()

    accounted = SamplingSpec(**{**real.sampling_spec.to_dict(), "expected_batch_size": 1.0,
                                "sampling_rate": 1.0 / real.sampling_spec.num_edges})
    torch.manual_seed(0)
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=4), clipping="standard", noise_multiplier=1.0, lr=1e-2)
    with pytest.raises(RuntimeError, match="b = 32"):
        quiet_trainer([PrivacyCallback(delta=1e-4, sampling_spec=accounted)], max_steps=4).fit(module, datamodule=NoSpec())


def test_loading_a_ledger_forgets_the_mechanism_checked_for_the_fit():
    """A loaded state with steps of another mechanism must not inherit the live fit's (mechanism, clipping) check."""
    spec = make_spec()
    b = spec.expected_batch_size
    freq, standard = NoiseSpec(1.0, 1.0, clipping="freq"), NoiseSpec(1.0, 1.0, clipping="standard")
    saved = PrivacyLedger()
    saved.open(spec)
    saved.charge(StepRecord.from_spec(standard, b))
    live = PrivacyLedger()
    live.open(spec)
    live.charge(StepRecord.from_spec(freq, b))  # checks (freq_corrected, freq) for this fit
    live.load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match="already spent 1 private steps accounted with 'standard'"):
        live.charge(StepRecord.from_spec(freq, b))


def test_dp_gpl_is_charged_for_releases_recorded_on_its_data():
    """A release recorded on a PromptDataModule travels with the data like any other (ledger layer contract)."""
    from lightning_dprel.methods.dp_gpl import DPGPLModule

    dm = tiny_prompt_dm()
    unit = dm.privacy_unit if isinstance(dm.privacy_unit, str) else dm.privacy_unit.name
    release_id = dm.record_release(GaussianRelease(noise_multiplier=1.0, unit=unit, count=5))
    module = DPGPLModule(sigma_threshold=40.0, sigma_vote=40.0, **SMALL)
    quiet_trainer([PrivacyCallback(delta=1e-5)], max_epochs=1).fit(module, dm)
    assert release_id in module.privacy_ledger.state_dict()["data_releases"]


def test_dp_gpl_privacy_json_from_a_checkpoint_names_the_calibrated_sigma(tmp_path):
    """privacy.json exported from the checkpoint of a callback-calibrated DP-GPL fit must give the σ the votes used."""
    from lightning_dprel.export import export_main
    from lightning_dprel.methods.dp_gpl import DPGPLModule

    module = DPGPLModule(sigma_threshold=2.0, sigma_vote=2.0, **SMALL)
    trainer = quiet_trainer([PrivacyCallback(target_epsilon=2.0, delta=1e-5, calibrate=True)], max_epochs=1)
    trainer.fit(module, tiny_prompt_dm())
    used = module.sigmas[1]
    trainer.save_checkpoint(tmp_path / "gpl.ckpt")
    out = export_main(["--ckpt_path", str(tmp_path / "gpl.ckpt"), "--out", str(tmp_path / "gpl")])
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["sigma_vote"] == pytest.approx(used)
