"""Recipe 3 (a PyG GNN made private on DP-GCN's subgraphs, node level): resuming continues ε exactly and never replays
noise; two gloo processes release the same clipped sums and ε as one.

The project is the one in tests/test_pyg_gnn_made_private.py (``NodeClassifier``: its GCN and training_step as they
were), on ``NodeSplitDataModule(as_pyg_batches=True)``.
"""

from __future__ import annotations


import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from ddp_helpers import assert_two_ranks_release_as_one, fit_saving_releases, record_noise_draws
from lightning_dprel import NodeSplitDataModule, PrivacyCallback
from lightning_dprel.accounting import Accountant
from lightning_dprel.datamodules.datasets import InMemoryNodes
from test_pyg_gnn_made_private import NodeClassifier, _graph

pytestmark = pytest.mark.filterwarnings("ignore:.*sampling_seed=<int>.*", "ignore:.*does not have many workers.*",
                                        "ignore:Be aware that when using `ckpt_path`", "ignore:.*NodeSplitDataModule\\(",
                                        # mid-epoch resume: the datamodule's own state (step, stream) resumes the sampling
                                        "ignore:.*your dataloader is not resumable.*")
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", limit_val_batches=0,
             num_sanity_val_steps=0)
DATA = _graph(0, n=300)


def _dm(seed=None):
    return NodeSplitDataModule(InMemoryNodes(DATA), num_splits=40, sampling_rate=0.25, as_pyg_batches=True,
                               sampling_seed=seed)


def _model():
    return NodeClassifier(DATA.num_features, int(DATA.num_classes), dropout=0.0)


def test_resume_continues_epsilon_exactly_and_draws_fresh_noise(tmp_path, monkeypatch):
    drawn = record_noise_draws(monkeypatch)
    torch.manual_seed(0)
    first = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.5)
    Trainer(max_steps=3, callbacks=[first, ModelCheckpoint(dirpath=tmp_path, save_last=True)], **QUIET).fit(
        _model(), datamodule=_dm())
    before = list(drawn)
    second = PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.5)
    dm = _dm()
    Trainer(max_steps=6, callbacks=[second], enable_checkpointing=False, **QUIET).fit(
        _model(), datamodule=dm, ckpt_path=str(tmp_path / "last.ckpt"))
    assert first.steps == 3 and second.steps == 6
    reference = Accountant("subgraph_replace")
    reference.step(dm.sampling_spec, 1.5, 6)
    assert second.epsilon == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert len(drawn) == 6 and not any(torch.equal(a, b) for a in before for b in drawn[3:])


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    fit_saving_releases(folder, devices, strategy, _model(), steps=3, datamodule=_dm(seed=7))


@pytest.mark.slow
def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    assert_two_ranks_release_as_one(tmp_path, steps=3)
