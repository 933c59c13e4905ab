"""Graph preparation (public, once per run): input checks, simple relations, held-out split, capping (Algorithm 3,
line 1), node inputs and evaluation queries. Pure functions of the graphs and the PUBLIC ``seed``.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 (line 1) and Section 5.2. Daigavane et al. 2021 (arXiv 2111.15521), Algorithm 1.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset

from lightning_dprel.core.checks import check_int  # noqa: F401 - re-exported for the datamodules
from lightning_dprel.datamodules.datasets.base import GraphSource
from lightning_dprel.datamodules.edge_tuples.evaluation import EvalSet, eval_queries
from lightning_dprel.datamodules.edge_tuples.sampling import cap_degree, edge_priority, to_simple_undirected
from lightning_dprel.encoders import check_node_features
from lightning_dprel.progress import ProgressLog
from lightning_dprel.transforms import check_node_texts

__all__ = [
    "PreparedGraphs",
    "prepare",
    "derive_seed",
    "public_generator",
    "held_out_mask",
    "check_int",
    "as_graph",
    "count_nodes",
    "oriented_relations",
    "node_inputs",
    "check_node_texts",
    "check_finite_features",
    "report_capping",
    "CappingReport",
    "report_cleaning",
    "FAR_ABOVE_FACTOR",
]

#: Warn when the degree cap K is more than this many times the largest degree of the training relations.
FAR_ABOVE_FACTOR = 4


def derive_seed(seed: int, *tags: Any) -> int:
    """A 32-bit seed for one named stream (torch's CPU generator keeps only the low 32 bits of a seed)."""
    digest = hashlib.blake2b(repr((int(seed),) + tags).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0xFFFFFFFF


def public_generator(seed: int, *tags: Any) -> torch.Generator:
    """A torch generator for PUBLIC preprocessing only (split and capping salts, evaluation queries)."""
    return torch.Generator().manual_seed(derive_seed(seed, *tags))


def held_out_mask(edges: Tensor, fraction: float, salt: int) -> Tensor:
    """Held-out (test) membership per edge: ``edge_priority(canonical edge, salt) < fraction·2^63``.

    Each edge's membership depends only on its own endpoints and the salt, never on the other edges or
    on its position, so removing a node changes the membership of its own edges only. The number of
    held-out edges is Binomial(E, fraction).
    """
    canonical = torch.stack([torch.minimum(edges[0], edges[1]), torch.maximum(edges[0], edges[1])])
    return edge_priority(canonical, salt) < int(fraction * 2**63)


def as_graph(obj: Any, name: str) -> tuple[Data, Data | None, Data | None]:
    """(graph, test graph, validation graph from the same source or None) from a Data, a PyG dataset or a GraphSource."""
    if isinstance(obj, GraphSource):
        pair = obj.load()
        return pair.train, pair.test, getattr(pair, "val", None)
    if isinstance(obj, PyGDataset):
        if len(obj) == 0:
            raise ValueError(f"`{name}` is an empty PyG dataset ({type(obj).__name__}); it holds no graph.")
        return obj[0], None, None
    if isinstance(obj, Data):
        return obj, None, None
    raise TypeError(
        f"`{name}` must be a GraphSource, a torch_geometric Data or a torch_geometric Dataset, "
        f"got {type(obj).__name__}."
    )


def count_nodes(data: Data, name: str, *, stated: bool = False) -> int:
    """n of a graph: ``data.num_nodes``, else the number of texts; at least 1. ``stated``: refuse an n that PyG would
    infer from the largest id in ``edge_index`` (id inputs: n is the public id universe, never a fact of the edges)."""
    text = getattr(data, "text", None)
    if stated and "num_nodes" not in data and getattr(data, "x", None) is None and text is None:
        raise ValueError(
            f"`{name}` states no node count: set `data.num_nodes` to the public id universe. PyG would infer it from the "
            "largest id in `edge_index`, which depends on the private relations."
        )
    n = data.num_nodes
    if n is None:
        n = len(text) if isinstance(text, (list, tuple)) else None
    if n is None or n < 1:
        raise ValueError(f"`{name}` has no nodes (num_nodes={n}); set `data.num_nodes`, `data.x` or `data.text`.")
    return int(n)


def oriented_relations(data: Data, num_nodes: int, name: str) -> Tensor:
    """The graph's relations, cleaned by :func:`~lightning_dprel.datamodules.edge_tuples.sampling.to_simple_undirected` (self-loops,
    duplicates and reverse duplicates removed, each step's count logged by :func:`report_cleaning`), each kept in its
    first listed orientation."""
    ei = getattr(data, "edge_index", None)
    if ei is None or not isinstance(ei, Tensor) or ei.numel() == 0:
        raise ValueError(
            f"`{name}` has no edges (`edge_index` is missing or empty); a relational graph needs relations."
        )
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"`{name}.edge_index` must have shape [2, E], got {tuple(ei.shape)}.")
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(
            f"`{name}.edge_index` holds node ids in [{lo}, {hi}], outside [0, num_nodes) = [0, {num_nodes}); "
            "fix the edge list or `num_nodes`."
        )
    ei = ei.long()
    loop = ei[0] == ei[1]
    directed = int(torch.unique(ei[0, ~loop] * num_nodes + ei[1, ~loop]).numel())  # distinct (u, v), u ≠ v
    out = to_simple_undirected(ei, num_nodes, keep_orientation=True)
    report_cleaning(name, int(loop.sum()), int((~loop).sum()) - directed, directed - out.shape[1], out.shape[1])
    if out.shape[1] == 0:
        raise ValueError(f"`{name}` has no edges once self-loops are removed.")
    return out


def load_tokenizer(name: str | None) -> Any:
    """``AutoTokenizer`` for a name known to :func:`~lightning_dprel.pretrained.resolve_pretrained`; None for dense ``x``."""
    if name is None:
        return None
    from transformers import AutoTokenizer

    from lightning_dprel.pretrained import resolve_pretrained

    return AutoTokenizer.from_pretrained(resolve_pretrained(name))


def node_inputs(data: Data, num_nodes: int, tokenizer: Any, max_length: int, name: str, inputs: str = "auto") -> dict[str, Tensor]:
    """Per-node encoder inputs, computed once: ``data.text`` tokenised and padded to ``max_length``, dense ``data.x``,
    or (``inputs="ids"``, for id-embedding encoders) the row number ``node_id``."""
    if inputs == "ids":
        return {"node_id": torch.arange(num_nodes)}
    if tokenizer is not None:
        text = getattr(data, "text", None)
        if text is None:
            raise ValueError(
                f"`{name}` has no `text` but `tokenizer` is set; give every node a string in `data.text` "
                "or set tokenizer=None to use dense `data.x`."
            )
        if isinstance(text, str) or len(text) != num_nodes:
            count = 1 if isinstance(text, str) else len(text)
            raise ValueError(
                f"`{name}.text` has {count} entries but the graph has {num_nodes} nodes; give one string per node."
            )
        texts = check_node_texts(text, f"{name}.text")  # None refused, empty texts warned
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    x = getattr(data, "x", None)
    if x is None:
        raise ValueError(
            f"`{name}`'s nodes have no features (`data.x` is None) and `tokenizer` is None; provide `data.x`, "
            "or `data.text` together with a `tokenizer`."
        )
    check_node_features(x, name)  # texts or lists in data.x: a clear TypeError, not "'list' object has no attribute 'dim'"
    if x.dim() == 1:
        x = x[:, None]
    if x.shape[0] != num_nodes:
        raise ValueError(f"`{name}.x` has {x.shape[0]} rows but the graph has {num_nodes} nodes.")
    x = x.float()
    check_finite_features(x, name)
    return {"x": x}


def check_finite_features(x: Tensor, name: str) -> None:
    """Raise a ``ValueError`` naming how many nodes have a NaN or ±inf feature (after the cast to float32).

    A non-finite input makes every per-tuple gradient that touches the node NaN/inf; clipping cannot repair
    that, and one such tuple poisons the noisy sum of the whole step.
    """
    bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
    count = int(bad.sum())
    if count:
        first = bad.nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"`{name}.x` has non-finite features (NaN or ±inf, after conversion to float32) in {count:,} of "
            f"{x.shape[0]:,} nodes (first: {first}). Clean them before building the datamodule, e.g. "
            "`data.x = torch.nan_to_num(data.x, nan=0.0, posinf=0.0, neginf=0.0)` or impute the missing values "
            "(and rescale values beyond the float32 range)."
        )


def report_cleaning(name: str, self_loops: int, duplicates: int, reverse: int, remain: int) -> None:
    """Log what cleaning dropped from a graph's edge list (nothing when it was already simple)."""
    counts = [(self_loops, "self-loop"), (duplicates, "duplicate edge"), (reverse, "reverse edge")]
    parts = [f"{c:,} {what}{'' if c == 1 else 's'}" for c, what in counts if c]
    if parts:
        undirected = " (relations are undirected)" if reverse else ""
        rank_zero_info(f"cleaning `{name}`: dropped {', '.join(parts)}{undirected}; {remain:,} relations remain.")


#: ``max_degree`` of a datamodule that caps no degree (edge level, the paper-faithful AdvSGM): above any node's degree.
NO_DEGREE_CAP = 1 << 40


@dataclass(frozen=True)
class CappingReport:
    """What degree capping to K did to the training relations: ``total`` simple relations before it, ``kept`` (m)
    after. A fact of the private graph for the person running the job (as the log line is), never released."""

    max_degree: int
    total: int
    kept: int

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    @property
    def dropped_share(self) -> float:
        """The share of the training relations capping dropped, in [0, 1]."""
        return self.dropped / max(self.total, 1)

    def __str__(self) -> str:
        if self.max_degree >= NO_DEGREE_CAP:
            return f"no degree cap: {self.kept:,} relations for training."
        return (f"capping to K={self.max_degree:,} dropped {self.dropped:,} of {self.total:,} relations "
                f"({100.0 * self.dropped_share:.0f} %); {self.kept:,} remain for training.")


def report_capping(simple: Tensor, capped: Tensor, num_nodes: int, max_degree: int) -> CappingReport:
    """Warn when K is far above the largest degree of the training relations; log what capping dropped (and return it).

    Both are facts about the private graph shown to the person running the job (as are the dataset sizes it
    already sees); choose K from public knowledge, not from them.
    """
    total, kept = int(simple.shape[1]), int(capped.shape[1])
    report = CappingReport(int(max_degree), total, kept)
    if max_degree >= NO_DEGREE_CAP:
        rank_zero_info(str(report))
        return report
    largest = int(torch.bincount(simple.flatten(), minlength=num_nodes).max()) if total else 0
    if max_degree > FAR_ABOVE_FACTOR * max(largest, 1):
        rank_zero_warn(
            f"max_degree K = {max_degree:,} is far above the largest degree of the training relations "
            f"({largest:,}): ε is charged for an entity with up to K relations (its sensitivity grows with K, and "
            "the accountant's cost with it), though no node here has more than "
            f"{largest:,}. A K near the degrees you expect (the paper uses K = 5) gives a much smaller ε for "
            "the same training; K is a public bound, so choose it without tuning it on this graph.",
            category=UserWarning,
        )
    rank_zero_info(str(report))
    return report


@dataclass
class PreparedGraphs:
    """What :func:`prepare` gives the datamodule: the capped training relations and the evaluation sets."""

    num_nodes: int
    train_edges: Tensor
    train_inputs: dict[str, Tensor]
    test: EvalSet
    val: EvalSet | None
    held_out: bool = False  # the test relations were held out of the training graph (no separate, zero-shot test graph)
    capping: CappingReport | None = None  # what capping to K dropped from the training relations


def _load_graphs(source: Any, test_source: Any, val_source: Any, transform: Any) -> tuple[Data, Data | None, Data | None]:
    if source is None:
        raise ValueError("`source` is None; pass a GraphSource, a PyG Data or a PyG Dataset to RelationalDataModule.")
    started = time.monotonic()
    rank_zero_info(f"loading {source!r} …")
    train, test, val = as_graph(source, "source")
    rank_zero_info(f"loaded {source!r} in {time.monotonic() - started:.1f} s")
    if test_source is not None:
        loaded, loaded_test, _ = as_graph(test_source, "test_source")
        test = loaded_test if loaded_test is not None else loaded
    if val_source is not None:
        loaded, _, loaded_val = as_graph(val_source, "val_source")
        val = loaded_val if loaded_val is not None else loaded
    if transform is not None:
        graphs = [g for g in (train, test, val) if g is not None]
        log = ProgressLog(f"applying {type(transform).__name__} to the graphs", len(graphs), unit="graphs")
        train, test, val = (None if g is None else transform(g) for g in (train, test, val))  # each logs its own progress
        log.close()
    return train, test, val


def _eval_relations(data: Data, num_nodes: int, name: str, what: str) -> Tensor:
    try:
        return oriented_relations(data, num_nodes, name)
    except ValueError as err:
        if "no edges" not in str(err):
            raise
        raise ValueError(f"the {what} graph has no relations to evaluate on: {err}") from err


def prepare(
    source: Any, *, test_source: Any = None, val_source: Any = None, transform: Any = None,
    tokenizer: str | None = None, max_length: int = 64, test_fraction: float = 0.2, max_degree: int = 5,
    capping: str = "drop", directed: bool = False, seed: int = 0, max_eval_queries: int | None = None,
    eval_candidates: int | None = None, inputs: str = "auto", relation_fraction: float = 1.0, public: Any = None,
) -> PreparedGraphs:
    """Load, clean, split, cap and tokenise (the datamodule's ``setup``; see its docstring for the options); a ``public``
    :class:`~lightning_dprel.datamodules.edge_tuples.public.PublicRelations` is prepared with the same node inputs."""
    train, test, val = _load_graphs(source, test_source, val_source, transform)
    tok = load_tokenizer(tokenizer)
    n = count_nodes(train, "source", stated=inputs == "ids")
    train_inputs = node_inputs(train, n, tok, max_length, "source", inputs)
    oriented = oriented_relations(train, n, "source")
    if test is None:  # held-out split of the same graph, before capping: a per-relation hash decision
        salt = int(torch.randint(0, 2**62, (1,), generator=public_generator(seed, "split")))
        held_out = held_out_mask(oriented, test_fraction, salt)
        n_test, total = int(held_out.sum()), oriented.shape[1]
        if n_test == 0 or n_test == total:
            side = "none for evaluation" if n_test == 0 else "none for training"
            raise ValueError(
                f"`source` has {total} relation(s); the seeded per-relation split with test_fraction={test_fraction} "
                f"(seed={seed}) leaves {side}. Change test_fraction or seed, or pass a `test_source`."
            )
        test_edges, oriented = oriented[:, held_out], oriented[:, ~held_out]
        test_n, test_inputs = n, train_inputs
    else:
        test_n = count_nodes(test, "test_source", stated=inputs == "ids")
        test_inputs = node_inputs(test, test_n, tok, max_length, "test_source", inputs)
        test_edges = _eval_relations(test, test_n, "test_source", "test")
    if relation_fraction < 1.0:  # nested public subsets: each relation kept by its own hash (data-size curves)
        salt = int(torch.randint(0, 2**62, (1,), generator=public_generator(seed, "subset")))
        oriented = oriented[:, held_out_mask(oriented, relation_fraction, salt)]
        if oriented.shape[1] == 0:
            raise ValueError(f"relation_fraction={relation_fraction} keeps no training relation; raise it.")
    simple = to_simple_undirected(oriented, n)
    capped = cap_degree(simple, n, max_degree, policy=capping, generator=public_generator(seed, "cap"))
    capping_report = report_capping(simple, capped, n, max_degree)
    if directed:  # back to the data's orientation: (a, b) if a → b was given, else (b, a)
        a, b = capped
        forward = torch.isin(a * n + b, oriented[0] * n + oriented[1])
        capped = torch.stack([torch.where(forward, a, b), torch.where(forward, b, a)])
    queries = {"max_queries": max_eval_queries, "candidates": eval_candidates}
    test_set = eval_queries(test_edges, test_n, test_inputs, generator=public_generator(seed, "eval"), **queries)
    val_set = None
    if val is not None:
        val_n = count_nodes(val, "val_source", stated=inputs == "ids")
        val_inputs = node_inputs(val, val_n, tok, max_length, "val_source", inputs)
        val_edges = _eval_relations(val, val_n, "val_source", "validation")
        val_set = eval_queries(val_edges, val_n, val_inputs, generator=public_generator(seed, "val_eval"), **queries)
    if public is not None:
        public.prepare(transform=transform, tokenizer=tokenizer, max_length=max_length, inputs=inputs, private=train)
    return PreparedGraphs(n, capped, train_inputs, test_set, val_set, held_out=test is None, capping=capping_report)
