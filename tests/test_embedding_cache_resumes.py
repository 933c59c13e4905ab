"""The embedding cache is saved chunk by chunk: a stopped run loses at most one chunk, its rerun embeds only the texts
still missing and gives the embeddings of an uninterrupted run; an old single-file store is still read; processes
writing the same store at once leave it whole."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lightning_dprel.transforms as T
from lightning_dprel.demos.boring_classes import rank_zero_messages
from lightning_dprel.pretrained import WORDS
from lightning_dprel.transforms import EmbedText

ROOT = Path(__file__).resolve().parents[1]


def texts_of(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 1..12 words of the tiny model's vocabulary, distinct, in no particular order of length."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        t = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        if t not in out:
            out.append(t)
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def encoded(monkeypatch):
    """Texts per call of the per-chunk encoder (``_encode_chunk``); ``stop_at``: the call that raises KeyboardInterrupt."""
    class Calls(list):
        state = {"stop_at": None}

    calls = Calls()
    state = calls.state
    real = T._encode_chunk

    def counting(model, tokenizer, ids, *args, **kwargs):
        if state["stop_at"] is not None and len(calls) + 1 == state["stop_at"]:
            raise KeyboardInterrupt
        calls.append(len(ids))
        return real(model, tokenizer, ids, *args, **kwargs)

    monkeypatch.setattr(T, "_encode_chunk", counting)
    return calls


def test_a_stopped_run_resumes_and_embeds_only_the_rest(cache, encoded):
    texts = texts_of(50)
    asked = texts + texts[:7][::-1]  # repeated texts: one row each in the store, every position answered
    reference = EmbedText("tiny-bert", max_length=16, cache=False, progress=False, chunk_size=50).embeddings(asked)
    assert encoded == [50]
    encoded.clear()

    embed = EmbedText("tiny-bert", max_length=16, progress=False, chunk_size=16)
    encoded.state["stop_at"] = 2  # stopped while embedding the second chunk
    with pytest.raises(KeyboardInterrupt):
        embed.embeddings(asked)
    assert encoded == [16]
    store = embed._store()
    assert len(list(store.glob("*.pt"))) == 1 and not [p for p in store.iterdir() if p.suffix != ".pt"]  # no tmp left

    encoded.clear()
    encoded.state["stop_at"] = None
    again = embed.embeddings(asked)
    assert encoded == [16, 16, 2] and sum(encoded) == 50 - 16  # only the texts not saved before the stop
    torch.testing.assert_close(again, reference, atol=1e-5, rtol=1e-4)  # in the order asked
    assert len(list(store.glob("*.pt"))) == 4

    encoded.clear()
    third = EmbedText("tiny-bert", max_length=16, progress=False, chunk_size=16).embeddings(texts[::-1])
    assert encoded == []  # all cached
    torch.testing.assert_close(third, reference[:50].flip(0), atol=1e-5, rtol=1e-4)


def test_one_progress_series_over_all_chunks(cache, encoded):
    with rank_zero_messages() as said:
        EmbedText("tiny-bert", max_length=16, chunk_size=8).embeddings(texts_of(30))
    lines = [m for m in said if m.startswith("embedding texts with tiny-bert")]
    assert encoded == [8, 8, 8, 6]
    assert lines[0] == "embedding texts with tiny-bert: 30 texts …"  # the whole run's total, said once
    assert sum("…" in m for m in lines) == 1 and sum("done in" in m for m in lines) == 1
    assert "30 texts done in" in lines[-1]


def test_a_stopped_run_says_what_was_kept(cache, encoded):
    encoded.state["stop_at"] = 3
    with rank_zero_messages() as said, pytest.raises(KeyboardInterrupt):
        EmbedText("tiny-bert", max_length=16, chunk_size=8).embeddings(texts_of(30))
    assert any("16 of 30 texts were saved" in m and "a rerun embeds only the rest" in m for m in said)


def test_an_old_single_file_store_is_still_read(cache, encoded):
    texts = texts_of(20)
    embed = EmbedText("tiny-bert", max_length=16, progress=False, chunk_size=8)
    old = embed._store().with_suffix(".pt")  # the single file the store used to be
    old.parent.mkdir(parents=True)
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts[:12]]
    x_old = torch.arange(12 * 32, dtype=torch.float32).view(12, 32)  # not what the model gives: proves it was read
    torch.save({"keys": keys, "x": x_old}, old)
    before = old.read_bytes()

    out = embed.embeddings(texts)
    assert encoded == [8]  # only the 8 texts the old store lacks
    assert torch.equal(out[:12], x_old)
    fresh = EmbedText("tiny-bert", max_length=16, cache=False, progress=False).embeddings(texts[12:])
    torch.testing.assert_close(out[12:], fresh, atol=1e-5, rtol=1e-4)
    assert old.read_bytes() == before  # never rewritten
    assert len(list(embed._store().glob("*.pt"))) == 1

    encoded.clear()
    assert torch.equal(embed.embeddings(texts[::-1]), out.flip(0)) and encoded == []


def test_leftovers_of_a_killed_writer_and_repeated_chunks_are_harmless(cache, encoded):
    texts = texts_of(12)
    embed = EmbedText("tiny-bert", max_length=16, progress=False, chunk_size=4)
    first = embed.embeddings(texts[:8])
    store = embed._store()
    (store / ".deadbeef.123.abc.tmp").write_bytes(b"half a file")  # a writer killed mid-save
    dup = store / "0000-duplicate.pt"  # the same texts saved by another process, under another name
    torch.save({"keys": [hashlib.sha1(t.encode()).hexdigest() for t in texts[:4]], "x": first[:4]}, dup)
    encoded.clear()
    out = embed.embeddings(texts)
    assert encoded == [4]
    torch.testing.assert_close(out[:8], first)
    torch.save({"keys": ["a", "b"], "x": torch.zeros(3, 32)}, store / "broken.pt")
    with pytest.raises(ValueError, match="damaged"):
        embed.embeddings(texts)


@pytest.mark.slow
@pytest.mark.slow
def test_two_processes_writing_one_store_at_once(cache, tmp_path):
    texts = texts_of(60, seed=3)
    (tmp_path / "texts.txt").write_text("\n".join(texts))
    script = (
        "import sys, torch\n"
        "from lightning_dprel.transforms import EmbedText\n"
        "texts = open(sys.argv[1]).read().split('\\n')\n"
        "x = EmbedText('tiny-bert', max_length=16, progress=False, chunk_size=5).embeddings(texts)\n"
        "torch.save(x, sys.argv[2])\n"
    )
    EmbedText("tiny-bert", max_length=16, progress=False).embeddings(["alpha"])  # the tiny model written once
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "texts.txt"), str(tmp_path / f"x{i}.pt")],
                              env=env, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    x0, x1 = (torch.load(tmp_path / f"x{i}.pt") for i in range(2))
    torch.testing.assert_close(x0, x1)
    store = EmbedText("tiny-bert", max_length=16)._store()
    assert not [p for p in store.iterdir() if p.suffix != ".pt"]
    again = EmbedText("tiny-bert", max_length=16, progress=False).embeddings(texts)  # every chunk file reads whole
    torch.testing.assert_close(again, x0)


def test_bad_chunk_size_refused():
    with pytest.raises(ValueError, match="chunk_size"):
        EmbedText("tiny-bert", chunk_size=0)
