"""WordNet 3.0 nouns (Debian ``wordnet-base``: ``/usr/share/wordnet/data.noun``) as text-attributed graphs.

Nodes are noun synsets with text ``"<lemmas>: <gloss>"``; edges are hypernym (``@``, ``@i``) and
member-holonym (``#m``) pointers. A *sub-domain* is a lexicographer file (``noun.animal``, ``noun.plant``,
…). The file is parsed directly (format: WordNet's ``wndb(5WN)``); nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Data

from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource, check_max_nodes, hashed_subset, simple_undirected_edges

__all__ = ["NOUN_LEXNAMES", "DEFAULT_WORDNET_DIR", "parse_wordnet_nouns", "load_wordnet_domain", "WordNetDomains", "WordNetLarge",
           "WordNetNounGraph", "WORDNET_NOUNS"]

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"
#: Lexicographer file numbers of the noun files (WordNet 3.0 ``lexnames(5WN)``).
NOUN_LEXNAMES = {
    3: "noun.Tops", 4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute", 8: "noun.body",
    9: "noun.cognition", 10: "noun.communication", 11: "noun.event", 12: "noun.feeling", 13: "noun.food",
    14: "noun.group", 15: "noun.location", 16: "noun.motive", 17: "noun.object", 18: "noun.person",
    19: "noun.phenomenon", 20: "noun.plant", 21: "noun.possession", 22: "noun.process", 23: "noun.quantity",
    24: "noun.relation", 25: "noun.shape", 26: "noun.state", 27: "noun.substance", 28: "noun.time",
}
_EDGE_POINTERS = ("@", "@i", "#m")
#: Noun synsets in WordNet 3.0 (a public constant): a ``max_nodes`` subset keeps each synset with probability max_nodes / this.
WORDNET_NOUNS = 82_115


def _data_noun(wordnet_dir: str | Path) -> Path:
    path = Path(wordnet_dir) / "data.noun"
    if not path.is_file():
        raise FileNotFoundError(
            f"WordNet noun file not found: {str(path)!r}. Install Debian's `wordnet-base` "
            "(`apt-get install wordnet-base`) or pass `wordnet_dir=` to a folder holding WordNet 3.0's data.noun."
        )
    return path


def parse_wordnet_nouns(wordnet_dir: str | Path = DEFAULT_WORDNET_DIR) -> dict[str, tuple[str, str, list[str]]]:
    """``{offset: (lexname, text, [pointer target offsets of @, @i, #m])}`` for every noun synset."""
    synsets: dict[str, tuple[str, str, list[str]]] = {}
    with _data_noun(wordnet_dir).open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith("  "):  # licence header
                continue
            head, _, gloss = line.partition(" | ")
            f = head.split()
            try:
                offset, lexnum, w_cnt = f[0], int(f[1]), int(f[3], 16)
                words = [f[4 + 2 * i].replace("_", " ") for i in range(w_cnt)]
                p = 4 + 2 * w_cnt
                p_cnt = int(f[p])
                ptrs = [f[p + 1 + 4 * i : p + 5 + 4 * i] for i in range(p_cnt)]
            except (IndexError, ValueError) as err:
                raise ValueError(f"Malformed WordNet data.noun line {lineno}: {line[:80]!r}") from err
            targets = [t[1] for t in ptrs if t[0] in _EDGE_POINTERS and t[2] == "n"]
            text = f"{', '.join(words)}: {gloss.strip()}" if gloss.strip() else ", ".join(words)
            synsets[offset] = (NOUN_LEXNAMES.get(lexnum, f"lex{lexnum:02d}"), text, targets)
    if not synsets:
        raise ValueError(f"No synsets found in {str(_data_noun(wordnet_dir))!r}.")
    return synsets


def _distinct_domains(first: tuple[str, str], second: tuple[str, str]) -> tuple[str, str]:
    """Two (argument name, lexicographer file) pairs checked; refused when both name the same file."""
    a, b = _check_domain(first[1]), _check_domain(second[1])
    if a == b:
        raise ValueError(f"`{first[0]}` and `{second[0]}` are the same sub-domain ({a!r}).")
    return a, b


def _check_domain(domain: str) -> str:
    names = sorted(NOUN_LEXNAMES.values())
    if domain not in names:
        alt = f"noun.{domain}"
        if alt in names:
            return alt
        raise ValueError(f"Unknown WordNet sub-domain {domain!r}. Available: {', '.join(names)}.")
    return domain


def _domain_data(synsets: dict[str, tuple[str, str, list[str]]], domain: str | frozenset[str]) -> Data:
    """The synsets of one lexicographer file (a str) or of several (a frozenset) and the relations among them."""
    lexnames = frozenset([domain]) if isinstance(domain, str) else domain
    nodes = sorted(o for o, (lex, _, _) in synsets.items() if lex in lexnames)
    if not nodes:
        raise ValueError(f"WordNet sub-domain {domain!r} has no synsets in this data.noun.")
    index = {o: i for i, o in enumerate(nodes)}
    edges = [(index[o], index[t]) for o in nodes for t in synsets[o][2] if t in index]
    if not edges:
        raise ValueError(f"WordNet sub-domain {domain!r} has no hypernym/member-holonym relations inside it.")
    return Data(
        edge_index=torch.tensor(edges, dtype=torch.long).t().contiguous(),
        text=[synsets[o][1] for o in nodes],
        node_names=nodes,
        num_nodes=len(nodes),
    )


def load_wordnet_domain(domain: str, *, wordnet_dir: str | Path = DEFAULT_WORDNET_DIR) -> Data:
    """One lexicographer file of WordNet nouns as a PyG ``Data`` (``text``, ``edge_index``, ``node_names``)."""
    domain = _check_domain(domain)
    return _domain_data(parse_wordnet_nouns(wordnet_dir), domain)


class WordNetDomains(GraphSource):
    """Zero-shot WordNet transfer, e.g. ``noun.animal`` → ``noun.plant``.

    Args:
        train_domain: lexicographer file for fine-tuning (default: ``"noun.animal"``).
        test_domain: held-out lexicographer file (default: ``"noun.plant"``).
        wordnet_dir: folder with WordNet 3.0's ``data.noun`` (default: Debian's ``/usr/share/wordnet``).
    """

    repr_fields = ("train_domain", "test_domain")

    def __init__(
        self, train_domain: str = "noun.animal", test_domain: str = "noun.plant", wordnet_dir: str = DEFAULT_WORDNET_DIR
    ) -> None:
        self.train_domain, self.test_domain, self.wordnet_dir = train_domain, test_domain, wordnet_dir

    def load(self) -> GraphPair:
        train_domain, test_domain = _distinct_domains(("train_domain", self.train_domain), ("test_domain", self.test_domain))
        synsets = parse_wordnet_nouns(self.wordnet_dir)
        return GraphPair(
            train=_domain_data(synsets, train_domain),
            test=_domain_data(synsets, test_domain),
            name=f"WordNet {train_domain} -> {test_domain}",
        )


class WordNetLarge(GraphSource):
    """Large zero-shot WordNet transfer: train on every noun lexicographer file but two, validate on one, test on the other.

    The training graph holds every noun synset outside ``val_domain`` and ``test_domain`` (≈ 66.6k synsets and
    ≈ 70k relations for the defaults) with the relations among them; the validation graph (public, used only to
    choose checkpoints and hyper-parameters) is ``val_domain``; the test graph is ``test_domain``. Lexicographer
    files partition the synsets, so no validation or test entity is a training entity.

    Args:
        test_domain: held-out lexicographer file (default: ``"noun.plant"``).
        val_domain: validation lexicographer file (default: ``"noun.animal"``, the other taxonomy of organisms).
        wordnet_dir: folder with WordNet 3.0's ``data.noun``.
    """

    repr_fields = ("test_domain", "val_domain")

    def __init__(self, test_domain: str = "noun.plant", val_domain: str = "noun.animal", wordnet_dir: str = DEFAULT_WORDNET_DIR) -> None:
        self.test_domain, self.val_domain, self.wordnet_dir = test_domain, val_domain, wordnet_dir

    def load(self) -> GraphPair:
        val, test = _distinct_domains(("val_domain", self.val_domain), ("test_domain", self.test_domain))
        synsets = parse_wordnet_nouns(self.wordnet_dir)
        rest = frozenset(lex for lex, _, _ in synsets.values()) - {test, val}
        return GraphPair(
            train=_domain_data(synsets, rest),
            test=_domain_data(synsets, test),
            val=_domain_data(synsets, val),
            name=f"WordNet nouns but {test}, {val} -> {test} (validation {val})",
        )


class WordNetNounGraph(GraphSource):
    """WordNet 3.0 nouns as one graph for skip-gram node embeddings (AdvSGM Section VI's link prediction and clustering).

    Nodes: noun synsets (82,115 in WordNet 3.0). Edges: the hypernym (``@``), instance-hypernym (``@i``) and
    member-holonym (``#m``) pointers of :func:`parse_wordnet_nouns` between kept synsets, each undirected relation once
    (u < v; 96,720 pointers in the full file). Labels ``y``: the lexicographer file, an index into the 26 noun files in
    order (``class_names``: ``noun.Tops`` = 0, ``noun.act`` = 1, …, ``noun.time`` = 25), for clustering. ``node_id``: the
    synset offset (stable, public); ``node_names``: the offsets as strings. No features (``x`` is None), no text.

    Args:
        max_nodes: keep each synset iff a seeded public hash of its offset falls below max_nodes / 82,115 (about this
            many synsets, each kept or not by its own offset, as :class:`~.nodes.WordNetNodes`); the graph is the one
            induced on them (sparser than the whole). None: all synsets.
        seed: the hash of the subset.
        wordnet_dir: folder with WordNet 3.0's ``data.noun`` (default: Debian's ``/usr/share/wordnet``).
    """

    repr_fields = ("max_nodes", "seed")

    def __init__(self, max_nodes: int | None = None, seed: int = 0, wordnet_dir: str = DEFAULT_WORDNET_DIR) -> None:
        self.max_nodes, self.seed, self.wordnet_dir = check_max_nodes(max_nodes), int(seed), wordnet_dir

    def load(self) -> GraphPair:
        synsets = parse_wordnet_nouns(self.wordnet_dir)
        class_names = [NOUN_LEXNAMES[k] for k in sorted(NOUN_LEXNAMES)]
        unknown = sorted({lex for lex, _, _ in synsets.values()} - set(class_names))
        if unknown:
            raise ValueError(f"data.noun holds synsets outside the 26 noun lexicographer files: {unknown}; is it WordNet 3.0?")
        offsets = sorted(synsets)  # the row order only: the subset is decided by each offset alone
        keep = hashed_subset(torch.tensor([int(o) for o in offsets]), self.max_nodes, WORDNET_NOUNS, self.seed)
        offsets = [o for o, k in zip(offsets, keep.tolist()) if k]
        index = {o: i for i, o in enumerate(offsets)}
        edge_index = simple_undirected_edges([(index[o], index[t]) for o in offsets for t in synsets[o][2] if t in index], len(offsets))
        if edge_index.shape[1] == 0:
            raise ValueError(f"The {len(offsets)} synsets kept by max_nodes={self.max_nodes} share no relation; raise `max_nodes`.")
        label = {name: i for i, name in enumerate(class_names)}
        data = Data(
            edge_index=edge_index,
            num_nodes=len(offsets),
            y=torch.tensor([label[synsets[o][0]] for o in offsets], dtype=torch.long),
            node_id=torch.tensor([int(o) for o in offsets], dtype=torch.long),
            node_names=offsets,
            class_names=class_names,
        )
        return GraphPair(train=data, name=f"WordNet 3.0 nouns ({len(offsets)} synsets)")
