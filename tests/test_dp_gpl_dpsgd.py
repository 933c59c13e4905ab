"""DP-SGD prompt tuning, DP-GPL's baseline (Abadi et al. 2016, Alg. 1): per-node examples on G[V_pub ∪ {v}]."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import subgraph

from lightning_dprel.accounting import noise_multiplier_for
from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.mechanisms import check_module_mechanism, check_unit, get_mechanism, per_step_rdp
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.specs import PRIVACY_UNITS, SamplingSpec
from lightning_dprel.methods.dp_gpl.accounting import LABELLED_NODE
from lightning_dprel.datamodules.datasets.nodes import NodeSource, SyntheticNodes
from lightning_dprel.grad_sample.base import trainable_parameters
from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule
from lightning_dprel.methods.dp_gpl.dpsgd import DPPromptTuning, PrivateNodeExamples, dpsgd_baseline_accuracy
from lightning_dprel.methods.dp_gpl.pretrain import GraphEncoder, pretrain

pytestmark = pytest.mark.filterwarnings("ignore:.*(seed|does not have many workers|no `node_id`).*:UserWarning")
DELTA = 1e-5


def _dm(n=120, *, view="public", noise=1.0, seed=1, source=None) -> PromptDataModule:
    src = source if source is not None else SyntheticNodes(n, 3, dim=6, feature_noise=noise, seed=seed)
    dm = PromptDataModule(src, num_teachers=4, num_queries=5, view=view, partition_seed=0, hops=2, fanout=4)
    dm.setup()
    return dm


def _encoder(dim=6, hidden=8, conv="gcn", dtype=torch.float64) -> GraphEncoder:
    torch.manual_seed(0)
    return pretrain(GraphEncoder(dim, hidden, num_layers=2, conv=conv).to(dtype), torch.empty(0, dim), torch.empty(2, 0, dtype=torch.long),
                    method="none")


def _module(dm, enc, **kw) -> DPPromptTuning:
    module = DPPromptTuning(enc, **kw)
    module.build(dm)
    return module


# --- per-example gradients: B stacked copies, one pass = one autograd call per example ------------------------------
@pytest.mark.parametrize("conv", ["gcn", "gat"])
@pytest.mark.parametrize("prompt", ["gpf", "gpf_plus"])
def test_stacked_copies_give_each_examples_own_gradient(prompt, conv):
    dm = _dm()
    module = _module(dm, _encoder(conv=conv), prompt=prompt, num_basis=3)
    with torch.no_grad():  # move off the initialisation (GPF's prompt starts at 0)
        for p in trainable_parameters(module.model).values():
            p.add_(0.3 * torch.randn_like(p))
    examples, labels, _ = dm.teacher_examples()
    idx = torch.arange(12)
    ex, y, x = examples.select(idx), labels[idx], dm.data.x.double()
    got = module.per_example(x, ex, y)
    shared = trainable_parameters(module.model)
    assert set(got) == set(shared) and all(got[n].shape == (12, *p.shape) for n, p in shared.items())
    for b in range(12):
        loss = F.cross_entropy(module.model(x, ex.select([b])), y[b:b + 1])
        want = torch.autograd.grad(loss, list(shared.values()))
        for (name, _), w in zip(shared.items(), want):
            torch.testing.assert_close(got[name][b], w, rtol=1e-6, atol=1e-12)
    assert all(p.grad is None for p in shared.values())  # the shared parameters are untouched by the per-example pass


# --- node removal through the real private step (σ = 0: the released sum before noise) -------------------------------
class _Without(NodeSource):
    """The same graph without node ``v`` (its features, label and edges); every other node keeps its stable id."""

    def __init__(self, src: NodeSource, v: int) -> None:
        self.src, self.v = src, int(v)

    def load(self):
        data = self.src.load()
        keep = torch.arange(data.num_nodes) != self.v
        ei, _ = subgraph(keep, data.edge_index, relabel_nodes=True, num_nodes=data.num_nodes)
        out = data.subgraph(keep)
        out.edge_index, out.num_classes = ei, data.num_classes
        return out

    def __repr__(self) -> str:
        return f"{self.src!r} without {self.v}"


def _clipped_sum(module, x, examples, labels) -> torch.Tensor:
    """Σ_i clip_C(g_i) as the DP optimizer forms it (σ = 0, b = 1): the released sum before noise."""
    dp = module.build_dp_optimizer(trainable_parameters(module.model))
    dp.record(module.per_example(x, examples, labels), max_freq=None, expected_batch_size=1.0)
    dp.pre_step()
    return torch.cat([p.grad.reshape(-1) for p in dp.named_params.values()])


def _released_sum(module, dm) -> torch.Tensor:
    """The clipped sum of one real step at γ = 1 (every labelled node sampled)."""
    data = PrivateNodeExamples(dm, expected_batch_size=float(int(dm.private.sum())), sample_seed=0)
    batch = data.next_batch()
    assert batch.examples.size == data.num_examples  # γ = 1 keeps every example
    return _clipped_sum(module, dm.data.x.double(), batch.examples, batch.labels)


@pytest.mark.parametrize("clip", [1e-3, 1e3])  # every gradient clipped / none clipped
def test_removing_one_labelled_node_moves_the_clipped_sum_by_at_most_c(clip):
    src = SyntheticNodes(120, 3, dim=6, seed=1)
    dm = _dm(source=src)
    module = _module(dm, _encoder(), prompt="gpf_plus", num_basis=3, clip_norm=clip, noise_multiplier=0.0)
    base = _released_sum(module, dm)
    private = dm.private.nonzero().view(-1)
    deg = torch.bincount(dm.data.edge_index[0], minlength=dm.data.num_nodes)[private]
    candidates = set(private[torch.argsort(deg, descending=True)[:3]].tolist()) | set(private[:3].tolist())
    for v in sorted(candidates):
        dm_v = _dm(source=_Without(src, v))
        assert int(dm_v.private.sum()) == private.numel() - 1  # no other node changed side
        moved = float(torch.linalg.vector_norm(base - _released_sum(module, dm_v)))
        g_v = module.per_example(dm.data.x.double(), *(dm.public_nets.batch(torch.tensor([v])), dm.data.y[[v]]))
        norm_v = float(torch.sqrt(sum(g.pow(2).sum() for g in g_v.values())))
        assert moved <= clip * (1 + 1e-9)
        assert moved == pytest.approx(min(norm_v, clip), rel=1e-6)  # exactly v's own clipped gradient, nothing else


def test_the_full_view_is_refused_since_one_node_enters_many_examples():
    """Contrast: on the whole graph G (the paper's view) removing a hub moves the clipped sum by several C."""
    src, clip = SyntheticNodes(120, 3, dim=6, seed=1), 1e-3
    dm = _dm(view="full", source=src)
    with pytest.raises(ValueError, match="view='public'"):
        PrivateNodeExamples(dm)
    module = _module(dm, _encoder(), prompt="gpf_plus", num_basis=3, clip_norm=clip, noise_multiplier=0.0)
    base = _clipped_sum(module, dm.data.x.double(), *dm.teacher_examples()[:2])
    private = dm.private.nonzero().view(-1)
    hubs = private[torch.argsort(torch.bincount(dm.data.edge_index[0], minlength=120)[private], descending=True)[:4]]
    moved = max(float(torch.linalg.vector_norm(base - _clipped_sum(module, dm_v.data.x.double(), *dm_v.teacher_examples()[:2])))
                for dm_v in (_dm(view="full", source=_Without(src, int(v))) for v in hubs))
    assert moved > 1.5 * clip  # measured 1.75·C (fanout 4): one node reaches several examples


# --- accounting ------------------------------------------------------------------------------------------------------
def test_the_mechanism_is_poisson_gaussian_for_labelled_nodes_only():
    data = PrivateNodeExamples(_dm(), expected_batch_size=10.0)
    spec = data.sampling_spec
    m = data.num_examples
    assert (spec.num_nodes, spec.num_edges, spec.max_degree, spec.neg_per_pos, spec.num_units) == (m, m, 1, 0, m)
    assert spec.sampling_rate == pytest.approx(10.0 / m) and spec.expected_batch_size == pytest.approx(10.0)
    assert spec.unit is LABELLED_NODE
    for sigma in (0.7, 1.3, 8.0):
        np.testing.assert_allclose(per_step_rdp("labelled_node_gaussian", spec, sigma),
                                   per_step_rdp("poisson_gaussian", spec, sigma), rtol=1e-12)
    mech = get_mechanism("labelled_node_gaussian")
    assert mech.unit is LABELLED_NODE and mech.clipping == ("standard",) and "one clipped per-example" in mech.description
    check_unit("labelled_node_gaussian", "labelled_node")
    for other in sorted(set(PRIVACY_UNITS) - {"labelled_node"}):
        with pytest.raises(ValueError, match="Privacy unit mismatch"):
            check_unit("labelled_node_gaussian", other)
    with pytest.raises(ValueError, match="does not bound clipping='freq'"):
        check_module_mechanism("labelled_node_gaussian", "freq")
    ledger = PrivacyLedger()
    ledger.open(SamplingSpec(num_nodes=10, num_edges=10, max_degree=1, sampling_rate=0.5, neg_per_pos=0,
                             expected_batch_size=5.0, steps_per_epoch=2, privacy_unit="node_in_subgraph"))
    with pytest.raises(ValueError, match="proven for the unit 'labelled_node'"):
        ledger.check_mechanism("labelled_node_gaussian", "standard")


def test_the_mechanism_matches_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    spec = PrivateNodeExamples(_dm(), expected_batch_size=12.0).sampling_spec
    orders = np.array([2.0, 3.0, 8.0, 32.0])
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.PoissonSampledDpEvent(spec.sampling_rate, dp_accounting.GaussianDpEvent(1.3)))
    np.testing.assert_allclose(per_step_rdp("labelled_node_gaussian", spec, 1.3, orders=orders), acc._rdp, rtol=1e-6)


# --- training --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_calibrated_fit_stays_within_epsilon_and_learns():
    dm = _dm(300, noise=0.7, seed=2)
    enc = _encoder(hidden=16, dtype=torch.float32)
    out = dpsgd_baseline_accuracy(dm, enc, target_epsilon=4.0, delta=DELTA, steps=30, expected_batch_size=24.0, lr=0.05,
                                  clip_norm=1.0, seed=0)
    assert out["steps"] == 30 and out["epsilon"] <= 4.0
    spec = PrivateNodeExamples(dm, expected_batch_size=24.0).sampling_spec
    assert spec.sampling_rate == pytest.approx(24.0 / int(dm.private.sum()))
    want = rdp_to_epsilon(DEFAULT_ORDERS, 30 * per_step_rdp("poisson_gaussian", spec, out["sigma"]), DELTA)[0]
    assert out["epsilon"] < want and out["epsilon"] > 3.5  # the PLD bound, below the RDP bound composed by hand
    dp_accounting = pytest.importorskip("dp_accounting")
    tight = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    tight.compose(dp_accounting.PoissonSampledDpEvent(spec.sampling_rate, dp_accounting.GaussianDpEvent(out["sigma"])), 30)
    assert tight.get_epsilon(DELTA) - 1e-6 <= out["epsilon"] <= tight.get_epsilon(DELTA) + 5e-3
    calibrated = noise_multiplier_for(4.0, delta=DELTA, steps=30, sampling=spec, mechanism="labelled_node_gaussian")
    assert out["sigma"] == pytest.approx(float(calibrated), rel=1e-6)
    assert out["test_acc"] > 0.6  # 3 classes: chance ≈ 0.33


def test_the_module_pretrains_on_the_public_graph_and_steps_the_shared_prompt():
    from pytorch_lightning import Trainer

    dm = _dm(200, noise=0.7, seed=3)
    data = PrivateNodeExamples(dm, expected_batch_size=16.0, sample_seed=1)
    module = DPPromptTuning(None, prompt="gpf", hidden_dim=8, pretrain_epochs=3, lr=0.05, noise_seed=2)
    cb = PrivacyCallback(target_epsilon=2.0, delta=DELTA, calibrate=True)
    trainer = Trainer(max_steps=6, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0, callbacks=[cb])
    trainer.fit(module, datamodule=data)
    assert module.encoder.in_dim == 6 and not any(p.requires_grad for p in module.encoder.parameters())
    assert module.model.prompt.p.shape == (1, 6) and float(module.model.prompt.p.detach().abs().sum()) > 0  # GPF starts at 0
    assert cb.steps == 6 and cb.epsilon <= 2.0 and module.noise_spec.noise_multiplier == pytest.approx(cb.noise_multiplier)
    assert module.privacy_ledger.unit == "labelled_node"
    sizes = [data.sampled(t).numel() for t in range(300)]  # Poisson(γ): mean b, fresh per step
    assert abs(np.mean(sizes) - 16.0) < 4 * math.sqrt(16.0 / 300) and len(set(sizes)) > 3


def test_bad_inputs_are_refused():
    dm = _dm()
    with pytest.raises(TypeError, match="PromptDataModule"):
        PrivateNodeExamples(SyntheticNodes(40))
    for b in (0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="expected_batch_size"):
            PrivateNodeExamples(dm, expected_batch_size=b)
    with pytest.raises(ValueError, match="exceeds"):
        PrivateNodeExamples(dm, expected_batch_size=1e4).setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="void"):
            PrivateNodeExamples(dm, sample_seed=3)
    with pytest.raises(ValueError, match="prompt"):
        DPPromptTuning(_encoder(), prompt="all_in_one")
    with pytest.raises(ValueError, match="clipping"):
        DPPromptTuning(_encoder(), clipping="freq")
    with pytest.raises(TypeError, match="encoder"):
        DPPromptTuning(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="features"):
        DPPromptTuning(_encoder(dim=5)).build(dm)
    with pytest.raises(ValueError, match="clip_norm"):
        DPPromptTuning(_encoder(), clip_norm=0.0)
