"""A secret keyed stream never produces the same (key, counter) bytes twice — resume or not, same process or not.

Replayed noise on different batches would release the noiseless difference of two clipped sums (ε = ∞) while
each branch's ledger reports a finite ε.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.randomness import KeyedStream

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|does not have many workers|δ = |ckpt_path|ModelCheckpoint).*")

GRAPH = random_feature_graph(num_nodes=200, num_edges=600, dim=8, seed=0)


def test_loading_an_earlier_position_into_a_secret_stream_draws_new_bytes():
    stream = KeyedStream.secret("noise")
    saved = stream.state_dict()
    first = [stream.normal(64) for _ in range(6)]
    stream.load_state_dict(saved)
    again = [stream.normal(64) for _ in range(6)]
    assert stream.counter == 6 and saved["counter"] == 0
    assert not any(torch.equal(a, b) for a in first for b in again)


def test_a_seeded_stream_still_resumes_exactly():
    with pytest.warns(UserWarning, match="public seed"):
        stream = KeyedStream.seeded(3, "noise")
    stream.normal(8)
    saved = stream.state_dict()
    a = stream.normal(8)
    stream.load_state_dict(saved)
    assert torch.equal(a, stream.normal(8))


def _recording(module: DPRelationalModule) -> list[torch.Tensor]:
    drawn: list[torch.Tensor] = []
    normal = module.noise_source.normal

    def record(*args, **kwargs):
        out = normal(*args, **kwargs)
        drawn.append(out.clone())
        return out

    module.noise_source.normal = record  # the DP optimizer draws from the module's stream
    return drawn


def test_a_module_resuming_from_its_own_checkpoint_in_this_process_draws_fresh_noise(tmp_path):
    torch.manual_seed(0)
    module = DPRelationalModule(MLPEncoder(8, hidden_dim=8, out_dim=8), clipping="standard", noise_multiplier=1.0)
    assert module.noise_source.is_secret
    drawn = _recording(module)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    dm = RelationalDataModule(GRAPH, expected_batch_size=8, neg_per_pos=1, max_degree=4)
    quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5), ckpt], max_steps=6, enable_checkpointing=True).fit(module, datamodule=dm)
    first = list(drawn)
    drawn.clear()
    branch = RelationalDataModule(GRAPH, expected_batch_size=8, neg_per_pos=1, max_degree=4)  # other batches
    quiet_trainer([PrivacyCallback(target_epsilon=50.0, delta=1e-5)], max_steps=6).fit(
        module, datamodule=branch, ckpt_path=str(tmp_path / "step=3.ckpt"))
    assert len(first) == 6 and len(drawn) == 3 and module.privacy_ledger.private_steps == 6
    replayed = sum(any(torch.equal(a, b) for a in first) for b in drawn)
    assert replayed == 0, f"{replayed} of {len(drawn)} resumed steps replayed noise of the first run"


def test_copies_and_pickles_of_a_secret_stream_never_carry_its_key():
    import copy
    import io
    import pickle

    stream = KeyedStream.secret("noise")
    drawn = stream.normal(32)
    key = stream.key_now()
    copied = copy.deepcopy(stream)
    unpickled = pickle.loads(pickle.dumps(stream))
    assert key not in pickle.dumps(stream)
    buffer = io.BytesIO()
    torch.save({"stream": stream}, buffer)
    assert key not in buffer.getvalue()
    for other in (copied, unpickled):
        other.counter = 0
        assert not torch.equal(other.normal(32), drawn)
    assert stream.key_now() == key  # the original keeps drawing from its own key
