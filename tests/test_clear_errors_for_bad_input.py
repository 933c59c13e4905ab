"""What a newcomer gets wrong is refused up front with a message that names the thing, what was expected, what was
found and the remedy: an encoder that does not fit the features (at setup, before any test or step), texts given as
features, a checkpoint path that is missing or not a checkpoint (argparse-style, exit code 2), and embeddings of the
wrong width given to ``score_pairs``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_dprel.cli import main
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder, ResidualAdapter, check_encoder_inputs
from lightning_dprel.methods.relational.module import DPRelationalModule

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:DPRelationalModule\\(allow_untracked")


class FeaturesEncoder(nn.Module):
    """A custom encoder whose forward names its argument ``features``, not ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)

    def forward(self, features):
        return self.lin(features)


class Unlabelled(nn.Module):
    """A custom encoder that declares no ``in_dim`` and reads 384-wide features."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(384, 8)

    def forward(self, x):
        return self.lin(x)


class Dropped(nn.Module):
    """A custom encoder with dropout (random in training mode), reading 16-wide features."""

    def __init__(self) -> None:
        super().__init__()
        self.drop, self.lin = nn.Dropout(0.5), nn.Linear(16, 4)

    def forward(self, x):
        return self.lin(self.drop(x))


def _test_with(encoder, data=None):
    dm = RelationalDataModule(data if data is not None else random_feature_graph(60, 150), expected_batch_size=8, neg_per_pos=1)
    quiet_trainer().test(DPRelationalModule(encoder, allow_untracked=True), datamodule=dm, verbose=False)


def test_an_encoder_whose_forward_does_not_take_x_is_refused_at_setup():
    with pytest.raises(TypeError, match=r"FeaturesEncoder\.forward\(features\) does not take `x`") as err:
        _test_with(FeaturesEncoder())
    message = str(err.value)
    assert "x: float32 [60, 16]" in message and "def forward(self, x)" in message


@pytest.mark.parametrize("encoder", [MLPEncoder(384), ResidualAdapter(384, rank=2)], ids=["MLPEncoder", "ResidualAdapter"])
def test_an_in_dim_that_does_not_match_the_features_is_refused_with_both_widths(encoder):
    name = type(encoder).__name__
    with pytest.raises(ValueError, match=rf"{name} expects node features of width in_dim = 384, but .* \[60, 16\]") as err:
        _test_with(encoder)
    assert "set the encoder's in_dim to 16" in str(err.value)


def test_a_custom_encoder_without_in_dim_is_tried_on_two_nodes():
    with pytest.raises(ValueError, match=r"Unlabelled fails on .* \[60, 16\].*mat1 and mat2"):
        _test_with(Unlabelled())
    encoder, x = Dropped().train(), torch.randn(60, 16)
    state = torch.random.get_rng_state()
    check_encoder_inputs(encoder, {"x": x})  # fits: no error
    assert torch.equal(torch.random.get_rng_state(), state) and encoder.training  # no draw from the RNG, mode kept


def test_texts_given_as_features_are_refused_with_the_remedy():
    data = random_feature_graph(60, 150)
    data.x = [f"term {i}" for i in range(60)]
    with pytest.raises(TypeError, match=r"`source\.x` must be a numeric tensor .* got a list of str \(e\.g\. 'term 0'\)\. "
                                        r"Node texts go in `data\.text`"):
        _test_with(MLPEncoder(16), data)


@pytest.mark.parametrize("case", ["missing", "yaml", "folder"])
def test_export_refuses_a_path_that_is_no_checkpoint(case, tmp_path, capsys):
    path = {"missing": tmp_path / "nope.ckpt", "yaml": ROOT / "configs" / "tiny.yaml", "folder": tmp_path}[case]
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--ckpt_path", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m lightning_dprel export" in err
    expected = {"missing": "no such file", "yaml": "is a YAML config, not a checkpoint", "folder": "is a folder"}[case]
    assert f"error: --ckpt_path {path}" in err and expected in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing", "yaml"])
def test_fit_refuses_a_missing_or_wrong_ckpt_path_before_any_work(case, tmp_path, capsys, monkeypatch):
    from pytorch_lightning import Trainer

    monkeypatch.setattr(Trainer, "test", lambda *a, **k: pytest.fail("evaluated before refusing the checkpoint"))
    path = tmp_path / "nope.ckpt" if case == "missing" else ROOT / "configs" / "tiny.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--trainer.default_root_dir", str(tmp_path),
              "--ckpt_path", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --ckpt_path {path}" in err and ("no such file" if case == "missing" else "not a checkpoint") in err


def test_score_pairs_refuses_embeddings_of_the_wrong_width():
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), allow_untracked=True)
    wrong = torch.randn(2, 10)  # e.g. a [2, N] pair tensor of floats: 2 "nodes" of width 10, not the model's 8
    with pytest.raises(ValueError, match=r"`children` has embeddings of dimension 10 \(\[2, 10\]\), but this model's "
                                         r"embeddings have dimension 8"):
        module.score_pairs(wrong, wrong)
    with pytest.raises(ValueError, match="dimension 10"):
        module.rank_candidates(torch.randn(8), wrong)
    h = torch.randn(2, 8)
    assert module.score_pairs(h, h).shape == (2,)  # the right width still works
