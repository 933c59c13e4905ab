"""The DP-friendly training path (issue 10): clipped training still learns, frozen features + adapter,
validation graphs kept apart from test, and checkpoint selection with the base model as a candidate."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_dprel.callbacks import PrivacyCallback, ValidationSelection
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import GraphPair, GraphSource
from lightning_dprel.demos import random_feature_graph, random_text_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder, ResidualAdapter
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.transforms import EmbedText

# Utility checks compare runs: fixed batches and noise on purpose (the seeds' warnings are asserted in test_secret_randomness).
pytestmark = pytest.mark.filterwarnings("ignore:(DPRelationalModule\\(noise_seed|RelationalDataModule\\(sampling_seed)=<int>\\)")


class _Split(GraphSource):
    """Three disjoint random feature graphs: train, validation, test (communities share centres: transfer works)."""

    def __init__(self, n: int = 600, e: int = 1500, dim: int = 16) -> None:
        self.n, self.e, self.dim = n, e, dim

    def load(self) -> GraphPair:
        graphs = [random_feature_graph(self.n, self.e, dim=self.dim, seed=s) for s in (0, 0, 0)]
        # same centres (seed 0), fresh noise per graph so that nodes differ
        g = torch.Generator().manual_seed(1)
        for i, d in enumerate(graphs[1:], 1):
            d.x = d.x + 0.3 * torch.randn(d.x.shape, generator=g)
        return GraphPair(train=graphs[0], val=graphs[1], test=graphs[2], name="three-way synthetic")


def _dm(**kw):
    args = dict(expected_batch_size=32.0, neg_per_pos=4, max_degree=8, sampling_seed=3, eval_batch_size=512)
    args.update(kw)
    return RelationalDataModule(_Split(), **args)


def _fixed_tuples(dm: RelationalDataModule, count: int = 8):
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(count)]


def _mean_loss(module: DPRelationalModule, batches) -> float:
    with torch.no_grad():
        return float(torch.cat([module.per_tuple(b).losses for b in batches]).mean())


# --- clipped training at σ = 0 must keep learning -------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("clipping", ["standard", "freq"])
@pytest.mark.filterwarnings("ignore:DPRelationalModule\\(diagnostics=True\\)")  # asserted in the next test
def test_clipped_training_at_sigma_zero_learns_like_unclipped(clipping):
    """Loss drop of clipped σ = 0 training ≥ 0.5 × the unclipped drop (same batches, same steps, Adam).

    C = 0.01 is far below every per-tuple norm, so every tuple is clipped: only the direction survives.
    """
    torch.manual_seed(0)
    dm = _dm()
    dm.setup("fit")
    probe = _fixed_tuples(dm, 6)  # a fixed sample of training tuples (diagnostic only)
    drops = {}
    for mode, clip in (("none", 1.0), (clipping, 0.01)):
        dm_run = _dm()
        torch.manual_seed(0)
        module = DPRelationalModule(
            MLPEncoder(16, hidden_dim=32, out_dim=16), clipping=mode, clip_norm=clip, noise_multiplier=0.0,
            lr=3e-3, noise_seed=0, diagnostics=True,
        )
        before = _mean_loss(module, probe)
        quiet_trainer(max_steps=80).fit(module, dm_run)
        drops[mode] = before - _mean_loss(module, probe)
        if mode != "none":
            stats = module._dp_optimizer.last_step_stats
            assert stats["clipped_fraction"] >= 0.9  # (nearly) all clipped: the regime that must still learn
            assert stats["cos_clipped_unclipped"] > 0.5, stats
    assert drops["none"] > 0.2, drops
    assert drops[clipping] >= 0.5 * drops["none"], drops


def test_diagnostics_record_norms_cosines_and_update():
    dm = _dm()
    dm.setup("fit")
    with pytest.warns(UserWarning, match="outside the differential-privacy guarantee"):
        module = DPRelationalModule(MLPEncoder(16, hidden_dim=8, out_dim=8), clipping="standard", clip_norm=0.5,
                                    noise_multiplier=2.0, noise_seed=0, diagnostics=True, allow_untracked=True)
    with pytest.warns(UserWarning, match="outside the differential-privacy guarantee"):
        DPRelationalModule(MLPEncoder(16), diagnostics=True)
    with pytest.warns(UserWarning, match="without a PrivacyCallback"):
        quiet_trainer(max_steps=3).fit(module, dm)
    s = module._dp_optimizer.last_step_stats
    for key in ("norm_q10", "norm_q50", "norm_q90", "cos_clipped_unclipped", "clipped_sum_norm", "noise_norm", "update_norm"):
        assert key in s and s[key] == s[key], key
    assert s["norm_q10"] <= s["norm_q50"] <= s["norm_q90"]
    p = sum(q.numel() for q in module.encoder.parameters())
    assert s["noise_norm"] == pytest.approx(2.0 * 0.5 * p**0.5, rel=0.2)  # ‖N(0, σ²C²I_p)‖ ≈ σC√p
    assert s["clipped_sum_norm"] <= 0.5 * s["tuples"] + 1e-6


# --- validation graph apart from test -------------------------------------------------------------------

def test_validation_graph_is_not_the_test_graph():
    dm = _dm()
    dm.setup("fit")
    assert dm.has_validation_graph
    val = next(iter(dm.val_dataloader()))
    test = next(iter(dm.test_dataloader()))
    assert torch.equal(val.node_inputs["x"], dm._val.inputs["x"]) and torch.equal(test.node_inputs["x"], dm.test_inputs["x"])
    assert not torch.equal(val.node_inputs["x"], test.node_inputs["x"])


def test_val_source_overrides_and_missing_validation_warns():
    g = random_feature_graph(80, 200, seed=5)
    dm = RelationalDataModule(random_feature_graph(120, 300), val_source=g, expected_batch_size=8.0, neg_per_pos=2)
    dm.setup("fit")
    assert dm.has_validation_graph and dm._val.num_nodes == 80
    plain = RelationalDataModule(random_feature_graph(120, 300), expected_batch_size=8.0, neg_per_pos=2)
    plain.setup("fit")
    assert not plain.has_validation_graph
    with pytest.warns(UserWarning, match="selects on the test domain"):
        plain.val_dataloader()
    with pytest.raises(ValueError, match="validation graph has no relations"):
        RelationalDataModule(random_feature_graph(120, 300), val_source=Data(x=torch.randn(5, 16), edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=5), expected_batch_size=8.0, neg_per_pos=2).setup("fit")
    with pytest.raises(TypeError, match="`transform` must be callable"):
        RelationalDataModule(g, transform="EmbedText")


# --- selection on validation, the base model a candidate ------------------------------------------------

def test_selection_keeps_the_base_model_when_training_hurts():
    dm = _dm()
    module = DPRelationalModule(ResidualAdapter(16, mode="full"), clipping="none", noise_multiplier=0.0, lr=5.0, noise_seed=0)
    base = {n: p.detach().clone() for n, p in module.named_parameters()}
    sel = ValidationSelection(every_n_steps=5)
    quiet_trainer(max_steps=15, callbacks=[sel]).fit(module, dm)
    scores = [h["mrr"] for h in sel.history]
    assert [h["step"] for h in sel.history] == [0, 5, 10, 15]
    assert sel.best_step == scores.index(max(scores)) * 5
    if sel.best_step == 0:  # lr = 5 wrecks the adapter: the base model must come back exactly
        for n, p in module.named_parameters():
            assert torch.equal(p.detach(), base[n])
    assert module.ranking_metrics(dm.val_dataloader())["mrr"] == pytest.approx(max(scores))


def test_selection_also_evaluates_a_last_step_between_its_checks():
    """max_steps not a multiple of every_n_steps: the last iterate is a candidate too (and nothing logs in on_train_end)."""
    dm = _dm()
    module = DPRelationalModule(ResidualAdapter(16, rank=4), clipping="none", noise_multiplier=0.0, lr=1e-2, noise_seed=0)
    sel = ValidationSelection(every_n_steps=4)
    quiet_trainer(max_steps=6, callbacks=[sel]).fit(module, dm)
    assert [h["step"] for h in sel.history] == [0, 4, 6]


def test_selection_restores_a_trained_iterate_and_refuses_test_selection():
    dm = _dm()
    module = DPRelationalModule(MLPEncoder(16, hidden_dim=32, out_dim=16), clipping="standard", clip_norm=1.0,
                                noise_multiplier=0.0, lr=3e-3, noise_seed=0)
    sel = ValidationSelection(every_n_steps=20)
    quiet_trainer(max_steps=60, callbacks=[sel]).fit(module, dm)
    assert sel.best_step > 0 and sel.best_score > sel.history[0]["mrr"] + 0.01, sel.history
    state = sel.state_dict()
    again = ValidationSelection()
    again.load_state_dict(state)
    assert again.best_step == sel.best_step and again.history == sel.history

    plain = RelationalDataModule(random_feature_graph(120, 300), expected_batch_size=8.0, neg_per_pos=2, sampling_seed=1)
    with pytest.raises(ValueError, match="no validation graph"):
        quiet_trainer(max_steps=2, callbacks=[ValidationSelection()]).fit(DPRelationalModule(MLPEncoder(16), noise_seed=0, noise_multiplier=0.0, clipping="none"), plain)
    for bad, match in (({"every_n_steps": 0}, "every_n_steps"), ({"monitor": "loss"}, "monitor")):
        with pytest.raises(ValueError, match=match):
            ValidationSelection(**bad)


def test_selection_with_privacy_callback_spends_only_the_budget():
    dm = _dm()
    module = DPRelationalModule(ResidualAdapter(16, rank=4), clipping="standard", clip_norm=0.1, noise_multiplier=1.0, lr=1e-2, noise_seed=0)
    sel, priv = ValidationSelection(every_n_steps=5), PrivacyCallback(target_epsilon=3.0, delta=1e-4, calibrate=True)
    quiet_trainer(max_steps=20, callbacks=[priv, sel]).fit(module, dm)
    assert priv.epsilon <= 3.0 and priv.steps == 20 and sel.history[-1]["step"] == 20


# --- frozen features + residual adapter -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ResidualAdapter.MODES)
def test_residual_adapter_starts_as_identity(mode):
    x = torch.randn(7, 12)
    a = ResidualAdapter(12, mode=mode, rank=3)
    assert torch.equal(a(x), x)
    n = sum(p.numel() for p in a.parameters())
    assert n == {"lowrank": 2 * 12 * 3, "full": 144, "diagonal": 12}[mode]


@pytest.mark.parametrize("kwargs, match", [({"mode": "deep"}, "mode"), ({"rank": 0}, "rank"), ({"rank": 13}, "rank"), ({"init_scale": 0.0}, "init_scale")])
def test_residual_adapter_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResidualAdapter(12, **kwargs)


def test_embed_text_matches_the_encoder_and_caches(tmp_path, monkeypatch):
    import lightning_dprel.transforms as T
    from lightning_dprel.encoders import TextEncoder

    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path))
    graph = random_text_graph(30, 60)
    calls = []
    real = T.embed_texts
    monkeypatch.setattr(T, "embed_texts", lambda texts, *a, **k: calls.append(len(texts)) or real(texts, *a, **k))
    out = EmbedText("tiny-bert", max_length=16)(graph)
    assert out.x.shape == (30, 32) and calls == [len(set(graph.text))]
    # the same texts again, and a graph over a subset: no new encoder call
    again = EmbedText("tiny-bert", max_length=16)(graph)
    sub = Data(text=graph.text[:10], edge_index=graph.edge_index[:, :0], num_nodes=10)
    assert torch.equal(again.x, out.x) and torch.equal(EmbedText("tiny-bert", max_length=16)(sub).x, out.x[:10])
    assert calls == [len(set(graph.text))]
    # equal to the (frozen) TextEncoder's mean-pooled states
    from transformers import AutoTokenizer

    from lightning_dprel.demos import resolve_pretrained

    enc = TextEncoder("tiny-bert", lora_r=0).eval()
    tok = AutoTokenizer.from_pretrained(resolve_pretrained("tiny-bert"))
    t = tok(graph.text[:5], padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        ref = enc(t["input_ids"], t["attention_mask"])
    torch.testing.assert_close(out.x[:5], ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="needs `data.text`"):
        EmbedText("tiny-bert")(Data(x=torch.randn(3, 2)))
    with pytest.raises(ValueError, match="max_length"):
        EmbedText("tiny-bert", max_length=0)


# --- directed relations: orientation kept through capping, directed scores -------------------------------

def test_directed_datamodule_keeps_the_data_orientation():
    g = random_feature_graph(200, 500, seed=2)
    ei = g.edge_index[:, g.edge_index[0] != g.edge_index[1]]
    given = set(map(tuple, ei.t().tolist()))
    plain = RelationalDataModule(g, expected_batch_size=8.0, neg_per_pos=2, max_degree=4)
    directed = RelationalDataModule(g, expected_batch_size=8.0, neg_per_pos=2, max_degree=4, directed=True)
    plain.setup("fit"), directed.setup("fit")
    # same capped relation set (capping and the analysis see undirected relations), data orientation restored
    assert torch.equal(torch.sort(directed.train_edges, dim=0).values, plain.train_edges)
    assert all(e in given for e in map(tuple, directed.train_edges.t().tolist()))
    assert bool((plain.train_edges[0] < plain.train_edges[1]).all())
    assert directed.sampling_spec == plain.sampling_spec


def test_directed_cosine_scores_and_tuple_negatives():
    from lightning_dprel.methods.relational.losses import pair_scores, score_matrix, tuple_scores

    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 2, 6, generator=g).reshape(5, 12)  # [src ‖ dst] views
    s = pair_scores(h[0], h[1], score="directed_cosine", temperature=0.5)
    assert s == pytest.approx(float(torch.nn.functional.cosine_similarity(h[0, :6], h[1, 6:], dim=0)) / 0.5)
    assert float(s) != pytest.approx(float(pair_scores(h[1], h[0], score="directed_cosine", temperature=0.5)))
    torch.testing.assert_close(score_matrix(h, h, score="directed_cosine", temperature=0.5)[0, 1], s)
    # negatives replace the other end: anchor u -> (u, z); anchor v -> (z, v)
    t = tuple_scores(h[:4], torch.tensor([0, 1]), score="directed_cosine", temperature=0.5)
    ref = [pair_scores(h[0], h[1], score="directed_cosine", temperature=0.5),
           pair_scores(h[0], h[2], score="directed_cosine", temperature=0.5),
           pair_scores(h[3], h[1], score="directed_cosine", temperature=0.5)]
    torch.testing.assert_close(t, torch.stack(ref))
    # symmetric scores are unchanged by the rule
    c = tuple_scores(h[:4], torch.tensor([0, 1]), score="cosine", temperature=0.5)
    torch.testing.assert_close(c[2], pair_scores(h[1], h[3], score="cosine", temperature=0.5))
    with pytest.raises(ValueError, match="2d"):
        pair_scores(torch.randn(5), torch.randn(5), score="directed_cosine")


def test_directed_adapter_starts_at_the_base_cosine():
    x = torch.randn(9, 12)
    a = ResidualAdapter(12, rank=3, directed=True)
    h = a(x)
    assert h.shape == (9, 24)
    from lightning_dprel.methods.relational.losses import score_matrix

    torch.testing.assert_close(score_matrix(h, h, score="directed_cosine"), score_matrix(x, x, score="cosine"))
    frozen_down = ResidualAdapter(12, rank=3, train_down=False)
    assert [n for n, p in frozen_down.named_parameters() if p.requires_grad] == ["up"]
