"""The coupled training stream on a keyed CSPRNG (issue 11): per-step children, O(1) seek, key-free state, DDP."""

from __future__ import annotations

import io
import json
import time

import pytest
import torch
from ddp_helpers import gloo_group, run_script, spawn

from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.coupled_stream import SAMPLING_TAG
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import tiny_relational_dm
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.edge_tuples.sampling import neg_sample_wor, poisson_positives

# Most streams here are seeded on purpose; the public-seed warning itself is asserted below and in test_secret_randomness.
pytestmark = pytest.mark.filterwarnings(r"ignore:RelationalDataModule\(sampling_seed=<int>\):UserWarning")
GRAPH = random_feature_graph(200, 600, seed=1)


def _key(dm: RelationalDataModule) -> bytes:
    key = dm._randomness._key
    assert isinstance(key, bytes) and len(key) == 32, "the stream should be keyed after a draw"
    return key


def _same(a, b) -> bool:
    return a.step == b.step and torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg) and torch.equal(a.neg_anchor, b.neg_anchor)


def test_step_t_is_drawn_from_two_children_of_the_keyed_stream():
    dm = tiny_relational_dm(sampling_seed=11)
    spec = dm.sampling_spec
    root = KeyedStream.seeded(11, SAMPLING_TAG, warn=False)
    for step in (0, 5, 123):
        idx = poisson_positives(spec.num_edges, spec.sampling_rate, generator=root.child(step, "positives"))
        neg, anchor = neg_sample_wor(idx.numel(), spec.neg_per_pos, spec.num_nodes, generator=root.child(step, "negatives"))
        pos, got_neg, got_anchor = dm.draw_global(step)
        assert torch.equal(pos, dm.train_edges[:, idx].t()) and torch.equal(got_neg, neg) and torch.equal(got_anchor, anchor)
    assert root.counter == 0 and dm._randomness.counter == 0  # children never move the root's counter


def test_seek_is_constant_time_and_matches_the_uninterrupted_stream():
    dm = tiny_relational_dm(sampling_seed=5)
    whole = [b for _ in range(3) for b in dm.train_dataloader()]
    other = tiny_relational_dm(sampling_seed=5)
    other.seek(1, 3)
    assert all(_same(a, b) for a, b in zip(whole[7:], list(other.train_dataloader()) + list(other.train_dataloader())))
    far = tiny_relational_dm(sampling_seed=5)
    start = time.perf_counter()
    far.seek(10**9, 2)  # no replay: a billion epochs ahead costs one draw
    batch = next(iter(far.train_dataloader()))
    assert batch.step == 4 * 10**9 + 2 and time.perf_counter() - start < 5.0


def test_seeded_resume_draws_the_uninterrupted_batches():
    dm = tiny_relational_dm(sampling_seed=9)
    it = iter(dm.train_dataloader())
    next(it), next(it)
    state = dm.state_dict()
    assert state["stream"] == {"tag": SAMPLING_TAG, "seed": 9, "counter": 0}
    assert (state["epoch"], state["index"]) == (0, 2) and "sampling_seed" not in state
    rest = [next(it), next(it)] + list(dm.train_dataloader())
    resumed = tiny_relational_dm(sampling_seed=9)
    resumed.load_state_dict(state)
    again = list(resumed.train_dataloader()) + list(resumed.train_dataloader())
    assert [b.step for b in again] == [2, 3, 4, 5, 6, 7] and all(_same(a, b) for a, b in zip(rest, again))


def test_secret_state_holds_no_key_and_a_resumed_secret_stream_draws_fresh_batches():
    dm = tiny_relational_dm()
    it = iter(dm.train_dataloader())
    next(it), next(it)
    key, state = _key(dm), dm.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    assert key not in buf.getvalue() and key.hex() not in repr(state)
    assert state["stream"] == {"tag": SAMPLING_TAG, "seed": None, "counter": 0} and "sampling_seed" not in state
    rest = [next(it), next(it)]
    resumed = tiny_relational_dm()
    resumed.load_state_dict(state)
    again = list(resumed.train_dataloader())
    assert [b.step for b in again] == [2, 3]  # the position resumes ...
    assert _key(resumed) != key and not all(_same(a, b) for a, b in zip(rest, again))  # ... with a fresh key


def test_a_secret_and_a_seeded_stream_do_not_resume_each_other():
    secret, seeded = tiny_relational_dm(), tiny_relational_dm(sampling_seed=4)
    with pytest.raises(ValueError, match=r"drawn with secret \(sampling_seed=None\), this datamodule's with sampling_seed=4"):
        seeded.load_state_dict(secret.state_dict())
    with pytest.raises(ValueError, match=r"drawn with sampling_seed=4, this datamodule's with secret"):
        secret.load_state_dict(seeded.state_dict())
    with pytest.raises(ValueError, match=r"drawn with sampling_seed=4, this datamodule's with sampling_seed=5"):
        tiny_relational_dm(sampling_seed=5).load_state_dict(seeded.state_dict())
    old = {"version": 2, "seed": 3, "sampling_seed": 1, "epoch": 0, "index": 1}  # an mt19937-era checkpoint
    with pytest.raises(ValueError, match=r"state version 2, this datamodule reads version 3.*keyed CSPRNG"):
        secret.load_state_dict(old)


def test_state_loaded_before_setup_is_applied_at_setup():
    dm = tiny_relational_dm(sampling_seed=2)
    dm.seek(2, 1)
    with pytest.warns(UserWarning, match=r"sampling_seed=<int>\) makes the training batches reproducible"):
        early = RelationalDataModule(GRAPH, expected_batch_size=8, neg_per_pos=2, seed=3, steps_per_epoch=4, sampling_seed=2)
    early.load_state_dict(dm.state_dict())
    assert early.state_dict()["epoch"] == 2
    early.setup("fit")
    assert _same(next(iter(early.train_dataloader())), next(iter(dm.train_dataloader())))


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`")  # Rec: training only
def test_trainer_checkpoint_of_a_secret_stream_holds_no_key(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    class Rec(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return (self.w - float(batch.size)).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dm = tiny_relational_dm()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
               devices=1, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[ckpt]).fit(Rec(), datamodule=dm)
    key = _key(dm)
    (path,) = [p for p in tmp_path.iterdir() if "step=3" in p.name]
    raw = path.read_bytes()
    assert key not in raw and key.hex().encode() not in raw
    saved = torch.load(path, weights_only=False)
    assert saved["RelationalDataModule"]["stream"]["seed"] is None and saved["RelationalDataModule"]["index"] == 3


_DDP_SCRIPT = """
import json, sys, torch
import pytorch_lightning as pl
from ddp_helpers import ReleaseGroupAtTeardown
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph

class Rec(pl.LightningModule):
    def __init__(self, out):
        super().__init__()
        self.w, self.out, self.seen = torch.nn.Parameter(torch.zeros(1)), out, []
    def training_step(self, batch, batch_idx):
        self.seen.append([batch.step, batch.pos.tolist(), batch.global_size])
        return (self.w - float(batch.size)).pow(2).sum()
    def on_train_end(self):
        draws = [self.trainer.datamodule.draw_global(s)[0].tolist() for s, _, _ in self.seen]
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump({"seen": self.seen, "global": draws}, f)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    torch.manual_seed(0)
    dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), expected_batch_size=20, neg_per_pos=2, seed=3,
                              steps_per_epoch=4)  # sampling_seed=None: a secret key per run, rank 0's on every rank
    pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
               num_sanity_val_steps=0, callbacks=[ReleaseGroupAtTeardown()]).fit(Rec(sys.argv[1]), datamodule=dm)
"""


@pytest.mark.slow
@pytest.mark.slow
def test_ddp_ranks_draw_the_same_global_batch_from_a_secret_stream(tmp_path):
    """Two gloo ranks (Lightning ddp_spawn), each with its own os.urandom: rank 0's key reaches both."""
    run_script(_DDP_SCRIPT, tmp_path)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["global"] == r1["global"] and len(r0["seen"]) == len(r1["seen"]) == 4
    for whole, a, b in zip(r0["global"], r0["seen"], r1["seen"]):
        assert a[0] == b[0] and a[2] == b[2] == len(whole)
        assert a[1] + b[1] == whole  # each rank's contiguous slice of the one global batch
    assert any(len(w) for w in r0["global"])


def _rekey_worker(rank: int, world: int, port: int, folder: str) -> None:
    dm = tiny_relational_dm(expected_batch_size=20)  # set up before the process group: a draw now keys this rank alone
    alone = dm.draw_global(0)[0]
    with gloo_group(rank, world, port):
        dm.setup("fit")  # Lightning calls setup on every rank: the stream takes rank 0's key here
        shared = [dm.draw_global(t)[0] for t in range(3)]
        torch.save({"alone": alone, "shared": shared}, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_ddp_setup_replaces_a_key_a_rank_drew_alone(tmp_path):
    spawn(_rekey_worker, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert not torch.equal(r0["alone"], r1["alone"])  # each rank's own os.urandom key before DDP started
    assert all(torch.equal(a, b) for a, b in zip(r0["shared"], r1["shared"]))
