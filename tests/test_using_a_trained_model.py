"""Issue 21 (4): a trained or loaded relational model scores child → parent pairs and ranks candidates with its own
score (the numbers training and evaluation use), the README shows how, ``python -m lightning_dprel --help`` names
``export``, and the accounting CLI's promised plot exists (a PNG, without torch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pytorch_lightning import Trainer

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import random_feature_graph, random_text_graph
from lightning_dprel.encoders import MLPEncoder, ResidualAdapter
from lightning_dprel.methods.relational.losses import pair_scores, tuple_scores
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.methods.relational.ranking import target_ranks

ROOT = Path(__file__).resolve().parents[1]
CHILDREN = ["heart lung fever", "alpha beta gamma delta", "red green blue"]
PARENTS = ["red green", "heart fever", "alpha delta"]
ACCOUNTING = ["--nodes", "20000", "--edges", "50000", "--max-degree", "3", "--sampling-rate", "0.002",
              "--neg-per-pos", "2", "--steps", "2000"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-step private fit of the main job's kind of model (frozen tiny-bert text embeddings + a directed adapter),
    saved as a checkpoint and exported."""
    folder = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTNING_DPREL_CACHE", str(folder / "cache"))
        from lightning_dprel.transforms import EmbedText

        dm = RelationalDataModule(
            random_text_graph(80, 200), transform=EmbedText("tiny-bert", max_length=16), directed=True,
            expected_batch_size=8, neg_per_pos=1, max_length=16,
        )
        module = DPRelationalModule(ResidualAdapter(32, rank=2, directed=True), score="directed_cosine", lr=0.05)
        trainer = Trainer(
            accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0, max_steps=3, callbacks=[PrivacyCallback(target_epsilon=None, delta=1e-4)],
        )
        trainer.fit(module, datamodule=dm)
        trainer.save_checkpoint(folder / "model.ckpt")
        from lightning_dprel.export import export_model

        export_model(module, folder / "export")
        yield module.eval(), dm, folder


def test_score_pairs_gives_the_training_and_evaluation_scores(trained):
    module, dm, _ = trained
    assert module.hparams.score == "directed_cosine" and module.privacy_ledger.private_steps == 3
    hc, hp = module.embed_texts(CHILDREN), module.embed_texts(PARENTS)
    expected = pair_scores(hc, hp, score="directed_cosine", temperature=module.hparams.temperature)
    got = module.score_pairs(CHILDREN, PARENTS)
    assert got.shape == (3,)
    # the same scoring function; texts embedded in another batch may round differently on a loaded CPU (≈ 2e-6 seen)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(module.score_pairs(hc, hp), expected, rtol=0, atol=0)  # embeddings work too
    torch.testing.assert_close(module.score_pairs(CHILDREN, hp), expected, rtol=1e-6, atol=1e-5)
    # the training head scores a tuple's positive (u, v) the same way
    h = torch.stack([hc, hp], dim=1)  # [3, 2, d]: (u, v) tuples without negatives
    pos = tuple_scores(h, torch.zeros(3, 0, dtype=torch.long), score="directed_cosine", temperature=module.hparams.temperature)
    torch.testing.assert_close(got, pos[:, 0])
    # directed: child → parent is not parent → child (the trained adapter moved the source view)
    assert not torch.allclose(module.score_pairs(PARENTS, CHILDREN), got)
    assert not torch.allclose(got, pair_scores(hc, hp, score="cosine", temperature=module.hparams.temperature))


def test_rank_candidates_orders_as_the_evaluation_ranks(trained):
    module, dm, _ = trained
    h = module.embed(dm.test_inputs)
    n, tau = h.shape[0], module.hparams.temperature
    full = module.rank_candidates(h[0], h)  # one query embedding [d]: [C] indices and scores
    assert full.indices.shape == full.scores.shape == (n,) and sorted(full.indices.tolist()) == list(range(n))
    torch.testing.assert_close(full.scores, pair_scores(h[0], h[full.indices], score="directed_cosine", temperature=tau))
    assert bool((full.scores[:-1] >= full.scores[1:]).all())
    top = module.rank_candidates(h[0], h, k=5)
    assert top.indices.tolist() == full.indices[:5].tolist()
    # the rank of a target among candidates is the evaluation's rank (target_ranks with a candidate set)
    query, candidates = torch.arange(6), torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(i))[:10] for i in range(6)])
    target = candidates[:, 3]
    ranks = target_ranks(h, query, target, candidates, score="directed_cosine", temperature=tau)
    many = module.rank_candidates(h[query], h[candidates[0]])  # several queries [Q, d]: [Q, C]
    assert many.indices.shape == many.scores.shape == (6, 10)
    assert many.indices[0].tolist() == module.rank_candidates(h[0], h[candidates[0]]).indices.tolist()
    for q in range(6):
        order = module.rank_candidates(h[query[q]], h[candidates[q]]).indices.tolist()
        assert order.index(3) + 1 == int(ranks[q])
    # texts: the query is the child, candidates possible parents
    by_text = module.rank_candidates(CHILDREN[0], PARENTS)
    expected = module.score_pairs([CHILDREN[0]] * 3, PARENTS)
    assert by_text.indices.tolist() == torch.argsort(expected, descending=True, stable=True).tolist()
    torch.testing.assert_close(by_text.scores, expected[by_text.indices])


def test_nan_scores_rank_last_and_ties_keep_the_candidates_order():
    module = DPRelationalModule(MLPEncoder(4, hidden_dim=4, out_dim=4), score="dot", allow_untracked=True)
    cand = torch.tensor([[1.0, 0, 0, 0], [float("nan"), 0, 0, 0], [2.0, 0, 0, 0], [1.0, 0, 0, 0], [-1.0, 0, 0, 0]])
    ranked = module.rank_candidates(torch.tensor([1.0, 0, 0, 0]), cand)
    assert ranked.indices.tolist() == [2, 0, 3, 4, 1]


@pytest.mark.parametrize("how", ["load_exported", "load_from_checkpoint"])
def test_a_loaded_model_scores_and_ranks_as_the_trained_one(trained, how):
    module, _, folder = trained
    if how == "load_exported":
        from lightning_dprel.export import load_exported

        loaded = load_exported(folder / "export")
    else:
        loaded = DPRelationalModule.load_from_checkpoint(folder / "model.ckpt", map_location="cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTNING_DPREL_CACHE", str(folder / "cache"))
        torch.testing.assert_close(loaded.score_pairs(CHILDREN, PARENTS), module.score_pairs(CHILDREN, PARENTS))
        a, b = loaded.rank_candidates(CHILDREN, PARENTS, k=2), module.rank_candidates(CHILDREN, PARENTS, k=2)
    assert a.indices.shape == (3, 2) and torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.scores, b.scores)


def test_feature_models_take_node_inputs():
    data = random_feature_graph(30, 60)
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), allow_untracked=True).train()
    x = data.x[:5]
    h = module.eval().embed({"x": x})
    module.train()
    expected = pair_scores(h, h.flip(0), score="cosine", temperature=module.hparams.temperature)
    torch.testing.assert_close(module.score_pairs({"x": x}, {"x": x.flip(0)}), expected)
    assert module.training  # restored
    assert module.rank_candidates({"x": x[:2]}, {"x": x}, k=3).indices.shape == (2, 3)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda m, h: m.score_pairs(h[:3], h[:2]), ValueError, "same length"),
        (lambda m, h: m.score_pairs(h[:0], h[:0]), ValueError, "empty"),
        (lambda m, h: m.score_pairs([], []), ValueError, "empty"),
        (lambda m, h: m.rank_candidates(h[0], h[:0]), ValueError, "empty"),
        (lambda m, h: m.score_pairs(h[:2], h[:2, :4]), ValueError, "dimension"),
        (lambda m, h: m.rank_candidates(h[0], h[:, :4]), ValueError, "dimension"),
        (lambda m, h: m.score_pairs("heart", "lung"), TypeError, "wrap one text in a list"),
        (lambda m, h: m.score_pairs([1, 2], [3, 4]), TypeError, "list of texts"),
        (lambda m, h: m.score_pairs(["heart", 2], ["lung", "fever"]), TypeError, "list of texts"),
        (lambda m, h: m.score_pairs(torch.ones(2, 8, dtype=torch.long), h[:2]), TypeError, "float embeddings"),
        (lambda m, h: m.score_pairs(h[:2].unsqueeze(0), h[:2]), TypeError, "float embeddings"),
        (lambda m, h: m.score_pairs(h[:2].numpy(), h[:2]), TypeError, "ndarray"),
        (lambda m, h: m.rank_candidates(h[0], h, k=0), ValueError, "positive int"),
        (lambda m, h: m.rank_candidates(h[0], h, k=1.5), TypeError, "positive int"),
        (lambda m, h: m.rank_candidates(h[0], h, k=True), TypeError, "positive int"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, error, match):
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), allow_untracked=True)
    h = torch.randn(5, 8)
    with pytest.raises(error, match=match):
        call(module, h)


def test_readme_example_scores_and_ranks_with_an_exported_model(trained, tmp_path, monkeypatch):
    module, _, folder = trained
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("## Saved models and export") : text.index("## Choosing settings for your own graph")]
    code = next(block for block in re.findall(r"```python\n(.*?)```", section, re.S) if "rank_candidates(" in block)
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(folder / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "my_graph").mkdir(parents=True)
    (tmp_path / "outputs" / "my_graph" / "export").symlink_to(folder / "export")
    scope: dict = {}
    exec(compile(code, "docs/usage.md", "exec"), scope)
    candidates, best, scores = scope["candidates"], scope["best"], scope["scores"]
    torch.testing.assert_close(scores, module.score_pairs(scope["children"], scope["parents"]))
    all_scores = module.score_pairs(["Aortic valve stenosis"] * len(candidates), candidates)
    assert best.indices.tolist() == torch.argsort(all_scores, descending=True, stable=True)[:2].tolist()


@pytest.mark.slow
def test_module_help_lists_the_export_subcommand():
    res = subprocess.run([sys.executable, "-m", "lightning_dprel", "--help"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr
    assert "export" in res.stdout and "--ckpt_path" in res.stdout and "fit" in res.stdout


def test_accounting_plot_subcommand_writes_a_png(tmp_path, capsys):
    from lightning_dprel.accounting.cli import main

    png = tmp_path / "eps.png"
    assert main(["plot", *ACCOUNTING, "--noise-multiplier", "1.0", "--out", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["steps"][-1] == 2000 and set(out["epsilon"]) == {"freq_paper", "freq_corrected", "standard", "naive"}
    assert main(["epsilon", *ACCOUNTING, "--noise-multiplier", "1.0", "--clipping", "freq", "--json"]) == 0
    assert out["epsilon"]["freq_corrected"] == pytest.approx(json.loads(capsys.readouterr().out)["epsilon"], rel=1e-12)
    assert main(["plot", *ACCOUNTING, "--noise-multiplier", "1.0", "--out", str(png)]) == 0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.slow
def test_accounting_plot_subcommand_is_in_the_help_and_imports_no_torch(tmp_path):
    png = tmp_path / "eps.png"
    code = (
        "import sys\nfrom lightning_dprel.accounting.cli import main\n"
        f"main(['plot', *{ACCOUNTING!r}, '--noise-multiplier', '1.0', '--out', {str(png)!r}])\n"
        "heavy = sorted(m for m in ('torch', 'torch_geometric', 'pytorch_lightning', 'transformers') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the command picks Agg itself
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert next(x for x in res.stdout.splitlines() if x.startswith("HEAVY=")) == "HEAVY="
    assert png.stat().st_size > 1000
    res = subprocess.run([sys.executable, "-m", "lightning_dprel.accounting", "--help"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, check=True)
    assert "plot" in res.stdout.split("positional arguments")[1]
