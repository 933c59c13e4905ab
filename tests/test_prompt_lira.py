"""Online LiRA on prompts (DP-GPL Alg. 1): the pipeline runs, detects memorised shots, not untrained prompts, the
one-batch union trains every owner as if alone, and bad input is refused."""

from __future__ import annotations

import pytest
import torch

from lightning_dprel.audit.prompt_lira import concat_ego_batches, prompt_lira
from lightning_dprel.datamodules.datasets import SyntheticNodes
from lightning_dprel.methods.dp_gpl import GraphEncoder, PromptDataModule, PromptedModel, TuningConfig, pretrain, tune_prompts

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("one_thread")]
CFG = TuningConfig("gpf_plus", epochs=30, lr=0.05)
SMALL = dict(shots=2, num_shadows=8, num_targets=20, non_members_per_shot=10)


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    dm = PromptDataModule(SyntheticNodes(200, 3, dim=8, feature_noise=1.0, seed=3), num_teachers=4, num_queries=10, fanout=5)
    dm.setup()
    x_pub, ei_pub = dm.public_graph()
    encoder = pretrain(GraphEncoder(dm.num_features, 16, num_layers=2), x_pub, ei_pub, method="dgi", epochs=5, seed=0)
    pool, labels, _ = dm.teacher_examples()
    return encoder, dm.data.x, pool, labels


def test_pipeline_returns_a_valid_summary(setting):
    encoder, x, pool, labels = setting
    res = prompt_lira(encoder, x, pool, labels, cfg=CFG, seed=0, **SMALL)
    assert 0.0 <= res.auc <= 1.0 and all(0.0 <= t <= 1.0 for t in res.tprs)
    assert res.summary.members == 20 * 2 and res.summary.non_members == 20 * 2 * 10
    assert res.num_candidates == 24 and res.num_candidates % 4 == 0 and res.in_per_candidate == 4
    assert res.scores.shape == res.is_member.shape == res.target_phi.shape and bool(torch.isfinite(res.scores).all())
    assert res.in_phi.shape == res.out_phi.shape == (440, 4)
    assert res.rescore(fixed_variance=False) == res.summary and 0.0 <= res.rescore(fixed_variance=True).auc <= 1.0
    # a target's members and non-members are distinct pool nodes
    for r in range(20):
        nodes = res.candidate[res.target == r]
        assert nodes.unique().numel() == nodes.numel() == 22
    assert res.member_accuracy >= 0.9  # 2-shot prompts fit their shots


def test_memorised_random_labels_are_detected_and_untrained_prompts_are_not(setting):
    encoder, x, pool, _ = setting
    random_labels = torch.randint(0, 4, (pool.size,), generator=torch.Generator().manual_seed(7))
    res = prompt_lira(encoder, x, pool, random_labels, num_classes=4, cfg=CFG, seed=1, **SMALL)
    assert res.member_accuracy == 1.0 and res.non_member_accuracy < 0.5  # memorised, not generalised
    assert res.auc > 0.75
    untrained = prompt_lira(encoder, x, pool, random_labels, num_classes=4, cfg=TuningConfig("gpf_plus", epochs=0), seed=1, **SMALL)
    assert abs(untrained.auc - 0.5) < 0.2  # nothing learnt: members and non-members are exchangeable
    assert res.auc > untrained.auc + 0.25


def test_the_concatenated_union_trains_each_owner_as_if_alone(setting):
    encoder, x, pool, labels = setting
    idx = torch.tensor([3, 5, 8])
    union = concat_ego_batches([pool.select(idx), pool.select(torch.tensor([5, 1]))])  # node 5 in both owners
    assert union.size == 5 and torch.equal(union.rows[union.center], pool.rows[pool.center[torch.tensor([3, 5, 8, 5, 1])]])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        both = PromptedModel(encoder, 3, CFG, num_prompts=2)
    alone = PromptedModel(encoder, 3, CFG)
    with torch.no_grad():
        for a, b in zip(alone.trainable(), both.trainable()):
            a.copy_(b[:1])
    tune_prompts(both, x, union, labels[torch.tensor([3, 5, 8, 5, 1])], torch.tensor([0, 0, 0, 1, 1]))
    tune_prompts(alone, x, pool.select(idx), labels[idx], torch.zeros(3, dtype=torch.long))
    for a, b in zip(alone.trainable(), both.trainable()):
        torch.testing.assert_close(a[0], b[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(shots=0), "shots"),
    (dict(num_shadows=7), "even"),
    (dict(num_shadows=2), "num_shadows"),
    (dict(num_targets=0), "num_targets"),
    (dict(non_members_per_shot=1000), "candidate nodes"),
    (dict(num_candidates=5), "num_candidates"),
    (dict(num_classes=2), "labels"),
])
def test_bad_parameters_raise(setting, kwargs, match):
    encoder, x, pool, labels = setting
    with pytest.raises(ValueError, match=match):
        prompt_lira(encoder, x, pool, labels, cfg=CFG, **{**SMALL, **kwargs})


def test_bad_inputs_raise(setting):
    encoder, x, pool, labels = setting
    with pytest.raises(ValueError, match="labels"):
        prompt_lira(encoder, x, pool, labels[:-1], cfg=CFG, **SMALL)
    with pytest.raises(ValueError, match="labels"):
        prompt_lira(encoder, x, pool, labels.float(), cfg=CFG, **SMALL)
    with pytest.raises(ValueError, match="x"):
        prompt_lira(encoder, x[:, :3], pool, labels, cfg=CFG, **SMALL)
    with pytest.raises(TypeError, match="EgoBatch"):
        prompt_lira(encoder, x, list(range(pool.size)), labels, cfg=CFG, **SMALL)
    with pytest.raises(TypeError, match="in_dim"):
        prompt_lira(torch.nn.Linear(8, 8), x, pool, labels, cfg=CFG, **SMALL)
    with pytest.raises(ValueError, match="EgoBatch"):
        concat_ego_batches([])
