"""Recipe 1 under 2-process DDP (gloo, ``ddp_spawn``): the same ε and the same released sums as one process.

Both runs draw the same global Poisson samples (one public seed, for the comparison only); each rank keeps its share and
the DP optimizer all-reduces the clipped sums before the noise, so the sum the noise is added to, σ and b, hence the
released sum's distribution and the ε, equal the single process's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pytorch_lightning import Trainer
from torch.utils.data import TensorDataset

from ddp_helpers import ReleaseGroupAtTeardown, SaveReleasedSums, assert_two_ranks_release_as_one
from lightning_dprel import DPDataLoader, PrivacyCallback
from projects.tabular_classifier import MLPClassifier

pytestmark = pytest.mark.filterwarnings("ignore:DPDataLoader\\(seed=5\\)")


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 8, generator=g)
    y = (x[:, 0] > 0).long()
    loader = DPDataLoader(TensorDataset(x, y), batch_size=30, seed=5)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=4, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, callbacks=[PrivacyCallback(delta=1e-5, clip_norm=0.5, noise_multiplier=1.2),
                                                      SaveReleasedSums(folder), ReleaseGroupAtTeardown()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLPClassifier(8, 2), loader)


def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    assert_two_ranks_release_as_one(tmp_path, steps=4)
