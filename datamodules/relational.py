"""RelationalDataModule: any PyG graph → the coupled batches the entity-level analysis assumes.

Training (Algorithm 3, lines 1-3, and Algorithm 2): degree capping once, then per step a Poisson sample
E⁺ of the capped edges at rate γ = b/m and NEG-SAMPLE-WOR negatives; each step is a
:class:`~lightning_dprel.batch.TupleBatch` with Algorithm 1's max-freq counted on the global batch.
Evaluation (Section 5.2): :class:`~lightning_dprel.batch.RankingBatch` queries for PREC@1 and MRR.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithms 1-3, Eq. 3, Section 5.2.
"""

from __future__ import annotations

import hashlib
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from pytorch_lightning import LightningDataModule
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset

from datamodules.datasets.base import GraphSource
from lightning_dprel.batch import RankingBatch, TupleBatch
from lightning_dprel.sampling import (
    CAPPING_POLICIES,
    cap_degree,
    edge_priority,
    max_freq,
    neg_sample_wor,
    poisson_positives,
    sample_eval_candidates,
    sample_without_replacement,
    secret_generator,
    to_simple_undirected,
)
from lightning_dprel.specs import SamplingSpec

__all__ = ["RelationalDataModule", "derive_seed", "secret_generator", "held_out_mask", "slice_rows"]

_STATE_VERSION = 2


def derive_seed(seed: int, *tags: Any) -> int:
    """A 32-bit seed for one named stream (torch's CPU generator keeps only the low 32 bits of a seed)."""
    digest = hashlib.blake2b(repr((int(seed),) + tags).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0xFFFFFFFF


def _generator(seed: int, *tags: Any) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *tags))


def held_out_mask(edges: Tensor, fraction: float, salt: int) -> Tensor:
    """Held-out (test) membership per edge: ``edge_priority(canonical edge, salt) < fraction·2^63``.

    Each edge's membership depends only on its own endpoints and the salt, never on the other edges or
    on its position, so removing a node changes the membership of its own edges only. The number of
    held-out edges is Binomial(E, fraction).
    """
    canonical = torch.stack([torch.minimum(edges[0], edges[1]), torch.maximum(edges[0], edges[1])])
    return edge_priority(canonical, salt) < int(fraction * 2**63)


def _broadcast_int64(value: int) -> int:
    """Rank 0's signed 64-bit ``value`` on every rank (CUDA tensor under NCCL)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    box = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(box, src=0)
    return int(box.item())


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run batch construction single-threaded: its O(b·k) tensor ops gain nothing from OpenMP, whose
    fork-join stalls for milliseconds when cores are shared (measured: 3-12x slower per batch at 2 threads
    on a loaded 2-core machine). The loader runs in the training thread, so the setting is restored before
    the batch is handed out."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def slice_rows(num_rows: int, rank: int, world_size: int) -> Tensor:
    """Rows of a global batch that rank ``rank`` takes: a contiguous block, sizes differing by ≤ 1."""
    return torch.tensor_split(torch.arange(num_rows), world_size)[rank]


def _check_int(name: str, value: Any, minimum: int, remedy: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} ({value!r}).")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.{remedy}")


def _as_graph(obj: Any, name: str) -> tuple[Data, Data | None, Data | None]:
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


def _num_nodes(data: Data, name: str) -> int:
    text = getattr(data, "text", None)
    n = data.num_nodes
    if n is None:
        n = len(text) if isinstance(text, (list, tuple)) else None
    if n is None or n < 1:
        raise ValueError(f"`{name}` has no nodes (num_nodes={n}); set `data.num_nodes`, `data.x` or `data.text`.")
    return int(n)


def _oriented_simple(data: Data, num_nodes: int, name: str) -> Tensor:
    """Self-loops, duplicates and reverse duplicates removed, keeping each relation's first orientation."""
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
    ei = ei[:, ei[0] != ei[1]]
    if ei.shape[1] == 0:
        raise ValueError(f"`{name}` has no edges once self-loops are removed.")
    key = torch.minimum(ei[0], ei[1]) * num_nodes + torch.maximum(ei[0], ei[1])
    uniq, inv = torch.unique(key, return_inverse=True)
    first = torch.full((uniq.numel(),), ei.shape[1], dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(ei.shape[1]), reduce="amin")
    return ei[:, first]


def _node_inputs(data: Data, num_nodes: int, tokenizer: Any, max_length: int, name: str) -> dict[str, Tensor]:
    """Per-node encoder inputs, computed once: tokenised ``data.text`` or dense ``data.x``."""
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
        enc = tokenizer(
            [str(t) for t in text], padding="max_length", truncation=True, max_length=max_length, return_tensors="pt"
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    x = getattr(data, "x", None)
    if x is None:
        raise ValueError(
            f"`{name}`'s nodes have no features (`data.x` is None) and `tokenizer` is None; provide `data.x`, "
            "or `data.text` together with a `tokenizer`."
        )
    if x.dim() == 1:
        x = x[:, None]
    if x.shape[0] != num_nodes:
        raise ValueError(f"`{name}.x` has {x.shape[0]} rows but the graph has {num_nodes} nodes.")
    return {"x": x.float()}


def _gather(inputs: dict[str, Tensor], ids: Tensor) -> dict[str, Tensor]:
    """Rows ``ids`` of the cached node inputs; token tensors trimmed to the longest row."""
    out = {key: val.index_select(0, ids) for key, val in inputs.items()}  # much faster than val[ids] on CPU
    if "attention_mask" in out and ids.numel():
        length = max(1, int(out["attention_mask"].sum(dim=1).max()))
        out = {key: val[:, :length] for key, val in out.items()}
    return out


@dataclass
class _EvalSet:
    """One evaluation graph's cached node inputs and its ranking queries (targets, optional candidates)."""

    num_nodes: int
    inputs: dict[str, Tensor]
    query: Tensor
    target: Tensor
    cands: Tensor | None


class _TupleStream(IterableDataset):
    """The training stream: ``steps_per_epoch`` TupleBatches per ``iter()``, resumed from the datamodule's cursor."""

    def __init__(self, datamodule: RelationalDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return self.datamodule.sampling_spec.steps_per_epoch

    def __iter__(self) -> Iterator[TupleBatch]:
        return self.datamodule._iter_train()


class _RankingStream(IterableDataset):
    def __init__(self, datamodule: RelationalDataModule, split: str = "test") -> None:
        self.datamodule = datamodule
        self.split = split

    def __len__(self) -> int:
        return self.datamodule._num_eval_batches(self.split)

    def __iter__(self) -> Iterator[RankingBatch]:
        return self.datamodule._iter_eval(self.split)


class _StatefulLoader(DataLoader):
    """A DataLoader whose position Lightning saves and restores (so mid-epoch resumes are exact)."""

    def __init__(self, dataset: IterableDataset, datamodule: RelationalDataModule) -> None:
        super().__init__(dataset, batch_size=None, num_workers=0)
        self._datamodule = datamodule

    def state_dict(self) -> dict[str, Any]:
        return self._datamodule.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._datamodule.load_state_dict(state_dict)


class RelationalDataModule(LightningDataModule):
    """Coupled relational sampling (Algorithms 2-3) over any PyG graph, for entity-level DP training.

    Graph preparation (in :meth:`setup`, identical on every rank): self-loops, duplicate and reverse
    edges removed; edges treated as undirected relations. Without a separate test graph, each relation is
    held out for evaluation *before* capping iff a seeded hash of its canonical endpoints falls below
    ``test_fraction`` (:func:`held_out_mask`; the held-out count is Binomial(E, test_fraction), and removing
    a node changes the membership of its own relations only). The training
    relations are degree-capped to K (:func:`~lightning_dprel.sampling.cap_degree`; see there what the
    guarantee covers under ``"drop"`` and ``"assert"``), giving m capped edges and γ = b/m.

    Training stream: per step, E⁺ ~ Poisson(Ē, γ) then NEG-SAMPLE-WOR (|E⁺|·k distinct nodes from all n,
    independent of which positives were drawn, each paired with a uniformly random end of its positive).
    An empty E⁺ yields a real, empty :class:`TupleBatch`. Positives and negatives come from two separate
    generator streams, so the negatives depend on the positives only through their counts. Each
    ``iter()`` of the loader continues the stream after the last batch handed out (a sized loader, so
    Lightning does not prefetch): an epoch is ``steps_per_epoch`` draws (default ceil(1/γ)), never a
    replay; the stream position (epoch, index, both generator states) is in :meth:`state_dict` (and the
    train loader's), so a resumed run draws exactly the batches an uninterrupted one would; :meth:`seek`
    rebuilds any (epoch, index) position from the sampling seed alone.

    Public vs secret randomness: ``seed`` drives only the public preprocessing (held-out split, capping
    priorities, evaluation queries and candidates). The two training streams are driven by the SECRET
    ``sampling_seed`` (:func:`secret_generator`; the full mt19937 state is derived from the 64-bit secret,
    lifting torch's 32-bit ``manual_seed`` limit): amplification by subsampling assumes nobody can tell
    which relations were drawn. ``sampling_seed=None`` (the default) draws it from ``os.urandom`` in
    :meth:`setup`, broadcast from rank 0 when ``torch.distributed`` is initialised so all ranks draw the
    same global batches; an explicit one is reproducible but warned about (the guarantee then assumes it
    stays secret). :meth:`state_dict` (and so every checkpoint) holds the secret and both generator
    states: keep checkpoints as secret as the data.

    DDP: every rank draws the same global batch (same sampling seed, same streams); ``max_freq`` is computed on the
    global batch; rank r then keeps a contiguous block of rows (:func:`slice_rows`: ``tensor_split`` of
    the B tuples into world-size parts). World size and rank come from the attached trainer (else 1, 0).
    The loaders wrap ``IterableDataset``s, which Lightning 2.x never re-wraps with a
    ``DistributedSampler`` (``_requires_distributed_sampler`` is False for iterable datasets), so no
    ``use_distributed_sampler=False`` is needed.

    Validation vs test: with a validation graph (``val_source``, or a GraphSource whose ``load()`` gives
    ``val``) the validation loader ranks *its* relations and the test loader the test graph's; choose
    checkpoints and hyper-parameters on validation only (:class:`callbacks.ValidationSelection`).
    Without one, the validation loader yields the test queries (``has_validation_graph`` is False and a
    warning says that selecting on them selects on the test domain).

    Evaluation: for every relation (u, v) of the test graph (capped by ``max_eval_queries``, seeded), rank v
    among all test-graph nodes (``eval_candidates=None``: ``RankingBatch.candidates`` is None, every batch
    carries all nodes, and ``meta["exclude_query"]`` is True: the module must not rank u itself) or among v
    plus N nodes sampled without replacement from V minus {u, v} (fixed at setup). Rankings are raw
    (other true neighbours of u are not filtered). Validation and test loaders yield the same queries; in
    DDP each rank takes a contiguous block of queries, with the same number of batches on every rank.

    Args:
        source: the training graph: a :class:`GraphSource` (its ``load()`` gives train and optional test
            graph), a PyG ``Data``, or a PyG ``Dataset`` (its first graph).
        test_source: a separate (zero-shot) test graph; a GraphSource contributes its ``test`` graph, or its
            ``train`` graph when it has none. Default: the source's own test graph, else a held-out split.
        val_source: a separate public validation graph (neither training nor test); a GraphSource contributes
            its ``val`` graph, or its ``train`` graph when it has none. Default: the source's own ``val`` graph.
        directed: keep each training relation's orientation (source → target as first listed, e.g. child →
            parent) after degree capping, for directed scores (``score="directed_cosine"``). Capping, sampling and
            the privacy analysis are unchanged (they see the undirected relation); only the order of
            ``TupleBatch.pos`` columns follows the data. Evaluation relations are always oriented as given.
        transform: a callable applied to every graph (train, validation, test) before its node inputs are
            cached, e.g. :class:`~lightning_dprel.transforms.EmbedText` (frozen text embeddings as ``data.x``).
        max_degree: K ≥ 1 (default: 5, the paper's).
        capping: ``"drop"`` (seeded edge dropping) or ``"assert"`` (raise if any degree exceeds K).
        expected_batch_size: b > 0, at most m; γ = b/m.
        neg_per_pos: k ≥ 0 negatives per positive.
        tokenizer: a model name or path resolved by :func:`lightning_dprel.demos.resolve_pretrained` and loaded
            with ``AutoTokenizer``; nodes use ``data.text``. None: nodes use dense ``data.x``.
        max_length: token length of the cached node texts (batches are trimmed to their longest text).
        test_fraction: share of relations held out when there is no test graph, in (0, 1).
        eval_candidates: None (rank against all test nodes) or N (v plus N sampled negatives).
        max_eval_queries: at most this many test relations (a seeded subset); None for all.
        eval_batch_size: queries per RankingBatch.
        seed: the PUBLIC preprocessing seed (held-out split, capping priorities, evaluation queries and
            candidates).
        sampling_seed: the SECRET seed of the positive and negative streams, an int in [0, 2^64); None
            (default) draws 64 bits from ``os.urandom`` (rank 0's, under DDP). An explicit value is for
            reproducible experiments and tests and voids amplification by subsampling unless kept secret.
        steps_per_epoch: draws per epoch; None for ceil(1/γ).
        max_overflow_probability: refuse a configuration when P(|E⁺|·k > n) exceeds this (binomial tail).

    Attributes (after :meth:`setup`):
        sampling_spec: the :class:`~lightning_dprel.specs.SamplingSpec` for the accountant (``steps_per_epoch``
            is the number of batches the loader yields per epoch, i.e. the override when one is given).
        train_edges: ``[2, m]`` capped canonical training relations (u < v).
        train_inputs, test_inputs: cached per-node inputs (``input_ids``/``attention_mask`` or ``x``).
        eval_query, eval_target: ``[Q]`` node ids of the evaluation relations; ``eval_cands``: ``[Q, 1 + N]``
            global candidate ids (target first) or None.

    Raises:
        ValueError: bad options here; bad graphs in :meth:`setup` (no edges, ids out of range, nodes without
            text or features, text count ≠ node count, b > m, a test graph with no relations, a likely
            |E⁺|·k > n).

    Example::

        >>> from lightning_dprel.demos import random_feature_graph
        >>> dm = RelationalDataModule(random_feature_graph(200, 600), expected_batch_size=8, neg_per_pos=2)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch.tuple_nodes.shape[1]
        4

    References:
        Huang et al., Algorithms 2-3 and Section 5.2; Daigavane et al. 2021 (arXiv 2111.15521), Algorithm 1.
    """

    def __init__(
        self,
        source: GraphSource | Data | PyGDataset | None = None,
        *,
        test_source: GraphSource | Data | PyGDataset | None = None,
        val_source: GraphSource | Data | PyGDataset | None = None,
        transform: Any = None,
        directed: bool = False,
        max_degree: int = 5,
        capping: str = "drop",
        expected_batch_size: float = 64.0,
        neg_per_pos: int = 4,
        tokenizer: str | None = None,
        max_length: int = 64,
        test_fraction: float = 0.2,
        eval_candidates: int | None = None,
        max_eval_queries: int | None = None,
        eval_batch_size: int = 256,
        seed: int = 0,
        sampling_seed: int | None = None,
        steps_per_epoch: int | None = None,
        max_overflow_probability: float = 1e-9,
    ) -> None:
        super().__init__()
        _check_int("max_degree", max_degree, 1, " The cap K must allow at least one edge per node.")
        _check_int("neg_per_pos", neg_per_pos, 0)
        _check_int("max_length", max_length, 1)
        _check_int("eval_batch_size", eval_batch_size, 1)
        _check_int("seed", seed, 0)
        if sampling_seed is not None:
            _check_int("sampling_seed", sampling_seed, 0, " Use None to draw one from os.urandom.")
            if sampling_seed >= 1 << 64:
                raise ValueError("`sampling_seed` must be < 2**64, got a larger int; use None to draw one from os.urandom.")
            rank_zero_warn(
                "RelationalDataModule(sampling_seed=<int>) makes the training batches reproducible: amplification by "
                "subsampling (and so the privacy guarantee) then assumes the seed is kept secret. Use "
                "sampling_seed=None for private runs.",
                category=UserWarning,
            )
        if capping not in CAPPING_POLICIES:
            raise ValueError(f"`capping` must be one of {CAPPING_POLICIES}, got {capping!r}.")
        if isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, (int, float)):
            raise TypeError(f"`expected_batch_size` must be a number, got {type(expected_batch_size).__name__}.")
        if not (expected_batch_size > 0) or math.isinf(expected_batch_size):
            raise ValueError(f"`expected_batch_size` (b) must be > 0 and finite, got {expected_batch_size}.")
        if not (0.0 < float(test_fraction) < 1.0):
            raise ValueError(f"`test_fraction` must be in (0, 1), got {test_fraction}.")
        if eval_candidates is not None:
            _check_int("eval_candidates", eval_candidates, 1, " Use None to rank against all nodes.")
        if max_eval_queries is not None:
            _check_int("max_eval_queries", max_eval_queries, 1)
        if steps_per_epoch is not None:
            _check_int("steps_per_epoch", steps_per_epoch, 1)
        if not (0.0 < float(max_overflow_probability) < 1.0):
            raise ValueError(f"`max_overflow_probability` must be in (0, 1), got {max_overflow_probability}.")
        if transform is not None and not callable(transform):
            raise TypeError(f"`transform` must be callable (Data -> Data), got {type(transform).__name__}.")
        self.source = source
        self.test_source = test_source
        self.val_source = val_source
        self.transform = transform
        self.directed = bool(directed)
        self.max_degree = max_degree
        self.capping = capping
        self.expected_batch_size = float(expected_batch_size)
        self.neg_per_pos = neg_per_pos
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.test_fraction = float(test_fraction)
        self.eval_candidates = eval_candidates
        self.max_eval_queries = max_eval_queries
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.sampling_seed = sampling_seed
        self._secret: int | None = sampling_seed  # resolved in setup(); never logged
        self._secret_synced = sampling_seed is not None  # an explicit seed is the same on every rank
        self.steps_per_epoch = steps_per_epoch
        self.max_overflow_probability = float(max_overflow_probability)
        self._spec: SamplingSpec | None = None
        self._pending_state: dict[str, Any] | None = None
        self._cursor: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        """Load, clean, split, cap and tokenise once (idempotent; the same on every rank).

        Also fixes the secret sampling seed (drawn from ``os.urandom`` when None; rank 0's under DDP).
        """
        self._resolve_secret()
        if self._spec is not None:
            return
        if self.source is None:
            raise ValueError(
                "`source` is None; pass a GraphSource, a PyG Data or a PyG Dataset to RelationalDataModule."
            )
        train, test, val = _as_graph(self.source, "source")
        if self.test_source is not None:
            loaded, loaded_test, _ = _as_graph(self.test_source, "test_source")
            test = loaded_test if loaded_test is not None else loaded
        if self.val_source is not None:
            loaded, _, loaded_val = _as_graph(self.val_source, "val_source")
            val = loaded_val if loaded_val is not None else loaded
        if self.transform is not None:
            train, test, val = (None if g is None else self.transform(g) for g in (train, test, val))
        tok = self._load_tokenizer()
        n = _num_nodes(train, "source")
        self.train_inputs = _node_inputs(train, n, tok, self.max_length, "source")
        oriented = _oriented_simple(train, n, "source")
        if test is None:  # held-out split of the same graph, before capping: a per-relation hash decision
            salt = int(torch.randint(0, 2**62, (1,), generator=_generator(self.seed, "split")))
            held_out = held_out_mask(oriented, self.test_fraction, salt)
            n_test, total = int(held_out.sum()), oriented.shape[1]
            if n_test == 0 or n_test == total:
                side = "none for evaluation" if n_test == 0 else "none for training"
                raise ValueError(
                    f"`source` has {total} relation(s); the seeded per-relation split with "
                    f"test_fraction={self.test_fraction} (seed={self.seed}) leaves {side}. Change test_fraction or "
                    "seed, or pass a `test_source`."
                )
            test_edges, oriented = oriented[:, held_out], oriented[:, ~held_out]
            self.test_num_nodes, self.test_inputs = n, self.train_inputs
        else:
            self.test_num_nodes = _num_nodes(test, "test_source")
            self.test_inputs = _node_inputs(test, self.test_num_nodes, tok, self.max_length, "test_source")
            try:
                test_edges = _oriented_simple(test, self.test_num_nodes, "test_source")
            except ValueError as err:
                if "no edges" not in str(err):
                    raise
                raise ValueError(f"the test graph has no relations to evaluate on: {err}") from err
        simple = to_simple_undirected(oriented, n)
        self.train_edges = cap_degree(
            simple, n, self.max_degree, policy=self.capping, generator=_generator(self.seed, "cap")
        )
        if self.directed:  # back to the data's orientation: (a, b) if a → b was given, else (b, a)
            a, b = self.train_edges
            forward = torch.isin(a * n + b, oriented[0] * n + oriented[1])
            self.train_edges = torch.stack([torch.where(forward, a, b), torch.where(forward, b, a)])
        self._spec = self._make_spec(n, int(self.train_edges.shape[1]))
        self._setup_eval(test_edges)
        self._val = None
        if val is not None:
            val_n = _num_nodes(val, "val_source")
            val_inputs = _node_inputs(val, val_n, tok, self.max_length, "val_source")
            try:
                val_edges = _oriented_simple(val, val_n, "val_source")
            except ValueError as err:
                raise ValueError(f"the validation graph has no relations to evaluate on: {err}") from err
            self._val = _EvalSet(val_n, val_inputs, *self._eval_queries(val_edges, val_n, "val_eval"))

    def _load_tokenizer(self) -> Any:
        if self.tokenizer is None:
            return None
        from transformers import AutoTokenizer

        from lightning_dprel.demos import resolve_pretrained

        return AutoTokenizer.from_pretrained(resolve_pretrained(self.tokenizer))

    def _make_spec(self, n: int, m: int) -> SamplingSpec:
        b, k = self.expected_batch_size, self.neg_per_pos
        if m < 1:
            raise ValueError("no training relations are left after degree capping; raise max_degree.")
        if b > m:
            raise ValueError(
                f"`expected_batch_size` (b={b:g}) exceeds the {m} capped training relations (gamma = b/m > 1); "
                "lower expected_batch_size or use a larger graph / larger max_degree."
            )
        gamma = b / m
        if k > 0:
            from scipy.stats import binom

            limit = n // k  # |E+|·k <= n  ⟺  |E+| <= n // k
            tail = float(binom.sf(limit, m, gamma))
            if tail > self.max_overflow_probability:
                raise ValueError(
                    f"NEG-SAMPLE-WOR needs |E+|*k <= n, but with m={m}, gamma={gamma:.3g}, k={k}, n={n} "
                    f"P(|E+| > {limit}) = {tail:.3g} > max_overflow_probability={self.max_overflow_probability:g}; "
                    "lower expected_batch_size or neg_per_pos (or use a graph with more nodes)."
                )
        steps = self.steps_per_epoch if self.steps_per_epoch is not None else math.ceil(1.0 / gamma)
        return SamplingSpec(
            num_nodes=n,
            num_edges=m,
            max_degree=self.max_degree,
            sampling_rate=gamma,
            neg_per_pos=k,
            expected_batch_size=b,
            steps_per_epoch=steps,
        )

    def _eval_queries(self, edges: Tensor, num_nodes: int, tag: str) -> tuple[Tensor, Tensor, Tensor | None]:
        g = _generator(self.seed, tag)
        if self.max_eval_queries is not None and edges.shape[1] > self.max_eval_queries:
            keep = sample_without_replacement(edges.shape[1], self.max_eval_queries, generator=g)
            edges = edges[:, torch.sort(keep).values]
        cands = None
        if self.eval_candidates is not None:
            cands = sample_eval_candidates(edges[0], edges[1], num_nodes, self.eval_candidates, generator=g)
        return edges[0], edges[1], cands

    def _setup_eval(self, test_edges: Tensor) -> None:
        self.eval_query, self.eval_target, self.eval_cands = self._eval_queries(test_edges, self.test_num_nodes, "eval")

    @property
    def has_validation_graph(self) -> bool:
        """True when validation ranks a separate public graph (not the test queries); known after :meth:`setup`."""
        return getattr(self, "_val", None) is not None

    def _eval_set(self, split: str) -> _EvalSet:
        if split == "val" and self.has_validation_graph:
            return self._val
        return _EvalSet(self.test_num_nodes, self.test_inputs, self.eval_query, self.eval_target, self.eval_cands)

    @property
    def sampling_spec(self) -> SamplingSpec:
        """The sampling facts for the accountant (m after capping, n, K, γ, k, b, steps per epoch)."""
        if self._spec is None:
            raise RuntimeError(
                "RelationalDataModule.sampling_spec is known only after setup(): call `dm.setup('fit')` first "
                "(the capped edge count m depends on the data)."
            )
        return self._spec

    # --------------------------------------------------------------- training
    def _resolve_secret(self) -> int:
        """The secret sampling seed: drawn from ``os.urandom`` once, then rank 0's on every rank (DDP)."""
        if self._secret is None:
            self._secret = int.from_bytes(os.urandom(8), "little")
        if not self._secret_synced and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            signed = self._secret - (1 << 64) if self._secret >= 1 << 63 else self._secret
            self._secret = _broadcast_int64(signed) % (1 << 64)
            self._secret_synced = True
        return self._secret

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _fresh_cursor(self) -> dict[str, Any]:
        return {
            "epoch": 0,
            "index": 0,
            "pos_state": secret_generator(self._resolve_secret(), "sampling", "positives").get_state(),
            "neg_state": secret_generator(self._resolve_secret(), "sampling", "negatives").get_state(),
        }

    def draw_global(self, pos_gen: torch.Generator, neg_gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """One global batch: positive edges [B, 2], negatives [B, k], anchors [B, k] (Algorithms 2-3)."""
        spec = self.sampling_spec
        idx = poisson_positives(spec.num_edges, spec.sampling_rate, generator=pos_gen)
        if idx.numel() * spec.neg_per_pos > spec.num_nodes:
            raise RuntimeError(
                f"this step drew |E+|={idx.numel()} positives and |E+|*k={idx.numel() * spec.neg_per_pos} exceeds "
                f"n={spec.num_nodes}: NEG-SAMPLE-WOR is impossible and the batch is never truncated; lower "
                "expected_batch_size or neg_per_pos (or max_overflow_probability)."
            )
        neg, anchor = neg_sample_wor(idx.numel(), spec.neg_per_pos, spec.num_nodes, generator=neg_gen)
        return self.train_edges.index_select(1, idx).t().contiguous(), neg, anchor

    def make_batch(
        self, pos: Tensor, neg: Tensor, anchor: Tensor, *, step: int, rank: int = 0, world_size: int = 1
    ) -> TupleBatch:
        """Rank ``rank``'s slice of a global batch, with max-freq counted on the whole global batch."""
        freq = max_freq(pos, neg)  # Algorithm 1, before slicing
        rows = slice_rows(pos.shape[0], rank, world_size)
        p, z, a, f = pos[rows], neg[rows], anchor[rows], freq[rows]
        node_ids, inverse = torch.unique(torch.cat([p, z], dim=1), return_inverse=True)
        return TupleBatch(
            pos=p,
            neg=z,
            neg_anchor=a,
            max_freq=f,
            node_ids=node_ids,
            tuple_nodes=inverse.view(p.shape[0], 2 + z.shape[1]),
            node_inputs=_gather(self.train_inputs, node_ids),
            expected_batch_size=self.sampling_spec.expected_batch_size,
            global_size=int(pos.shape[0]),
            step=step,
        )

    def _iter_train(self) -> Iterator[TupleBatch]:
        spec = self.sampling_spec
        if self._pending_state is not None:
            saved = self._pending_state.get("spec")
            now = (spec.num_edges, spec.steps_per_epoch)
            if saved is not None and tuple(saved) != now:
                raise ValueError(
                    f"the checkpoint's sampling stream had (m, steps_per_epoch) = {tuple(saved)}, this datamodule has "
                    f"{now}; resume with the same graph, capping and batch options."
                )
            self._cursor = {k: v for k, v in self._pending_state.items() if k != "spec"}
            self._pending_state = None
        cursor = self._cursor or self._fresh_cursor()
        epoch, start = cursor["epoch"], cursor["index"]
        if start >= spec.steps_per_epoch:
            epoch, start = epoch + 1, 0
        pos_gen, neg_gen = torch.Generator(), torch.Generator()
        pos_gen.set_state(cursor["pos_state"])
        neg_gen.set_state(cursor["neg_state"])
        rank, world = self._world()

        def stream() -> Iterator[TupleBatch]:
            for index in range(start, spec.steps_per_epoch):
                step = epoch * spec.steps_per_epoch + index
                with _one_thread():
                    pos, neg, anchor = self.draw_global(pos_gen, neg_gen)
                    batch = self.make_batch(pos, neg, anchor, step=step, rank=rank, world_size=world)
                # The cursor moves when a batch is handed out. Lightning 2.x does not prefetch from a sized
                # loader (``_PrefetchDataFetcher`` skips pre-fetching when the length is known), so at a
                # checkpoint the cursor sits right after the last batch the trainer consumed.
                self._cursor = {
                    "epoch": epoch,
                    "index": index + 1,
                    "pos_state": pos_gen.get_state(),
                    "neg_state": neg_gen.get_state(),
                }
                yield batch

        return stream()

    def train_dataloader(self) -> DataLoader:
        """Training loader: ``steps_per_epoch`` TupleBatches per epoch (never re-wrapped by Lightning)."""
        self.sampling_spec  # noqa: B018 - raises a clear error before setup
        return _StatefulLoader(_TupleStream(self), self)

    # ------------------------------------------------------------- evaluation
    def _eval_rows(self, split: str = "test") -> list[Tensor]:
        rank, world = self._world()
        num_q = self._eval_set(split).query.numel()
        mine = slice_rows(num_q, rank, world)
        per_rank = math.ceil(num_q / world)
        num_batches = max(1, math.ceil(per_rank / self.eval_batch_size))
        return list(torch.tensor_split(mine, num_batches))

    def _num_eval_batches(self, split: str = "test") -> int:
        return len(self._eval_rows(split))

    def _iter_eval(self, split: str = "test") -> Iterator[RankingBatch]:
        for rows in self._eval_rows(split):
            with _one_thread():
                batch = self._ranking_batch(rows, split)
            yield batch

    def _ranking_batch(self, rows: Tensor, split: str = "test") -> RankingBatch:
        ev = self._eval_set(split)
        query, target = ev.query[rows], ev.target[rows]
        if ev.cands is None:
            node_ids = torch.arange(ev.num_nodes)
            return RankingBatch(
                node_ids=node_ids,
                node_inputs=_gather(ev.inputs, node_ids),
                query=query,
                target=target,
                candidates=None,
                meta={"exclude_query": True},
            )
        cands = ev.cands[rows]
        node_ids, inverse = torch.unique(torch.cat([query[:, None], cands], dim=1), return_inverse=True)
        return RankingBatch(
            node_ids=node_ids,
            node_inputs=_gather(ev.inputs, node_ids),
            query=inverse[:, 0],
            target=inverse[:, 1],
            candidates=inverse[:, 1:],
            meta={"exclude_query": False},
        )

    def val_dataloader(self) -> DataLoader:
        """Validation queries (RankingBatch) for PREC@1 / MRR: the validation graph's, else the test queries (warned)."""
        self.sampling_spec  # noqa: B018
        if not self.has_validation_graph:
            rank_zero_warn(
                "RelationalDataModule has no validation graph, so validation ranks the TEST queries: choosing "
                "checkpoints or hyper-parameters on them selects on the test domain. Pass `val_source` (or a source "
                "with a `val` graph such as HPOLarge / WordNetLarge).",
                category=UserWarning,
            )
        return DataLoader(_RankingStream(self, "val"), batch_size=None, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        """Test queries (RankingBatch) for PREC@1 / MRR on the test graph."""
        self.sampling_spec  # noqa: B018
        return DataLoader(_RankingStream(self, "test"), batch_size=None, num_workers=0)

    def seek(self, epoch: int, index: int = 0) -> None:
        """Position the training stream at batch ``index`` of ``epoch``, replaying the draws from the sampling seed.

        The stream is one generator sequence per kind (per-step reseeding would repeat batches); any
        position is reproducible from the secret sampling seed by replaying, at the cost of one draw per
        earlier step.
        """
        spec = self.sampling_spec
        _check_int("epoch", epoch, 0)
        _check_int("index", index, 0)
        if index > spec.steps_per_epoch:
            raise ValueError(f"`index` must be <= steps_per_epoch={spec.steps_per_epoch}, got {index}.")
        cursor = self._fresh_cursor()
        pos_gen, neg_gen = torch.Generator(), torch.Generator()
        pos_gen.set_state(cursor["pos_state"])
        neg_gen.set_state(cursor["neg_state"])
        with _one_thread():
            for _ in range(epoch * spec.steps_per_epoch + index):
                self.draw_global(pos_gen, neg_gen)
        self._pending_state = None
        self._cursor = {
            "epoch": epoch,
            "index": index,
            "pos_state": pos_gen.get_state(),
            "neg_state": neg_gen.get_state(),
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The training stream's position after the last consumed batch (epoch, index, generator states).

        SECRET: it holds the sampling seed and both generator states, from which every past and future
        batch can be recomputed; keep checkpoints as confidential as the training data.
        """
        cursor = self._cursor or self._pending_state
        state: dict[str, Any] = {"version": _STATE_VERSION, "seed": self.seed}
        if self._secret is not None:
            state["sampling_seed"] = self._secret
        if self._spec is not None:
            state["spec"] = [self._spec.num_edges, self._spec.steps_per_epoch]
        if cursor is not None:
            state.update(
                epoch=int(cursor["epoch"]),
                index=int(cursor["index"]),
                pos_state=cursor["pos_state"].clone(),
                neg_state=cursor["neg_state"].clone(),
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the stream where :meth:`state_dict` left it; the next ``iter()`` continues from there."""
        if not state_dict or "seed" not in state_dict:
            raise ValueError("RelationalDataModule.load_state_dict got an empty state or one without `seed`.")
        if int(state_dict["seed"]) != self.seed:
            raise ValueError(
                f"the checkpoint's sampling stream was drawn with seed={state_dict['seed']}, this datamodule has "
                f"seed={self.seed}; resume with the same seed."
            )
        if "sampling_seed" in state_dict:
            saved = int(state_dict["sampling_seed"])
            if self.sampling_seed is not None and saved != self.sampling_seed:
                raise ValueError(
                    "the checkpoint's sampling stream was drawn with another `sampling_seed` than this datamodule's "
                    "(values not shown: they are secret); resume with the same sampling_seed, or sampling_seed=None "
                    "to take the checkpoint's."
                )
            self._secret, self._secret_synced = saved, True  # every rank loads the same checkpoint
        if "pos_state" not in state_dict:
            self._pending_state, self._cursor = None, None
            return
        self._pending_state = {k: state_dict[k] for k in ("epoch", "index", "pos_state", "neg_state")}
        self._pending_state["spec"] = state_dict.get("spec")
        self._cursor = None
