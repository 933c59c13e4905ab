"""AdvSGM as a method of the library: provable by default (unit ``node_public_ids``, dense noise, ε within budget), the
paper's pipeline stopped by its Theorem 7 and labelled ε = ∞, ghost clipping exact on the two tables, saved and exported."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from torch_geometric.data import Data

from lightning_dprel.methods.advsgm.accounting import advsgm_paper_epsilon, advsgm_paper_stop_iteration
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.export import export_model
from lightning_dprel.grad_sample.ghost import ghost_grads, ghost_plan
from lightning_dprel.grad_sample.per_tuple import per_tuple_grads
from lightning_dprel.methods.advsgm import (
    AdvSGMPaperDataModule, DPSkipGramModule, NodeIdEmbedding, PaperStop, PrivateIdsSkipGramDataModule, SkipGramDataModule,
)
from lightning_dprel.methods.advsgm.losses import adversarial_loss, sgns_loss

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _blocks(n: int = 120, blocks: int = 4, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % blocks
    a, b = torch.randint(0, n, (2, 6 * n), generator=g)
    keep = (a != b) & ((y[a] == y[b]) | (torch.rand(a.shape, generator=g) < 0.1))
    return Data(edge_index=torch.stack([a[keep], b[keep]]), num_nodes=n, y=y)


@pytest.mark.slow
def test_provable_fit_spends_at_most_the_budget_for_the_public_ids_unit():
    dm = SkipGramDataModule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    module = DPSkipGramModule(dim=8, lr=0.05)
    cb = PrivacyCallback(target_epsilon=3.0, delta=1e-5, calibrate=True)
    quiet_trainer([cb], max_steps=30).fit(module, dm)
    assert module.privacy_ledger.private_mechanism == "skipgram_public_ids"
    assert dm.sampling_spec.privacy_unit == "node_public_ids"
    assert 0 < module.privacy_ledger.epsilon(1e-5) <= 3.0
    assert module.encoder.node_vectors.num_embeddings == 120  # built from the datamodule's id count


@pytest.mark.parametrize("public_ids, accounting", [(False, "skipgram_public_ids"), (True, "standard")])
def test_a_mechanism_proven_for_another_unit_is_refused(public_ids, accounting):
    datamodule = SkipGramDataModule if public_ids else PrivateIdsSkipGramDataModule
    dm = datamodule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    module = DPSkipGramModule(dim=8, accounting=accounting)
    with pytest.raises(ValueError, match="Privacy unit mismatch"):
        quiet_trainer([PrivacyCallback(target_epsilon=3.0, delta=1e-5, calibrate=True)], max_steps=2).fit(module, dm)


def test_private_node_set_uses_the_standard_accounting_and_costs_more():
    dm_pub = SkipGramDataModule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    dm_priv = PrivateIdsSkipGramDataModule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    eps = {}
    for name, dm, acc in (("public", dm_pub, "skipgram_public_ids"), ("private", dm_priv, "standard")):
        module = DPSkipGramModule(dim=8, accounting=acc, noise_multiplier=1.5)
        quiet_trainer([PrivacyCallback(delta=1e-5)], max_steps=20).fit(module, dm)
        eps[name] = module.privacy_ledger.epsilon(1e-5)
    assert eps["public"] < eps["private"]


@pytest.mark.parametrize("adversarial", [0.0, 0.5])
def test_ghost_clipping_equals_per_tuple_autograd_on_the_two_tables(adversarial):
    torch.manual_seed(0)
    enc = NodeIdEmbedding(30, 5, init_std=3.0).double()
    ids = torch.randint(0, 30, (9, 5))
    anchor = torch.randint(0, 2, (9, 3))
    fakes = torch.randn(9, 2, 5, dtype=torch.float64)

    def head(h, anchor, fakes):
        return sgns_loss(h, anchor) + adversarial * adversarial_loss(h, fakes)

    inputs = {"node_id": ids}
    ghost = ghost_grads(enc, inputs, head, (anchor, fakes), plan=ghost_plan(enc)).grads
    vmap = per_tuple_grads(enc, inputs, head, (anchor, fakes)).grads
    assert ghost_plan(enc).exact
    norms = torch.cat([g.reshape(9, -1) for g in vmap.values()], 1).norm(dim=1)
    torch.testing.assert_close(ghost.norms(), norms, rtol=1e-9, atol=1e-12)
    f = torch.rand(9, dtype=torch.float64)
    for name, g in vmap.items():
        torch.testing.assert_close(ghost.weighted_sum(f)[name], torch.einsum("b,b...->...", f, g), rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_the_adversarial_generator_trains_on_released_state_only():
    dm = SkipGramDataModule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    module = DPSkipGramModule(dim=8, adversarial=0.5, noise_multiplier=1.0)
    quiet_trainer([PrivacyCallback(delta=1e-5)], max_steps=5).fit(module, dm)
    theta = module.generator.theta.detach().clone()
    # The generator's step reads the released tables and public ids only: the same call on the same tables gives the same step.
    ids, noise = torch.arange(10), torch.zeros(10, 8)
    g1 = module.generator.fit_released(module.node_vectors, module.context_vectors, ids, noise)
    assert not torch.equal(theta, module.generator.theta.detach())
    assert module.privacy_ledger.steps == 5 and module.privacy_ledger.private_mechanism == "skipgram_public_ids"
    assert g1 > 0


def _paper(target: float, rule: str = "theorem7"):
    data = _blocks(200)
    dm = AdvSGMPaperDataModule(data, batch_size=16, neg_per_pos=2, sampling_seed=0)
    module = DPSkipGramModule(mode="paper", dim=8, lr=0.1, paper_rounds=15)
    stop = PaperStop(target, rule=rule, max_iterations=100)
    quiet_trainer([stop], max_steps=1000).fit(module, dm)
    return dm, module, stop


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["theorem7", "code_product"])
def test_the_paper_mode_stops_where_its_accounting_says_and_is_labelled_infinite(rule, tmp_path):
    with pytest.warns(UserWarning, match="does not hold"):
        DPSkipGramModule(mode="paper", num_nodes=10)
    dm, module, stop = _paper(1.0, rule)
    spec = dm.sampling_spec
    sizes = dict(num_nodes=spec.num_nodes, num_edges=spec.num_edges, batch_size=16, k=2, sigma=5.0, delta=1e-5)
    expected = advsgm_paper_stop_iteration(1.0, max_iterations=100, rule=rule, **sizes)
    assert 1 <= expected < 100 and stop.iterations == expected
    assert module.privacy_ledger.steps == expected  # two updates per iteration are one sample
    assert module.paper_claim["nominal_epsilon"] == pytest.approx(advsgm_paper_epsilon(expected, **sizes))
    report = json.loads((export_model(module, tmp_path / "paper", delta=1e-5) / "privacy.json").read_text())
    assert report["epsilon"] == "inf" and report["unprotected_steps"] == expected
    assert report["published_claim"]["provable_epsilon"] == "inf" and "does not hold" in report["published_claim"]["warning"]


@pytest.mark.slow
def test_a_provable_model_is_saved_reloaded_and_exported(tmp_path):
    dm = SkipGramDataModule(_blocks(), max_degree=4, expected_batch_size=10, neg_per_pos=2, sampling_seed=0)
    module = DPSkipGramModule(dim=8)
    trainer = quiet_trainer([PrivacyCallback(target_epsilon=5.0, delta=1e-5, calibrate=True)], max_steps=4)
    trainer.fit(module, dm)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    again = DPSkipGramModule.load_from_checkpoint(tmp_path / "m.ckpt")
    torch.testing.assert_close(again.node_vectors, module.node_vectors)
    assert again.privacy_ledger.epsilon(1e-5) == pytest.approx(module.privacy_ledger.epsilon(1e-5))
    folder = export_model(module, tmp_path / "out", delta=1e-5)
    report = json.loads((folder / "privacy.json").read_text())
    assert report["privacy_unit"].startswith("one node") and float(report["epsilon"]) <= 5.0
    assert "published_claim" not in report
    auc = trainer.test(module, dm, verbose=False)[0]["test_auc"]
    assert 0.0 <= auc <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("config, mechanism", [("advsgm_tiny.yaml", "skip-gram, edge level"),
                                               ("advsgm_node.yaml", "skip-gram, public ids")])
def test_the_configs_train_privately_from_the_command_line(config, mechanism, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_dprel", "fit", "--config", str(root / "configs" / config),
         "--trainer.max_steps", "5", "--trainer.default_root_dir", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "link AUC" in proc.stdout and mechanism in proc.stdout
