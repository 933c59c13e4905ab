"""AdvSGM's guarantee holds for the degree-capped graph taken as the dataset: with `capping="drop"`, removing one node
from the raw graph also changes other nodes' capped edges, and docs/advsgm.md says so where a user of the method reads."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_dprel.datamodules.datasets.synthetic import BlockModelGraph
from lightning_dprel.datamodules.edge_tuples.sampling import cap_degree

DOC = Path(__file__).resolve().parents[1] / "docs" / "advsgm.md"


def _capped(edges: torch.Tensor, n: int, K: int) -> set[tuple[int, int]]:
    kept = cap_degree(edges, n, K, policy="drop", generator=torch.Generator().manual_seed(0))  # same salt both times
    return {tuple(sorted(e)) for e in kept.t().tolist()}


def test_removing_a_node_changes_other_nodes_capped_edges_on_a_block_model():
    data = BlockModelGraph(num_nodes=300, num_blocks=3, mean_degree=12.0, seed=1).load().train
    n, K, edges = data.num_nodes, 4, data.edge_index
    full = _capped(edges, n, K)
    cascades = 0
    for w in range(0, n, 10):  # 30 removals
        rest = edges[:, (edges[0] != w) & (edges[1] != w)]
        others = {e for e in full if w not in e}
        cascades += _capped(rest, n, K) != others  # an edge among the remaining nodes appeared
    assert cascades >= 15, cascades  # most removals change capped edges that are not the removed node's


def test_the_method_page_states_it_near_the_top():
    head = "\n".join(DOC.read_text().splitlines()[:25])
    assert "degree-capped graph taken as the dataset" in head and "13.7" in head and "5.9" in head
