"""Recipe 1 under 2-process DDP (gloo, ``ddp_spawn``): the same ε and the same released sums as one process.

Both runs draw the same global Poisson samples (one public seed, for the comparison only); each rank keeps its share and
the DP optimizer all-reduces the clipped sums before the noise, so the sum the noise is added to, σ and b, hence the
released sum's distribution and the ε, equal the single process's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from torch.utils.data import TensorDataset

from ddp_helpers import ReleaseGroupAtTeardown
from lightning_dprel import DPDataLoader, PrivacyCallback
from projects.tabular_classifier import MLPClassifier

pytestmark = pytest.mark.filterwarnings("ignore:DPDataLoader\\(seed=5\\)")


class SaveReleases(Callback):
    """Record, per step, the clipped global sum the noise is added to (after the all-reduce), σ·C, and the final ε."""

    def __init__(self, folder):
        self.folder, self.sums = folder, []

    def on_train_start(self, trainer, pl_module):
        privacy = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
        dp, original = privacy._layer.dp, privacy._layer.dp.add_noise

        def add_noise(summed, noise="draw"):
            self.sums.append(torch.cat([t.reshape(-1) for t in summed.values()]).clone())
            return original(summed, noise)

        dp.add_noise, self.privacy = add_noise, privacy

    def on_train_end(self, trainer, pl_module):
        torch.save({"sums": self.sums, "epsilon": self.privacy.epsilon, "steps": self.privacy.steps,
                    "std": self.privacy._layer.dp.noise_multiplier * self.privacy._layer.dp.clip_norm},
                   f"{self.folder}/rank{trainer.global_rank}_of{trainer.world_size}.pt")


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 8, generator=g)
    y = (x[:, 0] > 0).long()
    loader = DPDataLoader(TensorDataset(x, y), batch_size=30, seed=5)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=4, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, callbacks=[PrivacyCallback(delta=1e-5, clip_norm=0.5, noise_multiplier=1.2),
                                                      SaveReleases(folder), ReleaseGroupAtTeardown()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLPClassifier(8, 2), loader)


def test_two_process_ddp_releases_what_one_process_releases(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    single = torch.load(tmp_path / "rank0_of1.pt")
    ranks = [torch.load(tmp_path / f"rank{r}_of2.pt") for r in (0, 1)]
    assert single["steps"] == ranks[0]["steps"] == ranks[1]["steps"] == 4
    assert single["epsilon"] == pytest.approx(ranks[0]["epsilon"], rel=1e-12) == ranks[1]["epsilon"]
    assert single["std"] == ranks[0]["std"] == 0.6
    assert len(single["sums"]) == 4
    # The first step's parameters are equal (same init), so its clipped global sums are equal on every rank and to one process's.
    torch.testing.assert_close(ranks[0]["sums"][0], single["sums"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ranks[1]["sums"][0], single["sums"][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(ranks[0]["sums"], ranks[1]["sums"]):  # the ranks agree on every step (one global sum)
        torch.testing.assert_close(a, b, atol=0, rtol=0)
