"""The secret randomness of a private run: noise and batch selection seeds, secure noise, the held-out split.

A public seed voids the guarantee (anyone regenerates the noise, or sees which relations were sampled),
so both default to ``os.urandom``; explicit seeds warn. Secure noise comes from the OS CSPRNG (checked
bit for bit against a pure-Python Box–Muller on the same bytes); secret sampling streams fill the whole
mt19937 state (checked against Python's own mt19937). Under DDP rank 0's draws reach every rank.
"""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from torch.utils.data import DataLoader
from torch_geometric.data import Data

from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.datamodule import held_out_mask
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import tiny_relational_dm
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream
from ddp_helpers import gloo_group, spawn
from lightning_dprel.demos.tuple_batches import build_tuple_batch, sample_coupled

GRAPH = random_feature_graph(num_nodes=120, num_edges=300, dim=16, seed=0)


def _seeded_urandom(seed: int):
    rng = random.Random(seed)
    return lambda n: rng.randbytes(n)


def _no_user_warning(fn, match: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    assert not [w for w in caught if match in str(w.message)], [str(w.message) for w in caught]
    return out


# ----------------------------------------------------------------------------- noise seeds
def test_module_noise_seed_defaults_to_none_and_explicit_seed_warns():
    m = _no_user_warning(lambda: DPRelationalModule(MLPEncoder(4, hidden_dim=4, out_dim=4)), "noise_seed")
    assert m.hparams.noise_seed is None and m.noise_source.seed is None and m.noise_source.is_secret
    assert not torch.equal(m.noise_source.normal(32, 1.0), DPRelationalModule(MLPEncoder(4)).noise_source.normal(32, 1.0))
    assert m.noise_source.seed is None  # drawing does not store the urandom key either
    with pytest.warns(UserWarning, match=r"voids the privacy guarantee unless the seed is kept secret") as rec:
        DPRelationalModule(MLPEncoder(4), noise_seed=12345)
    assert "12345" not in str(rec[0].message)  # the (possibly secret) seed is not echoed into logs
    with pytest.warns(DeprecationWarning, match="secure_noise"):
        DPRelationalModule(MLPEncoder(4), secure_noise=True)


def test_secret_noise_key_comes_from_urandom(monkeypatch):
    import lightning_dprel.core.randomness as rnd

    calls = []
    real = rnd.os.urandom
    monkeypatch.setattr(rnd.os, "urandom", lambda n: calls.append(n) or real(n))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    params = {"p": torch.nn.Parameter(torch.zeros(8))}
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0, clip_norm=1.0,
                    clipping="freq")
    assert dp.noise.is_secret and calls == []  # keyed lazily, at the first draw
    a, b = dp.noise.normal(1000, 1.0), dp.noise.normal(1000, 1.0, dtype=torch.float64)
    assert calls == [32] and a.dtype == torch.float32 and b.dtype == torch.float64  # one 256-bit key, then SHAKE-256
    assert not torch.equal(a.double(), b)
    assert torch.equal(torch.get_rng_state(), before)  # the global generator is untouched
    zero = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0, clip_norm=1.0,
                       clipping="freq", noise=KeyedStream.seeded(0, "noise", warn=False)).noise.normal(1000, 1.0)
    assert not torch.equal(a, zero)


def test_module_checkpoint_holds_the_ledger_and_no_randomness():
    m = DPRelationalModule(MLPEncoder(4))
    m.noise_source.normal(4, 1.0)
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    assert set(ckpt["lightning_dprel"]) == {"ledger", "noise_spec"}
    m.on_load_checkpoint(ckpt)
    assert m.noise_source.normal(4, 1.0).shape == (4,)
    with pytest.raises(ValueError, match="predates the privacy ledger"):
        m.on_load_checkpoint({"lightning_dprel": {"noise": {"secure": True}}})


# ----------------------------------------------------------------------------- log_train_metrics
def _fit_two_steps(**kw):
    g = torch.Generator().manual_seed(0)
    batches = []
    for s in range(2):
        pos, neg, anchor = sample_coupled(GRAPH.edge_index, GRAPH.num_nodes, rate=16 / 300, k=2, generator=g)
        batches.append(build_tuple_batch(pos, neg, anchor, {"x": GRAPH.x}, expected_batch_size=16.0, step=s))
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), noise_multiplier=1.0, allow_untracked=True, **kw)
    trainer = Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(batches, batch_size=None, collate_fn=lambda x: x))
    return trainer


@pytest.mark.filterwarnings(  # two plain-loader fits without a PrivacyCallback (allow_untracked=True), no validation
    "ignore:DPRelationalModule. (private fit without a PrivacyCallback|no SamplingSpec for this untracked private fit)",
    "ignore:You defined a `validation_step` but have no `val_dataloader`",
)
def test_nothing_from_the_private_batch_is_logged_by_default():
    trainer = _no_user_warning(_fit_two_steps, "outside the differential-privacy guarantee")
    assert not {"train_loss", "train_clipped_fraction"} & set(trainer.callback_metrics)
    assert trainer.global_step == 2
    with pytest.warns(UserWarning, match="outside the differential-privacy guarantee"):
        logged = _fit_two_steps(log_train_metrics=True)
    assert {"train_loss", "train_clipped_fraction"} <= set(logged.callback_metrics)
    with pytest.raises(TypeError, match=r"`log_train_metrics` must be a bool, got str"):
        DPRelationalModule(MLPEncoder(4), log_train_metrics="yes")


# ----------------------------------------------------------------------------- sampling seeds
def test_sampling_seed_is_secret_by_default_and_separate_from_the_public_seed():
    a = _no_user_warning(tiny_relational_dm, "sampling_seed")
    b = tiny_relational_dm()
    assert a.sampling_seed is None and a._randomness.is_secret and b._randomness.is_secret
    # Public preprocessing is identical (split, capping, evaluation queries) ...
    assert torch.equal(a.train_edges, b.train_edges) and torch.equal(a.eval_query, b.eval_query)
    # ... while the batches differ.
    pa, pb = ([x.pos for x in dm.train_dataloader()] for dm in (a, b))
    assert any(x.shape != y.shape or not torch.equal(x, y) for x, y in zip(pa, pb))
    with pytest.warns(UserWarning, match="voids amplification by subsampling"):
        c, d = tiny_relational_dm(sampling_seed=2**64 - 1), tiny_relational_dm(sampling_seed=2**64 - 1)
    assert all(torch.equal(x.pos, y.pos) for x, y in zip(c.train_dataloader(), d.train_dataloader()))
    with pytest.raises(ValueError, match=r"`sampling_seed` must be < 2\*\*64"):
        RelationalDataModule(sampling_seed=2**64)
    with pytest.raises(ValueError, match=r"`sampling_seed` must be an int >= 0, got -1"):
        RelationalDataModule(sampling_seed=-1)


def test_state_dict_holds_no_secret_and_a_secret_resume_draws_fresh_batches():
    dm = tiny_relational_dm()
    it = iter(dm.train_dataloader())
    next(it), next(it)
    state = dm.state_dict()
    key = dm._randomness._key  # drawn from os.urandom at the first batch, held in memory only
    assert "sampling_seed" not in state and state["stream"]["seed"] is None and key.hex() not in repr(state)
    rest = [next(it), next(it)] + list(dm.train_dataloader())
    resumed = tiny_relational_dm()
    resumed.load_state_dict(state)
    again = list(resumed.train_dataloader()) + list(resumed.train_dataloader())
    assert [b.step for b in again] == [b.step for b in rest] == [2, 3, 4, 5, 6, 7]  # the position resumes ...
    assert not all(torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg) for a, b in zip(rest, again))  # ... fresh key
    resumed.seek(1, 0)  # seek needs no replay and no saved secret
    assert next(iter(resumed.train_dataloader())).step == 4
    with pytest.warns(UserWarning):
        other = tiny_relational_dm(sampling_seed=1)
    with pytest.raises(ValueError, match=r"drawn with secret \(sampling_seed=None\), this datamodule's with sampling_seed=1"):
        other.load_state_dict(state)


class _Seen(Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((batch.step, batch.pos.tolist()))


@pytest.mark.filterwarnings(  # untracked fits; the resume leaves the ModelCheckpoint out on purpose
    "ignore:DPRelationalModule. (private fit without a PrivacyCallback|no SamplingSpec for this untracked private fit)",
    "ignore:Be aware that when using `ckpt_path`",
)
def test_trainer_mid_epoch_resume_with_a_secret_sampling_key(tmp_path):
    """A secret stream's key is never checkpointed: the resumed run continues the position with fresh batches."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    def fit(callbacks, ckpt_path=None):
        seen, dm = _Seen(), tiny_relational_dm()
        module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), noise_multiplier=0.5, allow_untracked=True)
        Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                devices=1, limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=tmp_path,
                enable_checkpointing=bool(callbacks), callbacks=[seen, *callbacks]).fit(
            module, datamodule=dm, ckpt_path=ckpt_path)
        return seen.seen, dm._randomness._key

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1, save_last=False)
    full, key = fit([ckpt])
    assert [s for s, _ in full] == list(range(12))
    path = next(p for p in (tmp_path / "ckpt").iterdir() if "step=6" in p.name)
    assert key not in path.read_bytes()
    resumed, resumed_key = fit([], ckpt_path=str(path))
    assert [s for s, _ in resumed] == list(range(6, 12)) and resumed_key != key
    assert resumed != full[6:]  # fresh, independent batches after the resume


# ----------------------------------------------------------------------------- held-out split
@pytest.mark.filterwarnings("ignore:max_degree K = 10,000 is far above")  # no capping here (the warning: test_accounting_scale_and_curves)
def test_held_out_split_is_per_relation_and_stable_under_node_removal():
    graph = random_feature_graph(300, 2000, seed=4)
    full = _dm_split(graph)
    deg = torch.bincount(graph.edge_index.flatten(), minlength=300).tolist()
    w = max({u for e in full["test"] for u in e}, key=lambda u: deg[u])  # a hub with held-out relations
    keep = (graph.edge_index != w).all(0)
    removed = _dm_split(Data(x=graph.x, edge_index=graph.edge_index[:, keep]))  # node w isolated, ids kept
    for name in ("test", "train"):
        a = {e for e in full[name] if w not in e}
        assert a == removed[name], name  # every other relation kept its side of the split
    assert not any(w in e for e in removed["test"] | removed["train"])
    # The held-out count is Binomial(E, 0.2).
    total = len(full["test"]) + len(full["train"])
    assert abs(len(full["test"]) - 0.2 * total) <= 4 * math.sqrt(total * 0.2 * 0.8)


def _dm_split(data: Data) -> dict:
    dm = RelationalDataModule(data, expected_batch_size=4, neg_per_pos=1, max_degree=10_000, test_fraction=0.2, seed=9)
    dm.setup("fit")
    test = {tuple(sorted(e)) for e in torch.stack([dm.eval_query, dm.eval_target]).t().tolist()}
    train = set(map(tuple, dm.train_edges.t().tolist()))
    return {"test": test, "train": train}


def test_held_out_mask_fraction_and_salt():
    g = torch.Generator().manual_seed(0)
    u = torch.randint(0, 10_000, (20_000,), generator=g)
    edges = torch.stack([u, u + 1 + torch.randint(0, 10_000, (20_000,), generator=g)])
    mask = held_out_mask(edges, 0.3, salt=123)
    assert abs(float(mask.double().mean()) - 0.3) <= 4 * math.sqrt(0.3 * 0.7 / 20_000)
    assert torch.equal(mask, held_out_mask(edges.flip(0), 0.3, salt=123))  # orientation does not matter
    assert torch.equal(mask[5:], held_out_mask(edges[:, 5:], 0.3, salt=123))  # position does not matter
    assert not torch.equal(mask, held_out_mask(edges, 0.3, salt=124))


def test_split_leaving_no_test_relation_names_the_remedy():
    data = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"leaves none for (evaluation|training)\. Change test_fraction or seed"):
        RelationalDataModule(data, expected_batch_size=1, neg_per_pos=0).setup()


# ----------------------------------------------------------------------------- DDP: rank 0's draws everywhere
def _ddp_worker(rank: int, world: int, port: int, folder: str) -> None:
    with gloo_group(rank, world, port):
        torch.manual_seed(rank)  # ranks differ in everything else
        secure = KeyedStream.secret("noise").normal(500, 1.0)
        seeded = KeyedStream.secret("noise").normal(500, 1.0)
        dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), expected_batch_size=8, neg_per_pos=2,
                                  steps_per_epoch=3)
        dm.setup("fit")
        pos = [dm.draw_global(t)[0] for t in range(3)]  # the global batches (each rank iterates its own slice)
        torch.save({"secure": secure, "seeded": seeded, "pos": pos}, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_ddp_ranks_share_rank0_noise_and_sampling_seed(tmp_path):
    spawn(_ddp_worker, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(r0["secure"], r1["secure"]) and torch.equal(r0["seeded"], r1["seeded"])
    assert all(torch.equal(a, b) for a, b in zip(r0["pos"], r1["pos"]))  # rank 0's sampling key on both ranks
