"""One protocol for every method: the ledger layer under each model, PrivacyCallback calibrating and refusing for DP-GPL's
releases as for DP-SGD steps, one export and report path, σ stored once in a calibrated, resumed checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import pytorch_lightning as pl
import torch

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.core.ledger_module import LedgerModule
from lightning_dprel.core.private_module import PrivateModule
from lightning_dprel.demos.boring_classes import quiet_trainer, tiny_prompt_dm
from lightning_dprel.methods.dp_gpl import DPGPLModule

# Φ is frozen (public, pre-trained) and kept in eval mode on purpose: Lightning's notice about it is expected.
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:Found .* module.* in eval mode")]
SMALL = dict(hidden_dim=16, pretrain_epochs=3, teacher_epochs=5, threshold=None)


def test_every_method_sits_on_the_ledger_layer():
    from lightning_dprel.methods.advsgm import DPSkipGramModule
    from lightning_dprel.methods.dp_gcn.module import DPNodeModule
    from lightning_dprel.methods.relational.module import DPRelationalModule

    for cls in (DPRelationalModule, DPNodeModule, DPSkipGramModule):
        assert issubclass(cls, PrivateModule) and issubclass(cls, LedgerModule)
    assert issubclass(DPGPLModule, LedgerModule) and not issubclass(DPGPLModule, PrivateModule)
    for name in ("charge", "privacy_report", "privacy_summary", "export", "epsilon"):  # one implementation, not overridden
        owners = {cls for cls in (DPRelationalModule, DPNodeModule, DPSkipGramModule, DPGPLModule) if name in vars(cls)}
        assert name in ("epsilon", "privacy_summary") or not owners, (name, owners)


def test_callback_refuses_a_dp_gpl_fit_whose_first_release_passes_the_budget():
    module = DPGPLModule(sigma_threshold=2.0, sigma_vote=2.0, **SMALL)  # 30 GNMax answers at σ = 2: far above ε = 1
    with pytest.raises(ValueError, match=r"would spend ε = .* > target_epsilon = 1.0 .*refused before the first release"):
        quiet_trainer([PrivacyCallback(target_epsilon=1.0, delta=1e-5)], max_epochs=2).fit(module, tiny_prompt_dm())
    assert module.answers is None and not module.privacy_ledger.segments  # nothing was answered, nothing charged


def test_callback_calibrates_dp_gpl_to_its_target_and_logs_epsilon():
    module = DPGPLModule(sigma_threshold=2.0, sigma_vote=2.0, **SMALL)
    callback = PrivacyCallback(target_epsilon=2.0, delta=1e-5, calibrate=True)
    trainer = quiet_trainer([callback], max_epochs=2)
    trainer.fit(module, tiny_prompt_dm())
    assert module.epsilon() == pytest.approx(2.0, rel=1e-6) and callback.epsilon == pytest.approx(2.0, rel=1e-6)
    assert module.sigmas[1] > 2.0  # the callback's calibration replaced the configured σ
    assert float(trainer.callback_metrics["epsilon"]) == pytest.approx(2.0, rel=1e-5)
    assert "over 1 releases" in callback.summary or "releases" in callback.summary
    summary = module.privacy_summary(target=2.0)["text"]
    assert summary.startswith("epsilon = 2.0000 (delta = 1e-05, unit: labelled node)")


def test_callback_clip_norm_is_refused_for_a_model_without_dp_sgd_steps():
    module = DPGPLModule(sigma_threshold=2.0, sigma_vote=2.0, **SMALL)
    callback = PrivacyCallback(target_epsilon=2.0, delta=1e-5, clip_norm=1.0)
    with pytest.raises(ValueError, match=r"clip_norm=1\) .* DPGPLModule takes no DP-SGD steps"):
        quiet_trainer([callback], max_epochs=2).fit(module, tiny_prompt_dm())
    assert module.answers is None and not module.privacy_ledger.segments


def test_untracked_private_dp_gpl_fit_is_refused_before_any_release():
    module = DPGPLModule(sigma_threshold=40.0, sigma_vote=40.0, **SMALL)
    with pytest.raises(RuntimeError, match="no PrivacyCallback"):
        quiet_trainer(max_epochs=2).fit(module, tiny_prompt_dm())
    assert module.answers is None and not module.privacy_ledger.segments


@pytest.mark.filterwarnings("ignore:DPGPLModule. private fit without a PrivacyCallback")
def test_dp_gpl_refuses_delta_not_below_one_over_n():
    dm = tiny_prompt_dm()
    module = DPGPLModule(sigma_threshold=40.0, sigma_vote=40.0, delta=0.05, allow_untracked=True, **SMALL)
    with pytest.raises(ValueError, match=r"DPGPLModule: δ = 0.05 is not below 1/n = .* \(n = \d+ labelled nodes\)"):
        quiet_trainer(max_epochs=1).fit(module, dm)
    assert module.privacy_ledger.steps == 0 and not module.privacy_ledger.segments


def test_export_has_one_path_for_every_method(tmp_path):
    from lightning_dprel.export import export_main

    module = DPGPLModule(sigma_threshold=40.0, sigma_vote=40.0, **SMALL)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path,
                         callbacks=[PrivacyCallback(delta=1e-5)])
    trainer.fit(module, tiny_prompt_dm())
    trainer.save_checkpoint(tmp_path / "gpl.ckpt")
    out = export_main(["--ckpt_path", str(tmp_path / "gpl.ckpt"), "--out", str(tmp_path / "gpl")])
    meta, privacy = (json.loads((out / f).read_text()) for f in ("model.json", "privacy.json"))
    assert meta["format"] == "lightning_dprel.export/1" and meta["class_path"].endswith("DPGPLModule")
    assert privacy["epsilon"] == pytest.approx(module.epsilon()) and math.isfinite(privacy["epsilon"])


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")  # the resumed run saves beside the first
def test_a_calibrated_resumed_checkpoint_stores_sigma_once(tmp_path):
    from lightning_dprel.demos.boring_classes import tiny_relational_dm
    from lightning_dprel.encoders import MLPEncoder
    from lightning_dprel.methods.relational.module import DPRelationalModule
    from pytorch_lightning.callbacks import ModelCheckpoint

    def fit(ckpt=None):
        torch.manual_seed(0)
        module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=4), clipping="standard", noise_multiplier=0.5, lr=1e-2)
        saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, filename="{step}")
        trainer = pl.Trainer(max_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=0,
                             callbacks=[PrivacyCallback(target_epsilon=8.0, delta=1e-4, calibrate=True), saver])
        trainer.fit(module, tiny_relational_dm(), ckpt_path=ckpt)
        return module, trainer

    first, _ = fit()
    resumed, trainer = fit(str(tmp_path / "step=2.ckpt"))
    sigma = resumed.noise_spec.noise_multiplier
    assert sigma == first.noise_spec.noise_multiplier != 0.5
    trainer.save_checkpoint(tmp_path / "resumed.ckpt")
    checkpoint = torch.load(tmp_path / "resumed.ckpt", weights_only=False)
    checkpoint["lightning_dprel"].pop("ledger")  # the ledger records σ per segment: what was spent, not a setting

    def places(obj, path=""):
        if isinstance(obj, dict):
            return [p for k, v in obj.items() for p in places(v, f"{path}/{k}")]
        if isinstance(obj, (list, tuple)):
            return [p for i, v in enumerate(obj) for p in places(v, f"{path}/{i}")]
        return [path] if isinstance(obj, float) and obj == sigma else []

    found = places({k: v for k, v in checkpoint.items() if k != "state_dict"})
    assert found == ["/optimizer_states/0/noise_spec/noise_multiplier"], found


def test_a_subclass_that_answers_without_charging_is_refused_before_training():
    class Uncharged(DPGPLModule):
        def charge(self, event):  # answers the queries but drops every charge
            pass

    module = Uncharged(sigma_threshold=40.0, sigma_vote=40.0, **SMALL)
    with pytest.raises(RuntimeError, match="releases were made without being charged"):
        quiet_trainer([PrivacyCallback(delta=1e-5)], max_epochs=1).fit(module, tiny_prompt_dm())
    assert module.global_step == 0  # the student never trained on the uncharged answers


def test_planned_releases_for_another_unit_are_refused():
    from lightning_dprel.core.events import GaussianRelease

    class OtherUnit(DPGPLModule):
        def planned_releases(self):
            return [GaussianRelease(40.0, "entity")] if self.answers is None else []

    with pytest.raises(ValueError, match="unit"):
        quiet_trainer([PrivacyCallback(delta=1e-5)], max_epochs=1).fit(OtherUnit(sigma_threshold=40.0, sigma_vote=40.0, **SMALL),
                                                                      tiny_prompt_dm())
