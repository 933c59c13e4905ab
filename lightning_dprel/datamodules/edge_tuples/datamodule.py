"""RelationalDataModule: any PyG graph → the coupled batches the entity-level analysis assumes.

A thin PrivateDataModule (privacy unit: an entity) wiring three rooms: :mod:`~lightning_dprel.datamodules.edge_tuples.graph_prep` (public preparation: cleaning,
held-out split, degree capping, node inputs, evaluation queries), :mod:`~lightning_dprel.datamodules.edge_tuples.coupled_stream` (the
training stream, Algorithm 3 with Algorithm 2 NEG-SAMPLE-WOR, on a keyed CSPRNG) and
:mod:`~lightning_dprel.datamodules.edge_tuples.evaluation` (RankingBatch queries for PREC@1 and MRR, Section 5.2).

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithms 1-3, Eq. 3, Section 5.2.
"""

from __future__ import annotations

from typing import Any

from lightning_dprel.core.datamodule import PrivateDataModule
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset
from torch_geometric.transforms import BaseTransform

from lightning_dprel.datamodules.edge_tuples.coupled_stream import (
    STATE_VERSION,
    CoupledStream,
    StatefulLoader,
    TupleStream,
    check_stream_state,
    make_spec,
    sampling_randomness,
)
from lightning_dprel.datamodules.datasets.base import GraphSource
from lightning_dprel.datamodules.edge_tuples.evaluation import EvalSet, RankingStream
from lightning_dprel.datamodules.edge_tuples.graph_prep import check_int, derive_seed, held_out_mask, prepare
from lightning_dprel.datamodules.edge_tuples.rows import slice_rows
from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.datamodules.edge_tuples.public import PublicRelations
from lightning_dprel.encoders import resolve_tokenizer
from lightning_dprel.core.checks import check_choice, check_probability, positive_finite
from lightning_dprel.core.randomness import distributed
from lightning_dprel.datamodules.edge_tuples.sampling import CAPPING_POLICIES
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY
from lightning_dprel.core.specs import SamplingSpec

__all__ = ["RelationalDataModule", "derive_seed", "held_out_mask", "slice_rows"]

class RelationalDataModule(PrivateDataModule):
    """Coupled relational sampling (Algorithms 2-3) over any PyG graph, for entity-level DP training.

    Graph preparation (:meth:`setup`, identical on every rank; :func:`lightning_dprel.datamodules.edge_tuples.graph_prep.prepare`):
    self-loops, duplicate and reverse edges removed; edges treated as undirected relations. Without a
    separate test graph, each relation is held out for evaluation *before* capping iff a seeded hash of its
    canonical endpoints falls below ``test_fraction`` (:func:`held_out_mask`: the held-out count is
    Binomial(E, test_fraction), and removing a node changes the membership of its own relations only). The
    training relations are degree-capped to K (:func:`~lightning_dprel.datamodules.edge_tuples.sampling.cap_degree`; see there what
    the guarantee covers under ``"drop"`` and ``"assert"``), giving m capped edges and γ = b/m.

    Training stream (:class:`~lightning_dprel.datamodules.edge_tuples.coupled_stream.CoupledStream`): per step, E⁺ ~ Poisson(Ē, γ) then
    NEG-SAMPLE-WOR (|E⁺|·k distinct nodes from all n, each paired with a uniformly random end of its
    positive); an empty E⁺ is a real, empty :class:`TupleBatch`. Text inputs keep their full ``max_length``
    width, so a tuple's gradient never depends on the other tuples' texts. Each ``iter()`` of the (sized)
    loader continues after the last batch handed out: an epoch is ``steps_per_epoch`` draws (default
    ceil(1/γ)), never a replay. The position (epoch, index) is in :meth:`state_dict`; :meth:`seek` is O(1).

    Public vs secret randomness: ``seed`` drives only the public preprocessing (held-out split, capping, evaluation
    queries). The batches come from a keyed CSPRNG (:class:`~lightning_dprel.core.randomness.KeyedStream`,
    AES-256-CTR under SHAKE-256-derived keys); step t draws its positives and negatives from the children ``(t,
    "positives")`` and ``(t, "negatives")``, so the negatives depend on the positives only through their count.
    ``sampling_seed=None`` (the default) keys it from ``os.urandom`` (rank 0's key under ``torch.distributed``); the
    key is never saved or logged, so a resumed private run draws fresh, independent batches. An explicit
    ``sampling_seed`` is public: reproducible (a resumed run draws the uninterrupted run's batches), voids the
    guarantee, and warns.

    DDP: every rank draws the same global batch; ``max_freq`` is computed on the global batch; rank r then keeps a
    contiguous block of rows (:func:`slice_rows`). World size and rank come from the attached trainer, else
    ``torch.distributed`` (else 1, 0). The loaders wrap ``IterableDataset``s, which Lightning 2.x never re-wraps
    with a ``DistributedSampler``, so no ``use_distributed_sampler=False`` is needed.

    Validation vs test: with a validation graph (``val_source``, or a GraphSource whose ``load()`` gives ``val``) the
    validation loader ranks *its* relations and the test loader the test graph's; choose checkpoints and
    hyper-parameters on validation only (:class:`callbacks.ValidationSelection`). Without one, the validation loader
    yields the test queries (``has_validation_graph`` is False, and it warns).

    Evaluation: for every relation (u, v) of the test graph (capped by ``max_eval_queries``, seeded), rank v among all
    test-graph nodes (``eval_candidates=None``: ``RankingBatch.candidates`` is None and ``meta["exclude_query"]`` is
    True: the module must not rank u itself) or among v plus N nodes sampled without replacement from V minus {u, v}
    (fixed at setup). Rankings are raw (other true neighbours of u are not filtered). In DDP each rank takes a
    contiguous block of queries, with as many batches on every rank.

    Attributes (after :meth:`setup`):
        sampling_spec: the :class:`~lightning_dprel.core.specs.SamplingSpec` for the accountant.
        train_edges: ``[2, m]`` capped training relations (canonical u < v unless ``directed``).
        train_inputs, test_inputs: cached per-node inputs (``input_ids``/``attention_mask`` or ``x``).
        eval_query, eval_target: ``[Q]`` node ids of the evaluation relations; ``eval_cands``: ``[Q, 1 + N]``
            global candidate ids (target first) or None.
        stream: the :class:`~lightning_dprel.datamodules.edge_tuples.coupled_stream.CoupledStream` of training batches.
        held_out_test: True: test relations held out of the training graph; False: a separate (zero-shot) test graph.
        capping_report: what capping to K dropped (a ``CappingReport``: ``total``, ``kept`` = m, ``dropped``,
            ``dropped_share``), as logged at setup; a larger K keeps more, at a higher σ for the same ε (Theorem C.1).

    Raises:
        ValueError: bad options here; bad graphs in :meth:`setup` (no edges, ids out of range, nodes without
            text or features, text count ≠ node count, b > m, a test graph with no relations, a likely
            |E⁺|·k > n).

    Example::

        >>> from lightning_dprel.datamodules.datasets.generators import random_feature_graph
        >>> dm = RelationalDataModule(random_feature_graph(200, 600), expected_batch_size=8, neg_per_pos=2)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch.tuple_nodes.shape[1]
        4
    """

    privacy_unit = ENTITY.name  # an entity and its relations: the one declaration of its unit (the SamplingSpec reads it)
    #: How nodes are fed to the encoder: ``"auto"`` (texts or ``data.x``) or ``"ids"`` (row numbers, for id embeddings).
    node_inputs = "auto"

    def __init__(
        self,
        source: GraphSource | Data | PyGDataset | None = None,
        *,
        test_source: GraphSource | Data | PyGDataset | None = None,
        val_source: GraphSource | Data | PyGDataset | None = None,
        transform: BaseTransform | None = None,
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
        public: PublicRelations | GraphSource | Data | PyGDataset | None = None, relation_fraction: float = 1.0,
    ) -> None:
        """Check and keep the options (the class docstring describes the pipeline); graphs are read in :meth:`setup`.

        Args:
            source: the training graph: a :class:`GraphSource` (its ``load()`` gives train and optional test
                graph), a PyG ``Data``, or a PyG ``Dataset`` (its first graph).
            test_source: a separate (zero-shot) test graph; a GraphSource contributes its ``test`` graph, or its
                ``train`` graph when it has none. Default: the source's own test graph, else a held-out split.
            val_source: a separate public validation graph (neither training nor test); a GraphSource contributes
                its ``val`` graph, or its ``train`` graph when it has none. Default: the source's own ``val`` graph.
            directed: keep each training relation's orientation (as first listed, e.g. child → parent) after
                capping, for directed scores (``score="directed_cosine"``). Capping, sampling and the privacy
                analysis are unchanged; only the order of ``TupleBatch.pos`` columns follows the data.
            transform: a callable applied to every graph (train, validation, test) before its node inputs are
                cached, e.g. :class:`~lightning_dprel.transforms.EmbedText` (frozen text embeddings as ``data.x``).
            max_degree: K ≥ 1 (default: 5, the paper's).
            capping: ``"drop"`` (seeded edge dropping) or ``"assert"`` (raise if any degree exceeds K).
            expected_batch_size: b > 0, at most m; γ = b/m.
            neg_per_pos: k ≥ 0 negatives per positive.
            tokenizer: a model name or path resolved by :func:`lightning_dprel.pretrained.resolve_pretrained` and loaded
                with ``AutoTokenizer``; nodes use ``data.text``. None (default): the text encoder's own tokenizer when the
                trainer's module has one (``module.encoder.tokenizer_name``), else dense ``data.x``. A tokenizer that does
                not match the module's encoder is refused in :meth:`setup` (:meth:`match_encoder`).
            max_length: token length of the cached node texts; training batches are padded to it (evaluation
                batches are trimmed to their longest text).
            test_fraction: share of relations held out when there is no test graph, in (0, 1).
            eval_candidates: None (rank against all test nodes) or N (v plus N sampled negatives).
            max_eval_queries: at most this many test relations (a seeded subset); None for all.
            eval_batch_size: queries per RankingBatch.
            seed: the PUBLIC preprocessing seed (held-out split, capping priorities, evaluation queries).
            sampling_seed: None (default): secret training batches (key from ``os.urandom``). An int in
                [0, 2^64): reproducible batches for tests and experiments; public, so it voids the guarantee.
            steps_per_epoch: draws per epoch; None for ceil(1/γ).
            max_overflow_probability: refuse a configuration when P(|E⁺|·k > n) exceeds this (binomial tail).
            public: public relations beside the private graph (:class:`~.public.PublicRelations` or a graph it wraps):
                same ``transform``, never charged, never in a private batch, named in ``privacy.json`` (docs/utility.md).
            relation_fraction: keep a training relation iff a seeded hash of its endpoints is below it (nested subsets).
        """
        super().__init__()
        check_int("max_degree", max_degree, 1, " The cap K must allow at least one edge per node.")
        check_int("neg_per_pos", neg_per_pos, 0)
        check_int("max_length", max_length, 1)
        check_int("eval_batch_size", eval_batch_size, 1)
        check_int("seed", seed, 0)
        if sampling_seed is not None:
            check_int("sampling_seed", sampling_seed, 0, " Use None for secret batches.")
            if sampling_seed >= 1 << 64:
                raise ValueError("`sampling_seed` must be < 2**64, got a larger int; use None for secret batches.")
            rank_zero_warn(
                "RelationalDataModule(sampling_seed=<int>) makes the training batches reproducible: anyone who knows "
                "the seed can list the sampled relations, which voids amplification by subsampling (and so the "
                "privacy guarantee). Use it for tests and reproducible experiments; sampling_seed=None for private runs.",
                category=UserWarning,
            )
        check_choice("capping", capping, CAPPING_POLICIES)
        positive_finite("expected_batch_size (b)", expected_batch_size)
        check_probability("test_fraction", test_fraction)
        if eval_candidates is not None:
            check_int("eval_candidates", eval_candidates, 1, " Use None to rank against all nodes.")
        if max_eval_queries is not None:
            check_int("max_eval_queries", max_eval_queries, 1)
        if steps_per_epoch is not None:
            check_int("steps_per_epoch", steps_per_epoch, 1)
        check_probability("max_overflow_probability", max_overflow_probability)
        check_probability("relation_fraction", relation_fraction, one=True)
        if transform is not None and not callable(transform):
            raise TypeError(f"`transform` must be callable (Data -> Data), got {type(transform).__name__}.")
        self.source, self.test_source, self.val_source = source, test_source, val_source
        self.public = public if public is None or isinstance(public, PublicRelations) else PublicRelations(public)
        self.relation_fraction, self.transform, self.directed = float(relation_fraction), transform, bool(directed)
        self.max_degree, self.capping = max_degree, capping
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
        self.steps_per_epoch = steps_per_epoch
        self.max_overflow_probability = float(max_overflow_probability)
        self._randomness = sampling_randomness(sampling_seed)  # keyed at the first draw; the key is never saved
        self._key_shared = sampling_seed is not None  # a seeded key is the same on every rank
        self._spec: SamplingSpec | None = None
        self.capping_report = None  # set in setup(): what capping to K dropped
        self._val: EvalSet | None = None
        self._pending_state: dict[str, Any] | None = None
        self.stream: CoupledStream | None = None

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        """Load, clean, split, cap and tokenise once (idempotent; the same on every rank); under ``torch.distributed``
        it also keys the secret stream with rank 0's key (every rank runs setup)."""
        self._share_key()
        self.match_encoder(getattr(self.trainer.lightning_module, "encoder", None) if self.trainer is not None else None)
        if self._spec is not None:
            return
        g = prepare(
            self.source, test_source=self.test_source, val_source=self.val_source, transform=self.transform,
            tokenizer=self.tokenizer, max_length=self.max_length, test_fraction=self.test_fraction,
            max_degree=self.max_degree, capping=self.capping, directed=self.directed, seed=self.seed,
            max_eval_queries=self.max_eval_queries, eval_candidates=self.eval_candidates, inputs=self.node_inputs,
            relation_fraction=self.relation_fraction, public=self.public,
        )
        spec = make_spec(
            g.num_nodes, int(g.train_edges.shape[1]), max_degree=self.max_degree,
            expected_batch_size=self.expected_batch_size, neg_per_pos=self.neg_per_pos, privacy_unit=self.privacy_unit,
            steps_per_epoch=self.steps_per_epoch, max_overflow_probability=self.max_overflow_probability,
        )
        self.train_edges, self.train_inputs, self.capping_report = g.train_edges, g.train_inputs, g.capping
        self._test, self._val, self.held_out_test = g.test, g.val, g.held_out
        self.test_num_nodes, self.test_inputs = g.test.num_nodes, g.test.inputs
        self.eval_query, self.eval_target, self.eval_cands = g.test.query, g.test.target, g.test.cands
        self.stream = CoupledStream(self.train_edges, self.train_inputs, spec, self._randomness)
        if self._pending_state is not None:
            self.stream.load_state_dict(self._pending_state)
            self._pending_state = None
        self._spec = spec

    def match_encoder(self, encoder: Any) -> None:
        """Take a text encoder's own tokenizer when ``tokenizer`` is None; refuse one that cannot feed ``encoder``
        (:func:`~lightning_dprel.encoders.resolve_tokenizer`). Called by :meth:`setup` and by the CLI."""
        self.tokenizer = resolve_tokenizer(self.tokenizer, encoder)

    def _share_key(self) -> None:
        """Key the secret stream now with rank 0's key, replacing one this rank drew alone before DDP started."""
        if self._key_shared or not distributed():
            return
        self._randomness = sampling_randomness(None)
        self._randomness.key_now()  # broadcast from rank 0 now, all ranks in setup together
        if self.stream is not None:
            self.stream.randomness = self._randomness
        self._key_shared = True

    @property
    def sampling_spec(self) -> SamplingSpec:
        """The sampling facts for the accountant (m after capping, n, K, γ, k, b, steps per epoch)."""
        if self._spec is None:
            raise RuntimeError(
                "RelationalDataModule.sampling_spec is known only after setup(): call `dm.setup('fit')` first "
                "(the capped edge count m depends on the data)."
            )
        return self._spec

    @property
    def has_validation_graph(self) -> bool:
        """True when validation ranks a separate public graph (not the test queries); known after :meth:`setup`."""
        return self._val is not None

    def _live_stream(self) -> CoupledStream:
        self.sampling_spec  # noqa: B018 - raises a clear error before setup
        return self.stream

    # ---------------------------------------------------------------- loaders
    def train_dataloader(self) -> DataLoader:
        """Training loader: ``steps_per_epoch`` TupleBatches per epoch (never re-wrapped by Lightning)."""
        return StatefulLoader(TupleStream(self._live_stream(), self.world), self)

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
        ev = self._val if self._val is not None else self._test
        return DataLoader(RankingStream(ev, self.eval_batch_size, self.world), batch_size=None, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        """Test queries (RankingBatch) for PREC@1 / MRR on the test graph."""
        self.sampling_spec  # noqa: B018
        return DataLoader(RankingStream(self._test, self.eval_batch_size, self.world), batch_size=None, num_workers=0)

    # ------------------------------------------------------------ the stream
    def draw_global(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """Step ``step``'s global batch: positives [B, 2], negatives [B, k], anchors [B, k] (Algorithms 2-3)."""
        return self._live_stream().draw_global(step)

    def make_batch(self, pos: Tensor, neg: Tensor, anchor: Tensor, *, step: int, rank: int = 0,
                   world_size: int = 1) -> TupleBatch:
        """Rank ``rank``'s slice of a global batch, with max-freq counted on the whole global batch."""
        return self._live_stream().make_batch(pos, neg, anchor, step=step, rank=rank, world_size=world_size)

    def seek(self, epoch: int, index: int = 0) -> None:
        """Position the training stream at batch ``index`` of ``epoch`` (O(1): no replay)."""
        self._live_stream().seek(epoch, index)

    def state_dict(self) -> dict[str, Any]:
        """The stream's position after the last consumed batch: epoch, index and the KeyedStream's position. Holds no
        key and no seed material beyond the public ``seed`` and an explicit ``sampling_seed``: a secret key is only in
        memory."""
        state: dict[str, Any] = {"version": STATE_VERSION, "seed": self.seed}
        if self.stream is not None:
            state.update(self.stream.state_dict())
        elif self._pending_state is not None:
            state.update(self._pending_state)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at the saved position; the next ``iter()`` of the train loader continues from there."""
        if not state_dict or "seed" not in state_dict:
            raise ValueError("RelationalDataModule.load_state_dict got an empty state or one without `seed`.")
        if int(state_dict["seed"]) != self.seed:
            raise ValueError(
                f"the checkpoint's sampling stream was drawn with seed={state_dict['seed']}, this datamodule has "
                f"seed={self.seed}; resume with the same seed."
            )
        check_stream_state(state_dict, self._randomness)
        position = {k: state_dict[k] for k in ("epoch", "index", "spec", "stream") if k in state_dict}
        if self.stream is not None:
            self.stream.load_state_dict(position)
        else:
            self._pending_state = position
