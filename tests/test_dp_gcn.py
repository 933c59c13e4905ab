"""DP-GCN with random graph splits (issue 14): accounting, data-independent splits, sensitivity, training end to end."""

from __future__ import annotations

import math
import warnings

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism
from dp_accounting.privacy_accountant import NeighboringRelation
import pytest
import torch
from scipy import integrate, stats
from torch_geometric.data import Data

from lightning_dprel.accounting import Accountant
from lightning_dprel.accounting.analysis.substitution import poisson_gaussian_rdp, substitution_rdp
from lightning_dprel.accounting.mechanisms import per_step_rdp
from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.moments import moments_accountant_epsilon
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.core.clipping import standard_clip
from lightning_dprel.datamodules.datasets.nodes import NodeSource, SyntheticNodes
from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
from lightning_dprel.methods.dp_gcn.gnn import GNNClassifier
from lightning_dprel.datamodules.graph_splits import keyed_split, split_edges
from lightning_dprel.methods.dp_gcn.module import DPNodeModule
from lightning_dprel.core.randomness import KeyedStream

DELTA = 1e-5


# --- the paper's own numbers, with its own accountant ------------------------------------------------------------
@pytest.mark.parametrize(("sigma", "steps", "published"), [
    (4.0, 2000, 136.51), (26.0, 2000, 9.75), (48.0, 2000, 4.91), (112.0, 2000, 2.00),  # Table 3, SGD (2000 epochs)
    (2.0, 500, 136.51), (13.0, 500, 9.75), (24.0, 500, 4.91), (56.0, 500, 2.00),  # Table 3, Adam (500 epochs)
])
def test_moments_accountant_reproduces_table_3(sigma, steps, published):
    """Full graph = one example (q = 1), integer orders, δ = 1e-5: the ε the paper reports for each noise value."""
    eps, _ = moments_accountant_epsilon(1.0, sigma, steps, DELTA)
    assert round(eps, 2) == published


@pytest.mark.parametrize(("lot", "sigma", "published"), [(600, 4.0, 1.2586), (6000, 4.0, 4.24), (60000, 4.0, 15.13), (60000, 50.0, 0.98)])
def test_moments_accountant_reproduces_appendix_c_mnist(lot, sigma, published):
    """Appendix C, Table 4 (100 epochs of MNIST, N = 60,000): 1.2586 is also Abadi et al.'s number."""
    q = lot / 60000
    eps, _ = moments_accountant_epsilon(q, sigma, int(100 / q), DELTA)
    assert eps == pytest.approx(published, abs=0.5 * 10 ** -(len(str(published).split(".")[1])))


def _spec(q: float, s: int = 20):
    return NodeSplitDataModule(SyntheticNodes(40), num_splits=s, sampling_rate=q).sampling_spec


def test_subgraph_mapping_is_the_poisson_gaussian_of_dp_accounting():
    """K = 1, k = 0: one subgraph = one example; the add/remove reading equals dp-accounting's Poisson Gaussian."""
    dp_accounting = pytest.importorskip("dp_accounting")
    spec = _spec(0.25)
    orders = np.array([2.0, 3.0, 8.0, 32.0])  # dp-accounting does not converge at 1.5 for these (it returns inf)
    ours = per_step_rdp("gcn_paper", spec, 1.3, orders=orders)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.3)))
    np.testing.assert_allclose(ours, acc._rdp, rtol=1e-6)
    theirs = dp_accounting.rdp.RdpAccountant()
    theirs.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.3)), 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = Accountant("gcn_paper")
        acc.step(spec, 1.3, 300)
        mine = acc.get_epsilon(DELTA)
    assert mine == pytest.approx(theirs.get_epsilon(DELTA), rel=2e-3)  # ours has a wider order grid


def _exact_substitution_rdp(q: float, sigma: float, alpha: float) -> float:
    """RDP of (1−q)N(0,σ²)+qN(1,σ²) vs (1−q)N(0,σ²)+qN(−1,σ²) (one antipodal replacement), by quadrature."""
    def log_mix(x, mu):
        return np.logaddexp(math.log1p(-q) + stats.norm.logpdf(x, 0, sigma) if q < 1 else -np.inf, math.log(q) + stats.norm.logpdf(x, mu, sigma))

    val, _ = integrate.quad(lambda x: math.exp(alpha * log_mix(x, 1.0) + (1 - alpha) * log_mix(x, -1.0)), -30 * sigma, 30 * sigma, limit=400)
    return math.log(val) / (alpha - 1)


@pytest.mark.parametrize("q", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_substitution_bound_is_sound_and_between_its_references(q, sigma):
    orders = np.array([1.5, 2.0, 4.0, 8.0])
    bound = substitution_rdp(q, sigma, orders)
    assert np.all(bound <= 2 * orders / sigma**2 + 1e-12)  # never worse than the unamplified 2C Gaussian
    assert np.all(bound >= poisson_gaussian_rdp(q, sigma, orders) - 1e-12)  # a substitution costs at least a removal
    for a, b in zip(orders, bound):
        assert _exact_substitution_rdp(q, sigma, float(a)) <= b * (1 + 1e-9)


# --- the split ---------------------------------------------------------------------------------------------------
def test_keyed_split_is_data_independent_secret_and_masks_cross_edges():
    mask = torch.ones(500, dtype=torch.bool)
    stream = KeyedStream.seeded(3, "node-batches", warn=False)
    ids = torch.arange(500)
    split = keyed_split(mask, 10, stream, node_ids=ids)
    removed = mask.clone()
    removed[17] = False
    other = keyed_split(removed, 10, stream, node_ids=ids)
    assert other[17] == -1 and torch.equal(torch.cat([split[:17], split[18:]]), torch.cat([other[:17], other[18:]]))
    shorter = keyed_split(mask[:300], 10, stream, node_ids=ids[:300])  # the id → split map does not depend on how many nodes exist
    assert torch.equal(shorter, split[:300])
    counts = torch.bincount(split, minlength=10)
    assert counts.min() > 25 and counts.max() < 80  # ≈ 50 each
    secret = [keyed_split(mask, 10, KeyedStream.secret("node-batches"), node_ids=ids) for _ in range(2)]
    assert not torch.equal(secret[0], secret[1])
    edges = torch.randint(0, 500, (2, 2000))
    kept = split_edges(edges, split)
    assert torch.equal(split[kept[0]], split[kept[1]]) and kept.shape[1] < edges.shape[1]


# --- empirical sensitivity ---------------------------------------------------------------------------------------
class _Given(NodeSource):
    def __init__(self, data: Data) -> None:
        self.data = data

    def load(self) -> Data:
        return self.data


def _without(data: Data, u: int) -> Data:
    out = data.clone()
    out.train_mask = data.train_mask.clone()
    out.train_mask[u] = False
    out.edge_index = data.edge_index[:, (data.edge_index != u).all(0)]
    return out


def _clipped_sum(data: Data, *, full: bool, clip: float, module: DPNodeModule, steps=range(4)) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = NodeSplitDataModule(_Given(data), num_splits=60, sampling_rate=0.6, sampling_seed=5,
                                 mode="paper_faithful" if full else "provable", full_graph_forward=full)
    dm.setup("fit")
    totals = []
    for step in steps:
        grads = module.per_example(dm.next_batch())
        clipped = standard_clip(grads, clip_norm=clip)
        totals.append(torch.cat([t.sum(0).reshape(-1) for t in clipped.values()]))
    return torch.stack(totals)


def _graph_and_module():
    data = SyntheticNodes(160, 3, dim=8, avg_degree=8, seed=1).load()
    data.train_mask = torch.ones(160, dtype=torch.bool)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=8, dropout=0.0), noise_multiplier=0.0, clipping="none")
    return data, module


def test_removing_a_node_moves_each_step_by_at_most_2C_and_more_than_C_can_happen():
    """Provable mode: a node changes one subgraph, so each step's clipped sum moves by ≤ 2C (replace-one), and we find
    nodes that move it by more than C: the add/remove sensitivity C would under-state it."""
    data, module = _graph_and_module()
    clip = 1e-3  # every subgraph clipped: the worst case
    base = _clipped_sum(data, full=False, clip=clip, module=module)
    moved = [float(torch.linalg.vector_norm(base - _clipped_sum(_without(data, u), full=False, clip=clip, module=module), dim=1).max())
             for u in range(0, 160, 8)]
    assert max(moved) <= 2 * clip * (1 + 1e-6)
    assert max(moved) > clip


@pytest.mark.slow
def test_full_graph_forward_of_the_published_code_moves_the_sum_by_more_than_2C():
    """Paper-faithful full-graph forward: a node's edges reach other subgraphs' predictions, so one node moves several
    examples and the step's clipped sum by more than any single-example bound."""
    data, module = _graph_and_module()
    clip = 1e-3
    degree = torch.bincount(data.edge_index[0], minlength=160)
    hubs = torch.argsort(degree, descending=True)[:6].tolist()
    base = _clipped_sum(data, full=True, clip=clip, module=module)
    moved = max(float(torch.linalg.vector_norm(base - _clipped_sum(_without(data, u), full=True, clip=clip, module=module), dim=1).max())
                for u in hubs)
    assert moved > 2 * clip


# --- training --------------------------------------------------------------------------------------------------------
def _fit(module, dm, steps, callbacks=()):
    from pytorch_lightning import Trainer

    trainer = Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0,
                      callbacks=list(callbacks))
    trainer.fit(module, datamodule=dm)
    return trainer


@pytest.mark.slow
def test_dp_gcn_learns_and_reports_the_independently_composed_epsilon():
    from lightning_dprel.callbacks import PrivacyCallback

    dm = NodeSplitDataModule(SyntheticNodes(400, 3, dim=8, seed=2), num_splits=10, sampling_rate=0.5)
    torch.manual_seed(0)
    module = DPNodeModule(GNNClassifier(8, 3, hidden_dim=16, dropout=0.0), noise_multiplier=2.0, lr=0.05)
    cb = PrivacyCallback(target_epsilon=1e6, delta=DELTA)
    trainer = _fit(module, dm, 30, [cb])
    orders = DEFAULT_ORDERS
    want, _ = rdp_to_epsilon(orders, 30 * substitution_rdp(0.5, 2.0, orders), DELTA)  # composed by hand
    bounds = cb.ledger.epsilon_bounds(DELTA)
    assert cb.steps == 30 and bounds["rdp"] == pytest.approx(want, rel=1e-9)
    # the reported ε is the replace-one PLD (dp-accounting's REPLACE_ONE pair, 30-fold), below the RDP bound
    ref = from_gaussian_mechanism(2.0, sampling_prob=0.5, value_discretization_interval=1e-4,
                                  neighboring_relation=NeighboringRelation.REPLACE_ONE).self_compose(30)
    assert cb.epsilon == bounds["pld"] < want and ref.get_epsilon_for_delta(DELTA) <= cb.epsilon <= ref.get_epsilon_for_delta(DELTA) + 2e-3
    acc = trainer.test(module, datamodule=dm, verbose=False)[0]["test_acc"]
    assert acc > 0.55  # 3 classes: chance 0.33


def test_bad_settings_are_refused_and_the_published_pipeline_warns():
    src = SyntheticNodes(40)
    with pytest.raises(ValueError, match="num_splits"):
        NodeSplitDataModule(src, num_splits=0)
    with pytest.raises(ValueError, match="sampling_rate"):
        NodeSplitDataModule(src, sampling_rate=0.0)
    with pytest.raises(ValueError, match="mode"):
        NodeSplitDataModule(src, mode="fast")
    with pytest.raises(ValueError, match="paper_faithful"):
        NodeSplitDataModule(src, full_graph_forward=True)
    with pytest.raises(TypeError, match="NodeSource"):
        NodeSplitDataModule(Data())
    with pytest.raises(ValueError, match="cannot fill"):
        NodeSplitDataModule(src, num_splits=500).setup("fit")
    with pytest.raises(ValueError, match="clipping"):
        DPNodeModule(GNNClassifier(4, 2), clipping="freq")
    with pytest.raises(ValueError, match="conv"):
        GNNClassifier(4, 2, conv="gin")
    with pytest.warns(UserWarning, match="no differential-privacy guarantee"):
        NodeSplitDataModule(src, mode="paper_faithful", full_graph_forward=True)
    with pytest.warns(UserWarning, match="void"):
        NodeSplitDataModule(src, sampling_seed=1)


@pytest.mark.slow
def test_tiny_config_trains_reports_and_exports(tmp_path, capsys):
    """`python -m lightning_dprel fit --config configs/dp_gcn_tiny.yaml`, then the export command."""
    import json

    from lightning_dprel.cli import main
    from lightning_dprel.export import load_exported

    out = tmp_path / "results.json"
    main(["fit", "--config", "configs/dp_gcn_tiny.yaml", "--trainer.default_root_dir", str(tmp_path), "--results_json", str(out)])
    text = capsys.readouterr().out
    assert "Node classification on" in text and "accuracy" in text and "macro-F1" in text and "DP-GCN subgraphs (replace-one)" in text
    res = json.loads(out.read_text())
    assert res["privacy"]["steps"] == 60 and res["privacy"]["epsilon"] <= 4.0 and res["privacy"]["mechanism"] == "subgraph_replace"
    # secret noise: over 452 fits macro-F1 ranged 0.54-1.0 (median 0.89) against the untrained 0.11; the low tail is heavy
    assert res["tuned"]["test_macro_f1"] > res["base"]["test_macro_f1"] + 0.15
    folder = main(["export", "--ckpt_path", str(tmp_path / "model.ckpt"), "--out", str(tmp_path / "export")])
    report = json.loads((folder / "privacy.json").read_text())
    assert report["delta"] == 1e-5 and report["epsilon"] == pytest.approx(res["privacy"]["epsilon"], rel=1e-9)
    assert "node-level" in report["privacy_unit"]
    bounds = report["epsilon_bounds"]  # privacy.json names the bound that gave ε and shows both
    assert bounds["bound"] == "pld" and bounds["pld"] == report["epsilon"] < bounds["rdp"]
    module = load_exported(folder)
    assert type(module).__name__ == "DPNodeModule" and module.privacy_ledger.steps == 60
