"""Every long phase outside the training bar says what it does, how far it is and about how long is left."""

from __future__ import annotations

import pytest

from lightning_dprel import progress
from lightning_dprel.demos.boring_classes import rank_zero_messages
from lightning_dprel.progress import ProgressLog


@pytest.fixture
def messages():
    with rank_zero_messages() as said:
        yield said


def test_progress_lines_are_throttled_and_estimate_what_is_left(messages, monkeypatch):
    clock = iter([0.0, 1.0, 6.0, 7.0, 12.0, 20.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    log = ProgressLog("embedding texts with m", 100, unit="texts")  # t = 0
    log.update(10)  # t = 1: too soon, no line
    log.update(30)  # t = 6: 30 done in 6 s → ~14 s left
    log.update(40)  # t = 7: too soon
    log.update(60)  # t = 12: 60 in 12 s → ~8 s left
    log.close()  # t = 20
    assert messages == [
        "embedding texts with m: 100 texts …",
        "embedding texts with m: 30/100 texts (30 %), 6 s elapsed, ~14 s left",
        "embedding texts with m: 60/100 texts (60 %), 12 s elapsed, ~8 s left",
        "embedding texts with m: 100 texts done in 20.0 s",
    ]


def test_embedding_texts_reports_progress_by_default(messages, tmp_path, monkeypatch):
    from torch_geometric.data import Data

    from lightning_dprel.demos import save_tiny_bert
    from lightning_dprel.transforms import EmbedText

    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path / "cache"))
    model = save_tiny_bert(tmp_path / "bert")
    transform = EmbedText(model, max_length=8)
    assert transform.progress  # on unless turned off
    transform(Data(text=[f"term {i}" for i in range(12)], num_nodes=12))
    assert any(m.startswith(f"embedding texts with {model}: 12 texts") for m in messages)
    assert any("12 texts done in" in m for m in messages)
    messages.clear()
    transform(Data(text=[f"term {i}" for i in range(12)], num_nodes=12))  # cached: nothing to embed, nothing said
    assert not any("embedding texts" in m for m in messages)
    quiet = EmbedText(model, max_length=8, cache=False, progress=False)
    quiet(Data(text=["a", "b"], num_nodes=2))
    assert not any("embedding texts" in m for m in messages)


def test_the_estimate_scales_with_the_work_of_unequal_items(messages, monkeypatch):
    clock = iter([0.0, 10.0, 10.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    log = ProgressLog("embedding", 4, unit="texts", work=1 + 1 + 4 + 4)  # two short texts, then two long ones
    log.update(2, 2.0)  # half the texts in 10 s, but only 2 of 10 units of work: ~40 s left, not ~10 s
    assert messages[-1] == "embedding: 2/4 texts (50 %), 10 s elapsed, ~40 s left"
