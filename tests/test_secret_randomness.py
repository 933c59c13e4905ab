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
import torch.multiprocessing as mp
from pytorch_lightning import Callback, Trainer
from scipy import stats
from torch.utils.data import DataLoader
from torch_geometric.data import Data

import lightning_dprel.optim as optim_mod
from datamodules import RelationalDataModule
from datamodules.relational import held_out_mask
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.module import DPRelationalModule
from lightning_dprel.optim import DPOptimizer, NoiseSource, csprng_normal
from lightning_dprel.sampling import secret_generator
from tuple_batches import build_tuple_batch, sample_coupled

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
    assert m.hparams.noise_seed is None and m.noise_source.seed is None  # the drawn seed is never recorded
    assert not torch.equal(m.noise_source.normal(32, 1.0), DPRelationalModule(MLPEncoder(4)).noise_source.normal(32, 1.0))
    assert m.noise_source.seed is None  # drawing does not store the urandom seed either
    with pytest.warns(UserWarning, match=r"voids the privacy guarantee unless the seed is kept secret") as rec:
        DPRelationalModule(MLPEncoder(4), noise_seed=12345)
    assert "12345" not in str(rec[0].message)  # the (possibly secret) seed is not echoed into logs
    assert NoiseSource().seed is None and NoiseSource().secure is False


def test_drawn_noise_seed_fills_the_whole_generator_state(monkeypatch):
    secret = bytes(range(0xF8, 0x100))  # a 64-bit secret whose high bits matter
    monkeypatch.setattr(optim_mod.os, "urandom", lambda n: secret[:n])
    got = NoiseSource().normal(16, 2.0)
    want = torch.empty(16).normal_(0.0, 2.0, generator=secret_generator(int.from_bytes(secret, "little"), "noise"))
    assert torch.equal(got, want)
    low32 = torch.empty(16).normal_(0.0, 2.0, generator=torch.Generator().manual_seed(int.from_bytes(secret, "little")))
    assert not torch.equal(got, low32)


def test_default_dp_optimizer_noise_is_not_seeded_with_zero():
    params = {"p": torch.nn.Parameter(torch.zeros(8))}
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0, clip_norm=1.0)
    assert dp.noise.seed is None
    zero = NoiseSource(seed=0).normal(8, 1.0)
    assert not torch.equal(dp.noise.normal(8, 1.0), zero)


# ----------------------------------------------------------------------------- secure noise
def test_csprng_normal_is_box_muller_on_53_bit_urandom_uniforms(monkeypatch):
    monkeypatch.setattr(optim_mod.os, "urandom", _seeded_urandom(0))
    got = csprng_normal(7, 2.5)
    raw = _seeded_urandom(0)(16 * 4)  # 4 pairs for 7 draws
    words = [int.from_bytes(raw[8 * i : 8 * i + 8], "little") >> 11 for i in range(8)]
    ref = []
    for w1, w2 in zip(words[:4], words[4:]):
        r = 2.5 * math.sqrt(-2.0 * math.log((w1 + 1) / 2**53))
        ref.append((r * math.cos(2 * math.pi * w2 / 2**53), r * math.sin(2 * math.pi * w2 / 2**53)))
    want = [c for c, _ in ref] + [s for _, s in ref]
    assert got.dtype == torch.float64 and got.shape == (7,)
    torch.testing.assert_close(got, torch.tensor(want[:7], dtype=torch.float64), atol=1e-12, rtol=1e-12)


def test_csprng_normal_distribution_matches_scipy(monkeypatch):
    monkeypatch.setattr(optim_mod.os, "urandom", _seeded_urandom(1))  # seeded bytes: a deterministic check
    draws = csprng_normal(200_001, 1.5).numpy()
    assert stats.kstest(draws / 1.5, "norm").pvalue > 1e-3
    assert abs(draws.std() - 1.5) < 0.01 and abs(draws.mean()) < 0.015


def test_secure_noise_source_uses_urandom_and_stores_no_state(monkeypatch):
    calls = []
    real = optim_mod.os.urandom
    monkeypatch.setattr(optim_mod.os, "urandom", lambda n: calls.append(n) or real(n))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    src = NoiseSource(secure=True)
    a, b = src.normal(1000, 1.0), src.normal(1000, 1.0, dtype=torch.float64)
    assert calls == [16 * 500, 16 * 500] and a.dtype == torch.float32 and b.dtype == torch.float64
    assert not torch.equal(a.double(), b)
    assert torch.equal(torch.get_rng_state(), before)  # the global generator is untouched
    assert src.state_dict() == {"secure": True}
    with pytest.raises(RuntimeError, match="no torch.Generator"):
        _ = src.generator
    m = DPRelationalModule(MLPEncoder(4), secure_noise=True)
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    assert ckpt["lightning_dprel"]["noise"] == {"secure": True}
    m.on_load_checkpoint(ckpt)  # restores nothing, keeps drawing from urandom
    assert m.noise_source.normal(4, 1.0).shape == (4,)
    with pytest.raises(ValueError, match=r"`noise_seed` must be None, got 3"):
        DPRelationalModule(MLPEncoder(4), secure_noise=True, noise_seed=3)


# ----------------------------------------------------------------------------- log_train_metrics
def _fit_two_steps(**kw):
    g = torch.Generator().manual_seed(0)
    batches = []
    for s in range(2):
        pos, neg, anchor = sample_coupled(GRAPH.edge_index, GRAPH.num_nodes, rate=16 / 300, k=2, generator=g)
        batches.append(build_tuple_batch(pos, neg, anchor, {"x": GRAPH.x}, expected_batch_size=16.0, step=s))
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), noise_multiplier=1.0, **kw)
    trainer = Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(batches, batch_size=None, collate_fn=lambda x: x))
    return trainer


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
def _dm(**kw) -> RelationalDataModule:
    dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), expected_batch_size=8, neg_per_pos=2, seed=3,
                              steps_per_epoch=4, **kw)
    dm.setup("fit")
    return dm


def test_sampling_seed_is_secret_by_default_and_separate_from_the_public_seed():
    a = _no_user_warning(_dm, "sampling_seed")
    b = _dm()
    assert a.sampling_seed is None and 0 <= a._secret < 2**64 and a._secret != b._secret
    # Public preprocessing is identical (split, capping, evaluation queries) ...
    assert torch.equal(a.train_edges, b.train_edges) and torch.equal(a.eval_query, b.eval_query)
    # ... while the batches differ.
    pa, pb = ([x.pos for x in dm.train_dataloader()] for dm in (a, b))
    assert any(x.shape != y.shape or not torch.equal(x, y) for x, y in zip(pa, pb))
    with pytest.warns(UserWarning, match="assumes the seed is kept secret"):
        c, d = _dm(sampling_seed=2**64 - 1), _dm(sampling_seed=2**64 - 1)
    assert all(torch.equal(x.pos, y.pos) for x, y in zip(c.train_dataloader(), d.train_dataloader()))
    with pytest.raises(ValueError, match=r"`sampling_seed` must be < 2\*\*64"):
        RelationalDataModule(sampling_seed=2**64)
    with pytest.raises(ValueError, match=r"`sampling_seed` must be >= 0, got -1"):
        RelationalDataModule(sampling_seed=-1)


def test_secret_generator_fills_the_whole_mt19937_state():
    import hashlib

    # Independent reference: Python's own mt19937 started from the same 624 words.
    material = hashlib.shake_256(repr((2**40 + 5, "sampling", "positives")).encode()).digest(4 * 624)
    words = [int.from_bytes(material[4 * i : 4 * i + 4], "little") for i in range(624)]
    words[0] |= 1 << 31
    ref = random.Random()
    ref.setstate((3, tuple(words) + (624,), None))
    want = [(ref.getrandbits(32) & 0xFFFFFF) / 2**24 for _ in range(64)]  # torch.rand float32: low 24 bits
    assert torch.rand(64, generator=secret_generator(2**40 + 5, "sampling", "positives")).tolist() == want
    # manual_seed keeps 32 bits (seeds 2^32 apart collide); the secret streams do not.
    assert torch.equal(torch.rand(8, generator=torch.Generator().manual_seed(5)),
                       torch.rand(8, generator=torch.Generator().manual_seed(5 + 2**32)))
    assert not torch.equal(torch.rand(8, generator=secret_generator(5, "sampling", "positives")),
                           torch.rand(8, generator=secret_generator(5 + 2**32, "sampling", "positives")))
    assert not torch.equal(torch.rand(8, generator=secret_generator(5, "sampling", "positives")),
                           torch.rand(8, generator=secret_generator(5, "sampling", "negatives")))


def test_state_dict_carries_the_secret_and_resume_reproduces_the_stream():
    dm = _dm()
    it = iter(dm.train_dataloader())
    next(it), next(it)
    state = dm.state_dict()
    assert state["sampling_seed"] == dm._secret
    rest = [next(it), next(it)] + list(dm.train_dataloader())
    resumed = _dm()  # draws its own secret, replaced by the checkpoint's
    resumed.load_state_dict(state)
    again = list(resumed.train_dataloader()) + list(resumed.train_dataloader())
    assert [b.step for b in again] == [b.step for b in rest] == [2, 3, 4, 5, 6, 7]
    assert all(torch.equal(a.pos, b.pos) and torch.equal(a.neg, b.neg) for a, b in zip(rest, again))
    resumed.seek(1, 0)  # seek replays from the checkpoint's secret too
    assert torch.equal(next(iter(resumed.train_dataloader())).pos, rest[2].pos)
    with pytest.warns(UserWarning):
        other = _dm(sampling_seed=1)
    with pytest.raises(ValueError, match=r"another `sampling_seed` .*values not shown") as err:
        other.load_state_dict(state)
    assert str(state["sampling_seed"]) not in str(err.value)


class _Seen(Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((batch.step, batch.pos.tolist()))


def test_trainer_mid_epoch_resume_with_a_drawn_sampling_seed(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def fit(callbacks, ckpt_path=None):
        seen = _Seen()
        module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), noise_multiplier=0.5)
        Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                devices=1, limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=tmp_path,
                enable_checkpointing=bool(callbacks), callbacks=[seen, *callbacks]).fit(
            module, datamodule=_dm(), ckpt_path=ckpt_path)
        return seen.seen

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1, save_last=False)
    full = fit([ckpt])
    assert [s for s, _ in full] == list(range(12))
    path = next(p for p in (tmp_path / "ckpt").iterdir() if "step=6" in p.name)
    assert fit([], ckpt_path=str(path)) == full[6:]


# ----------------------------------------------------------------------------- held-out split
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
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)  # ranks differ in everything else
        secure = NoiseSource(secure=True).normal(500, 1.0)
        seeded = NoiseSource().normal(500, 1.0)
        dm = RelationalDataModule(random_feature_graph(200, 600, seed=1), expected_batch_size=8, neg_per_pos=2,
                                  steps_per_epoch=3)
        dm.setup("fit")
        pos = [b.pos for b in dm.train_dataloader()]
        torch.save({"secure": secure, "seeded": seeded, "secret": dm._secret, "pos": pos}, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_share_rank0_noise_and_sampling_seed(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(r0["secure"], r1["secure"]) and torch.equal(r0["seeded"], r1["seeded"])
    assert r0["secret"] == r1["secret"]
    assert all(torch.equal(a, b) for a, b in zip(r0["pos"], r1["pos"]))
