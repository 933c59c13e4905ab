"""Tiny, seeded, offline fixtures for tests, docs and quick runs (like Lightning's ``demos``); the library never imports it.

The graph generators and the pretrained-model resolver are library code (:mod:`lightning_dprel.datamodules.datasets.
generators`, :mod:`lightning_dprel.pretrained`), re-exported here for tests and examples; :mod:`.boring_classes` holds a
quiet trainer and tiny private modules and datamodules, :mod:`.specs` tiny sampling specs, :mod:`.tuple_batches` batches
built straight from tensors.
"""

from __future__ import annotations

from lightning_dprel.datamodules.datasets.generators import random_feature_graph, random_text_graph
from lightning_dprel.pretrained import WORDS, resolve_pretrained, save_tiny_bert

__all__ = ["WORDS", "random_text_graph", "random_feature_graph", "save_tiny_bert", "resolve_pretrained", "wordnet_noun_line", "obo_file", "node_removed"]


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


def node_removed(data, v: int):
    """The node-level neighbour of a labelled graph: node ``v`` and its edges removed, every other node's ``node_id``,
    masks and features kept (and ``num_classes``, when the graph states it)."""
    import torch
    from torch_geometric.data import Data

    keep = torch.ones(data.num_nodes, dtype=torch.bool)
    keep[v] = False
    new = torch.full((data.num_nodes,), -1, dtype=torch.long)
    new[keep] = torch.arange(int(keep.sum()))
    ei = data.edge_index[:, keep[data.edge_index[0]] & keep[data.edge_index[1]]]
    extra = {"num_classes": data.num_classes} if "num_classes" in data else {}
    return Data(x=data.x[keep], y=data.y[keep], edge_index=new[ei], train_mask=data.train_mask[keep],
                val_mask=data.val_mask[keep], test_mask=data.test_mask[keep], node_id=data.node_id[keep], **extra)
