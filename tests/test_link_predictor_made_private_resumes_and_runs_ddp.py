"""Recipe 2 (a PyG link predictor made private, entity level): resuming continues ε exactly and never replays noise;
two gloo processes release the same clipped sums and ε as one.

The project is the one in tests/test_pyg_link_predictor_made_private.py (``LinkPredictor``: its training_step as it
was), on ``LinkPredictionDataModule``'s coupled tuples.
"""

from __future__ import annotations


import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from ddp_helpers import assert_two_ranks_release_as_one, fit_saving_releases, record_noise_draws
from lightning_dprel.accounting import Accountant
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import LinkPredictionDataModule
from test_pyg_link_predictor_made_private import LinkPredictor, _graphs

pytestmark = pytest.mark.filterwarnings("ignore:.*sampling_seed=<int>.*", "ignore:.*does not have many workers.*",
                                        "ignore:Be aware that when using `ckpt_path`")
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", limit_val_batches=0,
             num_sanity_val_steps=0)


def _dm(seed=None):
    return LinkPredictionDataModule(_graphs(0)[0], expected_batch_size=32, neg_per_pos=1, sampling_seed=seed)


def test_resume_continues_epsilon_exactly_and_draws_fresh_noise(tmp_path, monkeypatch):
    drawn = record_noise_draws(monkeypatch)
    torch.manual_seed(0)
    first = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.2)
    Trainer(max_steps=6, callbacks=[first, ModelCheckpoint(dirpath=tmp_path, save_last=True)], **QUIET).fit(
        LinkPredictor(16), datamodule=_dm())
    before = list(drawn)
    second = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.2)
    Trainer(max_steps=10, callbacks=[second], enable_checkpointing=False, **QUIET).fit(
        LinkPredictor(16), datamodule=_dm(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert first.steps == 6 and second.steps == 10  # the checkpoint's ledger holds the first fit's 6 steps
    reference = Accountant("standard")
    reference.step(_dm_spec(), 1.2, 10)
    assert second.epsilon == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert len(drawn) == 10 and not any(torch.equal(a, b) for a in before for b in drawn[6:])


def _dm_spec():
    dm = _dm()
    dm.setup("fit")
    return dm.sampling_spec


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    fit_saving_releases(folder, devices, strategy, LinkPredictor(16), steps=3, datamodule=_dm(seed=11))


@pytest.mark.slow
def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    assert_two_ranks_release_as_one(tmp_path, steps=3)
