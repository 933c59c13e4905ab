"""Recipe 1 under 2-process DDP (gloo, ``ddp_spawn``): the same ε and the same released sums as one process.

Both runs draw the same global Poisson samples (one public seed, for the comparison only); each rank keeps its share and
the DP optimizer all-reduces the clipped sums before the noise, so the sum the noise is added to, σ and b, hence the
released sum's distribution and the ε, equal the single process's.
"""

from __future__ import annotations


import pytest
import torch
from torch.utils.data import TensorDataset

from ddp_helpers import assert_two_ranks_release_as_one, fit_saving_releases
from lightning_dprel import DPDataLoader
from projects.tabular_classifier import MLPClassifier

pytestmark = pytest.mark.filterwarnings("ignore:DPDataLoader\\(seed=5\\)")


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 8, generator=g)
    y = (x[:, 0] > 0).long()
    loader = DPDataLoader(TensorDataset(x, y), batch_size=30, seed=5)
    fit_saving_releases(folder, devices, strategy, MLPClassifier(8, 2), steps=4, train_dataloaders=loader)


@pytest.mark.slow
def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    assert_two_ranks_release_as_one(tmp_path, steps=4)
