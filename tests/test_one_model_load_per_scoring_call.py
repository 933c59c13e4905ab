"""Scoring pairs by text with a model trained on frozen text embeddings loads the frozen model once per call (one
"Loading weights"), not once per argument, and gives the scores of embedding each side on its own."""

from __future__ import annotations

import pytest
import torch
import transformers

from lightning_dprel.demos import save_tiny_bert
from lightning_dprel.encoders import ResidualAdapter
from lightning_dprel.methods.relational.losses import pair_scores
from lightning_dprel.methods.relational.module import DPRelationalModule

CHILDREN = ["heart lung fever", "alpha beta gamma delta", "red green blue"]
PARENTS = ["red green", "heart fever", "alpha delta"]


@pytest.fixture
def loads(monkeypatch):
    """Counts the frozen model's loads (``AutoModel.from_pretrained``)."""
    calls: list[str] = []
    real = transformers.AutoModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(str(args[0]))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", classmethod(counting))
    return calls


@pytest.mark.filterwarnings("ignore:DPRelationalModule\\(allow_untracked")
def test_a_scoring_call_loads_the_frozen_model_once(tmp_path, loads, capsys):
    bert = save_tiny_bert(tmp_path / "bert")
    module = DPRelationalModule(ResidualAdapter(32, rank=2, directed=True), score="directed_cosine", allow_untracked=True)
    module.input_spec = {"tokenizer": None, "max_length": 16, "embed_text": {"model_name": bert, "max_length": 16}}
    capsys.readouterr()
    scores = module.score_pairs(CHILDREN, PARENTS)
    assert len(loads) == 1
    ranked = module.rank_candidates(CHILDREN[0], PARENTS)
    assert len(loads) == 2
    assert capsys.readouterr().err.count("Loading weights:   0%") <= 2  # one progress bar per call, when bars show
    hc, hp = module.embed_texts(CHILDREN), module.embed_texts(PARENTS)  # each side on its own: the same numbers
    torch.testing.assert_close(scores, pair_scores(hc, hp, score="directed_cosine", temperature=module.hparams.temperature))
    one_child = pair_scores(hc[:1].expand(3, -1), hp, score="directed_cosine", temperature=module.hparams.temperature)
    torch.testing.assert_close(ranked.scores, one_child[ranked.indices])
