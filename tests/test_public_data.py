"""Public data beside the private graph (issue 24): never charged, never in a private batch, named in privacy.json;
the warm start runs once and keeps the base model a candidate; the subspace reads public data only."""

from __future__ import annotations

import json

import pytest
import torch

from lightning_dprel.callbacks import PrivacyCallback, PublicGradientSubspace, PublicWarmStart, ValidationSelection
from lightning_dprel.callbacks.public import PublicInterleave, warm_start
from lightning_dprel.core.subspace import GradientSubspace
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import GraphPair, GraphSource
from lightning_dprel.datamodules.edge_tuples.public import PublicRelations
from lightning_dprel.demos import random_feature_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import ResidualAdapter
from lightning_dprel.export import export_model
from lightning_dprel.methods.relational.module import DPRelationalModule

pytestmark = pytest.mark.filterwarnings("ignore:(DPRelationalModule\\(noise_seed|RelationalDataModule\\(sampling_seed)=<int>\\)")
DIM = 8


class _Split(GraphSource):
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def load(self) -> GraphPair:
        train, val, test = (random_feature_graph(120, 300, dim=DIM, seed=s) for s in (self.seed, 11, 12))
        return GraphPair(train=train, val=val, test=test, name="synthetic")


def _public_graph():
    return random_feature_graph(90, 240, dim=DIM, seed=7)


def _dm(seed: int = 0, **kw):
    args = dict(expected_batch_size=16.0, neg_per_pos=1, max_degree=6, sampling_seed=3, eval_batch_size=256, directed=True,
                public=_public_graph())
    args.update(kw)
    return RelationalDataModule(_Split(seed), **args)


def _module(**kw):
    args = dict(score="directed_cosine", loss="hinge", margin=2.0, temperature=0.5, clipping="standard", clip_norm=1.0, noise_seed=1)
    args.update(kw)
    return DPRelationalModule(ResidualAdapter(DIM, rank=2, directed=True), **args)


def test_public_relations_stay_out_of_the_private_stream_and_the_budget():
    with_public, without = _dm(), _dm(public=None)
    with_public.setup("fit"), without.setup("fit")
    assert with_public.sampling_spec == without.sampling_spec  # m, n, γ: the accountant's facts are the private graph's
    assert torch.equal(with_public.train_edges, without.train_edges)
    for a, b in zip(list(iter(with_public.train_dataloader()))[:5], list(iter(without.train_dataloader()))[:5]):
        assert torch.equal(a.pos, b.pos) and torch.equal(a.node_inputs["x"], b.node_inputs["x"])
    pub = with_public.public
    batch = pub.sample(32, neg_per_pos=1, step=0)
    assert torch.equal(batch.node_inputs["x"], pub.inputs["x"][batch.node_ids])
    again = pub.sample(32, neg_per_pos=1, step=0)
    assert torch.equal(batch.pos, again.pos) and not torch.equal(batch.pos, pub.sample(32, neg_per_pos=1, step=1).pos)
    rel = {tuple(e) for e in pub.relations.t().tolist()}
    assert all(tuple(e) in rel for e in batch.pos.tolist())


def test_warm_start_and_subspace_charge_nothing_and_privacy_json_names_them(tmp_path):
    module, dm = _module(), _dm()
    callbacks = [PrivacyCallback(target_epsilon=8.0, delta=1e-5, calibrate=True), ValidationSelection(every_n_steps=3),
                 PublicWarmStart(steps=5, batch_size=32), PublicGradientSubspace(k=3, every_n_steps=2, num_tuples=32),
                 PublicInterleave(every_n_steps=2, batch_size=32)]
    quiet_trainer(callbacks, max_steps=6).fit(module, dm)
    ledger = module.privacy_ledger
    assert ledger.steps == 6 and ledger.private_steps == 6  # the 5 public steps and 3 subspace estimates are not releases
    report = json.loads((export_model(module, tmp_path) / "privacy.json").read_text())
    public = report["public_data"]
    assert public["graph"]["charged"] is False and public["graph"]["relations"] == dm.public.num_relations
    assert public["warm_start"]["steps"] == 5 and public["subspace"]["k"] == 3 and public["interleave"]["every_n_steps"] == 2
    assert callbacks[-2].refreshes == 3  # before step 0, at steps 2 and 4


def test_warm_start_runs_once_and_the_base_model_stays_a_candidate():
    module, dm = _module(clipping="none", noise_multiplier=0.0), _dm()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    sel = ValidationSelection(every_n_steps=2)
    wreck = PublicWarmStart(steps=20, lr=50.0, batch_size=32)  # a ruinous warm start: validation must bring the base back
    trainer = quiet_trainer([sel, wreck], max_steps=2)
    trainer.fit(module, dm)
    assert sel.history[0]["candidate"] == "base" and len(sel.history) >= 2
    assert sel.history[1]["mrr"] < sel.history[0]["mrr"]
    assert sel.best_candidate == "base"
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0)
    assert wreck.done and wreck.state_dict() == {"done": True}
    fresh = PublicWarmStart(steps=20)
    fresh.load_state_dict(wreck.state_dict())
    assert fresh.done  # a resumed fit does not pre-train again


def test_warm_start_lowers_the_public_loss():
    module, dm = _module(), _dm()
    dm.setup("fit")
    batch = dm.public.sample(64, neg_per_pos=1, step=123)
    with torch.no_grad():
        start = float(module.public_loss(batch))
    warm_start(module, dm.public, steps=30, lr=0.05, batch_size=64, neg_per_pos=1)
    with torch.no_grad():
        assert float(module.public_loss(batch)) < start


def test_the_subspace_reads_public_data_only():
    """Two different private graphs, the same public graph and parameters: the same basis."""
    bases = []
    for seed in (0, 5):
        module, dm = _module(), _dm(seed=seed)
        dm.setup("fit")
        batch = dm.public.sample(32, neg_per_pos=1, step=0)
        bases.append(GradientSubspace.fit(module.public_tuple_grads(batch), 3).basis)
    torch.testing.assert_close(bases[0], bases[1], rtol=0, atol=0)


def test_relation_fraction_gives_nested_subsets():
    edges = {}
    for f in (0.25, 0.5, 1.0):
        dm = _dm(relation_fraction=f, max_degree=12)
        dm.setup("fit")
        edges[f] = {tuple(e) for e in dm.train_edges.t().tolist()}
    assert edges[0.25] < edges[0.5] < edges[1.0]
    assert 0.1 < len(edges[0.25]) / len(edges[1.0]) < 0.45


def test_bad_public_inputs_are_refused():
    with pytest.raises(ValueError, match="relation_fraction"):
        _dm(relation_fraction=0.0)
    with pytest.raises(ValueError, match="relation_fraction"):
        _dm(relation_fraction=1.5)
    with pytest.raises(ValueError, match="`public` needs a graph"):
        PublicRelations(None)
    with pytest.raises(RuntimeError, match="after prepare"):
        PublicRelations(_public_graph()).sample(4, neg_per_pos=1, step=0)
    with pytest.raises(ValueError, match="num_tuples"):
        PublicGradientSubspace(k=16, num_tuples=8)
    with pytest.raises(ValueError, match="`steps` must be an int >= 0"):
        PublicWarmStart(steps=-1)
    with pytest.raises(ValueError, match="needs public data"):
        quiet_trainer([PublicWarmStart(steps=2)], max_steps=1).fit(_module(clipping="none", noise_multiplier=0.0), _dm(public=None))
