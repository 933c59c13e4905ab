"""Issue 11, finding 1: a released model reveals a torch-generator noise stream; the keyed CSPRNG does not.

The old default drew the noise from torch's mt19937. With Adam, a coordinate whose gradient is 0 moves by
−lr·sign(noise) at step 1, and torch's float32 Box–Muller (blocks of 16) makes the sign of every second-half
entry equal to bit 23 of one raw mt19937 word: the released update hands those words to an attacker, and
624 of them give the whole state. These tests reproduce that against the old generator, then check that the
default noise is an AES-256-CTR keyed stream (recomputed here from hashlib + cryptography, independently of the library), whose
outputs reveal nothing about its key, and that the key never reaches a checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct

import numpy as np
import pytest
import torch
from scipy import stats

from ddp_helpers import gloo_group, spawn
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream


def _adam_step_on_zero_gradients(noise: torch.Tensor, lr: float = 1e-3) -> torch.Tensor:
    """The released update Δθ of one Adam step whose gradient is pure noise (what a zero-gradient coordinate gets)."""
    p = torch.nn.Parameter(torch.zeros_like(noise))
    opt = torch.optim.Adam([p], lr=lr)
    p.grad = noise.clone()
    opt.step()
    return p.detach().clone()


def test_old_generator_noise_is_revealed_by_one_adam_update():
    seed, n = 1234, 16 * 4096
    noise = torch.empty(n).normal_(0.0, 3.0, generator=torch.Generator().manual_seed(seed))  # the old default
    update = _adam_step_on_zero_gradients(noise)
    assert torch.equal(torch.sign(update), -torch.sign(noise))  # Adam's first step: −lr·sign(g)
    # mt19937 raw words of the same seed from an independent implementation (numpy's legacy RandomState)
    raw = np.random.RandomState(seed).randint(0, 2**32, size=n, dtype=np.uint64).astype(np.uint64)
    second_half = (np.arange(n) % 16) >= 8
    bit23 = ((raw >> np.uint64(23)) & np.uint64(1)).astype(bool)[second_half]
    revealed_positive = (update.numpy() < 0)[second_half]  # update < 0 ⇔ noise > 0
    agreement = float(np.mean(revealed_positive == ~bit23))
    assert agreement == 1.0  # 32,768 raw-output bits read off one released update: the stream is recoverable


def _reference_stream_normal(seed: int, tag: str, counter: int, n: int) -> np.ndarray:
    """Box–Muller on AES-256-CTR under SHAKE-256(domain ‖ SHA-256(domain/seed/s) ‖ tag ‖ 0 ‖ counter)[:32], numpy."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    domain = b"lightning_dprel/keyed-stream/v2"
    key = hashlib.sha256(domain + b"/seed/" + str(seed).encode()).digest()
    pairs = (n + 1) // 2
    call_key = hashlib.shake_256(domain + key + tag.encode() + b"\x00" + struct.pack("<Q", counter)).digest(32)
    raw = Cipher(algorithms.AES(call_key), modes.CTR(b"\x00" * 16)).encryptor().update(b"\x00" * (16 * pairs))
    words = np.frombuffer(raw, dtype="<u8") >> np.uint64(11)
    u1 = (words[:pairs].astype(np.float64) + 1.0) * 2.0**-53
    u2 = words[pairs:].astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    return np.concatenate([r * np.cos(2 * math.pi * u2), r * np.sin(2 * math.pi * u2)])[:n]


def test_keyed_stream_is_aes_ctr_box_muller_exactly():
    stream = KeyedStream.seeded(7, "noise", warn=False)
    first = stream.normal(1001, 1.0, dtype=torch.float64).numpy()
    second = stream.normal(10, 2.5, dtype=torch.float64).numpy()
    # same bytes, same formula; libm and torch's vectorised log/sin/cos may differ in the last ulp
    np.testing.assert_allclose(first, _reference_stream_normal(7, "noise", 0, 1001), rtol=4e-15, atol=1e-15)
    np.testing.assert_allclose(second, 2.5 * _reference_stream_normal(7, "noise", 1, 10), rtol=4e-15, atol=1e-15)
    f32 = KeyedStream.seeded(7, "noise", warn=False).normal(1001, 1.0)
    assert f32.dtype == torch.float32 and torch.equal(f32, torch.from_numpy(first).float())  # float64, then cast
    assert stream.state_dict() == {"tag": "noise", "seed": 7, "counter": 2}


def test_keyed_stream_draws_many_blocks_as_one_pass():
    from lightning_dprel.core.randomness import _BOX_MULLER_BLOCK

    n = 2 * (2 * _BOX_MULLER_BLOCK + 3) - 1  # three blocks, the last partial; odd pairs: the u2 words start mid-block
    got = KeyedStream.seeded(11, "blocks", warn=False).normal(n, 0.5, dtype=torch.float64).numpy()
    np.testing.assert_allclose(got, 0.5 * _reference_stream_normal(11, "blocks", 0, n), rtol=4e-15, atol=1e-15)
    f32 = KeyedStream.seeded(11, "blocks", warn=False).normal(n, 0.5)
    assert torch.equal(f32, torch.from_numpy(got).float())


def test_keyed_stream_gaussians_pass_distribution_tests():
    z = KeyedStream.seeded(0, "dist", warn=False).normal(400_001, 1.0, dtype=torch.float64).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and abs(z.std() - 1.0) < 5 / math.sqrt(2 * z.size)
    # consecutive draws and neighbouring coordinates are uncorrelated (Box–Muller pairs included)
    half = z.size // 2
    assert abs(np.corrcoef(z[:half], z[half : 2 * half])[0, 1]) < 5 / math.sqrt(half)
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / math.sqrt(z.size)


def test_default_module_noise_is_a_secret_keyed_stream_not_a_torch_generator(tmp_path):
    module = DPRelationalModule(MLPEncoder(8, hidden_dim=4, out_dim=4), noise_multiplier=1.0, clipping="standard")
    opt = module.configure_optimizers()
    assert isinstance(opt.noise, KeyedStream) and opt.noise.is_secret
    assert not any(isinstance(v, torch.Generator) for v in vars(opt.noise).values())
    # one released step with zero gradients: the update reveals sign(noise), i.e. bits of SHAKE-256 output
    named = opt.named_params
    opt.record({k: torch.zeros((1,) + tuple(p.shape)) for k, p in named.items()}, max_freq=None, expected_batch_size=4.0)
    before = {k: p.detach().clone() for k, p in named.items()}
    opt.step()
    moved = torch.cat([(named[k].detach() - before[k]).reshape(-1) for k in named])
    assert bool((moved != 0).all())
    # a torch generator seeded with any guess does not explain the revealed signs (chance agreement only)
    n = moved.numel()
    for guess in range(3):
        fake = torch.empty(n).normal_(generator=torch.Generator().manual_seed(guess))
        agree = float((torch.sign(fake) == -torch.sign(moved)).double().mean())
        assert abs(agree - 0.5) < 6 * math.sqrt(0.25 / n)
    # the key is drawn (32 bytes) and never written to a checkpoint
    key = opt.noise._key
    assert isinstance(key, bytes) and len(key) == 32
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "ledger": module.privacy_ledger.state_dict()}, buf)
    blob = buf.getvalue()
    assert key not in blob and key.hex().encode() not in blob
    assert opt.state_dict()["noise"] == {"tag": "noise", "seed": None, "counter": 1}


def test_secret_streams_differ_and_a_resumed_secret_stream_rekeys():
    a, b = KeyedStream.secret("noise"), KeyedStream.secret("noise")
    assert not torch.equal(a.normal(64), b.normal(64))
    c = KeyedStream.secret("noise")
    c.load_state_dict(a.state_dict())
    assert c.counter == a.counter and not torch.equal(c.normal(64), a.normal(64))  # fresh key, same position


def test_seeded_stream_warns_and_rejects_bad_input():
    with pytest.warns(UserWarning, match="privacy guarantee is void"):
        KeyedStream.seeded(3, "noise")
    with pytest.raises(ValueError, match="non-negative int"):
        KeyedStream("noise", seed=-1)
    with pytest.raises(ValueError, match="non-empty string"):
        KeyedStream("")
    with pytest.raises(ValueError, match="resume with the same seed"):
        KeyedStream.secret("noise").load_state_dict({"tag": "noise", "seed": 4, "counter": 0})


def _ddp_noise_worker(rank: int, world: int, port: int, folder: str) -> None:
    with gloo_group(rank, world, port):
        torch.manual_seed(rank)
        stream = KeyedStream.secret("noise")  # keyed at the first draw: rank 0's key on every rank
        params = {"w": torch.nn.Parameter(torch.zeros(300))}
        dp = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0,
                         clip_norm=1.0, clipping="standard", noise=stream)
        dp.record({"w": torch.zeros(0, 300)}, max_freq=None, expected_batch_size=1.0)
        dp.step()
        torch.save(params["w"].detach().clone(), f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_ddp_ranks_draw_the_same_secret_noise(tmp_path):
    spawn(_ddp_noise_worker, tmp_path)
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(w0, w1) and bool((w0 != 0).all())
