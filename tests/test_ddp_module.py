"""Two CPU processes (gloo, Lightning ``ddp_spawn``) take the same private steps as one process.

Every rank sees its slice of the same global batches (``max_freq`` counted on the global batch); the
clipped sums are all-reduced and the noise, drawn from the same seeded generator on every rank, is added
once. After several steps the parameters must equal those of a single process on the same batches.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_lightning import Callback, LightningDataModule, Trainer
from torch.utils.data import DataLoader

from ddp_helpers import ReleaseGroupAtTeardown
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.demos.tuple_batches import build_tuple_batch, sample_coupled

STEPS = 5


def _identity(x):
    return x


def _global_batches():
    graph = random_feature_graph(num_nodes=80, num_edges=200, dim=8, seed=1)
    g = torch.Generator().manual_seed(3)
    out = []
    for s in range(STEPS):
        rate = 1.0 / 200 if s == 1 else 12.0 / 200  # step 1: at most a tuple, so a rank's slice is empty
        pos, neg, anchor = sample_coupled(graph.edge_index, 80, rate=rate, k=3, generator=g)
        out.append((pos, neg, anchor))
    return graph.x, out


class SlicedBatches(LightningDataModule):
    """Each rank takes its contiguous slice of every global batch."""

    def train_dataloader(self):
        x, batches = _global_batches()
        rank, world = self.trainer.global_rank, self.trainer.world_size
        items = [build_tuple_batch(p, n, a, {"x": x}, expected_batch_size=12.0, rank=rank, world_size=world, step=s)
                 for s, (p, n, a) in enumerate(batches)]
        return DataLoader(items, batch_size=None, collate_fn=_identity)


class SaveParams(Callback):
    def __init__(self, folder):
        self.folder = folder

    def on_train_end(self, trainer, pl_module):
        params = {n: p.detach().clone() for n, p in pl_module.encoder.named_parameters()}
        torch.save({"params": params, "steps": pl_module.privacy_ledger.steps},
                   f"{self.folder}/rank{trainer.global_rank}_of{trainer.world_size}.pt")


def _fit(devices, strategy, folder):
    torch.manual_seed(0)
    module = DPRelationalModule(MLPEncoder(8, hidden_dim=16, out_dim=8), lr=0.05, noise_multiplier=0.8, noise_seed=21,
                                allow_untracked=True)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=1, use_distributed_sampler=False,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[SaveParams(folder), ReleaseGroupAtTeardown()])
    trainer.fit(module, datamodule=SlicedBatches())


@pytest.mark.filterwarnings(  # a seeded, untracked fit of a training-only datamodule: ranks and one process compared
    "ignore:DPRelationalModule(\\(noise_seed=<int>\\)|. private fit without a PrivacyCallback|. no SamplingSpec)",
    "ignore:You defined a `validation_step` but have no `val_dataloader`",
)
@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path):
    _fit(1, "auto", tmp_path)
    _fit(2, "ddp_spawn", tmp_path)
    single = torch.load(tmp_path / "rank0_of1.pt")
    ranks = [torch.load(tmp_path / f"rank{r}_of2.pt") for r in (0, 1)]
    assert single["steps"] == ranks[0]["steps"] == ranks[1]["steps"] == STEPS
    for name, want in single["params"].items():
        torch.testing.assert_close(ranks[0]["params"][name], ranks[1]["params"][name], atol=0, rtol=0)  # ranks agree
        torch.testing.assert_close(ranks[0]["params"][name], want, atol=1e-5, rtol=1e-5)
    moved = torch.manual_seed(0) and MLPEncoder(8, hidden_dim=16, out_dim=8)
    assert any(not torch.allclose(p, single["params"][n]) for n, p in moved.named_parameters())
