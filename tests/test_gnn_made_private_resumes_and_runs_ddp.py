"""Recipe 3 (a PyG GNN made private on DP-GCN's subgraphs, node level): resuming continues ε exactly and never replays
noise; two gloo processes release the same clipped sums and ε as one.

The project is the one in tests/test_pyg_gnn_made_private.py (``NodeClassifier``: its GCN and training_step as they
were), on ``NodeSplitDataModule(as_pyg_batches=True)``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from ddp_helpers import ReleaseGroupAtTeardown
from lightning_dprel import NodeSplitDataModule, PrivacyCallback
from lightning_dprel.accounting import Accountant
from lightning_dprel.core.optim import DPOptimizer
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
    drawn = []
    original = DPOptimizer.draw_noise
    monkeypatch.setattr(DPOptimizer, "draw_noise", lambda self, device=None: drawn.append(original(self, device)) or drawn[-1])
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


class SaveReleases(Callback):
    def __init__(self, folder):
        self.folder, self.sums = folder, []

    def on_train_start(self, trainer, pl_module):
        self.privacy = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
        dp = self.privacy._layer.dp
        original = dp.add_noise
        dp.add_noise = lambda summed, noise="draw": self.sums.append(
            torch.cat([t.reshape(-1) for t in summed.values()]).clone()) or original(summed, noise)

    def on_train_end(self, trainer, pl_module):
        torch.save({"sums": self.sums, "epsilon": self.privacy.epsilon, "steps": self.privacy.steps},
                   f"{self.folder}/rank{trainer.global_rank}_of{trainer.world_size}.pt")


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    trainer = Trainer(devices=devices, strategy=strategy, max_steps=3, enable_checkpointing=False,
                      callbacks=[PrivacyCallback(delta=1e-5, clip_norm=0.5, noise_multiplier=1.2), SaveReleases(folder),
                                 ReleaseGroupAtTeardown()], **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_model(), datamodule=_dm(seed=7))


def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    single = torch.load(tmp_path / "rank0_of1.pt")
    ranks = [torch.load(tmp_path / f"rank{r}_of2.pt") for r in (0, 1)]
    assert single["steps"] == ranks[0]["steps"] == ranks[1]["steps"] == 3
    assert single["epsilon"] == pytest.approx(ranks[0]["epsilon"], rel=1e-12) == ranks[1]["epsilon"]
    torch.testing.assert_close(ranks[0]["sums"][0], single["sums"][0], atol=1e-5, rtol=1e-5)  # same init, same sample
    assert single["sums"][0].norm() > 0
    for a, b in zip(ranks[0]["sums"], ranks[1]["sums"]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
