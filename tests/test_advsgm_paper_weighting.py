"""The paper-faithful AdvSGM update weighted as the authors' code: one iteration pinned against a hand-computed update
(the negative update is the mean over its own B·k pairs), and the code's two options (non-edge injection, edge-labelled
negatives), which read E and so exist in paper mode only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.methods.advsgm import AdvSGMPaperDataModule, DPSkipGramModule
from lightning_dprel.methods.advsgm.losses import constrained_sigmoid

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N, R, B, K, LR = 30, 4, 12, 3, 0.5


def _graph(seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 200), generator=g)
    return Data(edge_index=ei[:, ei[0] != ei[1]], num_nodes=N)


def _one_iteration(labelled: bool) -> tuple[DPSkipGramModule, AdvSGMPaperDataModule, list[torch.Tensor], torch.Tensor]:
    dm = AdvSGMPaperDataModule(_graph(), batch_size=B, neg_per_pos=K, sampling_seed=2, steps_per_epoch=5)
    module = DPSkipGramModule(mode="paper", num_nodes=N, dim=R, optimizer="sgd", lr=LR, paper_sigma=0.0, paper_rounds=100,
                              edge_labelled_negatives=labelled)
    tables = [module.node_vectors.double().clone(), module.context_vectors.double().clone()]
    fakes = F.normalize(module.generator.theta.detach().double(), dim=-1)
    quiet_trainer(max_steps=2).fit(module, dm)  # one iteration: a positive and a negative update
    return module, dm, tables, fakes


def _by_hand(tables: list[torch.Tensor], fakes: torch.Tensor, pos, neg, label, negatives: str = "mean") -> list[torch.Tensor]:
    """The code's two updates with plain autograd: mean over the B positives, then mean over the B·k negatives
    (``negatives="sum"``: each tuple's k negatives summed, ÷ B, so they weigh k times the positives)."""
    v, c = (t.clone().requires_grad_(True) for t in tables)
    u, w = pos[:, 0], pos[:, 1]
    positive = -torch.log(constrained_sigmoid((v[u] * c[w]).sum(-1)))
    positive = positive - torch.log1p(-constrained_sigmoid((v[u] * fakes[w]).sum(-1)))  # L_adv1 (λ = 1, ξ = 0)
    positive = positive - torch.log1p(-constrained_sigmoid((fakes[u] * c[w]).sum(-1)))  # L_adv2
    gv, gc = torch.autograd.grad(positive.mean(), (v, c))
    with torch.no_grad():
        v -= LR * gv
        c -= LR * gc
    negative = -torch.log(constrained_sigmoid(label * (v[u][:, None, :] * c[neg]).sum(-1)))  # [B, k]
    gv, gc = torch.autograd.grad(negative.mean() if negatives == "mean" else negative.sum(-1).mean(), (v, c))
    with torch.no_grad():
        return [v - LR * gv, c - LR * gc]


@pytest.mark.parametrize("labelled", [False, True])
def test_one_paper_iteration_equals_the_codes_update_computed_by_hand(labelled):
    module, dm, tables, fakes = _one_iteration(labelled)
    pos, neg, _ = dm.stream.draw_global(0)
    keys = set((torch.minimum(*dm.train_edges) * N + torch.maximum(*dm.train_edges)).tolist())
    is_edge = torch.tensor([[min(a, z) * N + max(a, z) in keys for z in row] for a, row in zip(pos[:, 0].tolist(), neg.tolist())])
    label = torch.where(is_edge, 1.0, -1.0).double() if labelled else -torch.ones(B, K, dtype=torch.float64)
    assert not labelled or bool(is_edge.any())  # this dense graph puts some negatives on edges
    expected = _by_hand(tables, fakes, pos, neg, label)
    got = [module.node_vectors.double(), module.context_vectors.double()]
    for e, g, t in zip(expected, got, tables):
        assert (e - t).abs().max() > 1e-3  # the update is not negligible
        torch.testing.assert_close(g, e, rtol=0, atol=2e-5)
    summed = _by_hand(tables, fakes, pos, neg, label, negatives="sum")  # the weighting this mode had before
    assert (summed[1] - got[1]).abs().max() > 1e-3


def test_the_codes_non_edge_injection_adds_as_many_public_non_edges_as_training_edges():
    plain = AdvSGMPaperDataModule(_graph(), batch_size=B, neg_per_pos=K, sampling_seed=2)
    injected = AdvSGMPaperDataModule(_graph(), batch_size=B, neg_per_pos=K, sampling_seed=2, inject_non_edges=True)
    plain.setup("fit")
    injected.setup("fit")
    m = plain.train_edges.shape[1]
    assert injected.train_edges.shape[1] == 2 * m and torch.equal(injected.train_edges[:, :m], plain.train_edges)
    key = lambda e: set((torch.minimum(*e) * N + torch.maximum(*e)).tolist())  # noqa: E731
    added = key(injected.train_edges[:, m:])
    assert len(added) == m and not added & key(_graph().edge_index)  # distinct, and never an edge of the graph
    assert injected.sampling_spec.num_edges == 2 * m and injected.sampling_spec.sampling_rate == pytest.approx(B / (2 * m))
    assert injected.stream.edges.shape[1] == 2 * m  # the batches draw from them
    again = AdvSGMPaperDataModule(_graph(), batch_size=B, neg_per_pos=K, sampling_seed=2, inject_non_edges=True)
    again.setup("fit")
    assert torch.equal(again.train_edges, injected.train_edges)  # public: seeded by `seed`


def test_edge_labelled_negatives_are_refused_outside_paper_mode():
    with pytest.raises(ValueError, match="paper mode only"):
        DPSkipGramModule(num_nodes=N, dim=R, edge_labelled_negatives=True)
