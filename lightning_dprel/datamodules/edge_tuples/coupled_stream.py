"""The training stream of coupled batches (Algorithm 3, lines 2-3, with Algorithm 2 NEG-SAMPLE-WOR).

:class:`CoupledStream` owns its randomness and its cursor, as PyG's link loader owns its sampler: step t's
global batch is drawn from two children of one :class:`~lightning_dprel.core.randomness.KeyedStream` (AES-256-CTR),
``child(t, "positives")`` and ``child(t, "negatives")``, so any step is drawn without replaying the earlier
ones and the cursor is just (epoch, index). The key is never saved: a resumed secret stream re-keys.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithms 1-3. NIST FIPS 202 (SHAKE-256), SP 800-38A (AES-CTR).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_dprel.datamodules.edge_tuples.graph_prep import NO_DEGREE_CAP, check_int
from lightning_dprel.datamodules.edge_tuples.rows import gather_rows, one_thread, slice_rows
from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq, neg_sample_wor, poisson_positives
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY, EdgeTuples, edge_tuples
from lightning_dprel.core.specs import SamplingSpec

__all__ = [
    "SAMPLING_TAG", "STATE_VERSION", "sampling_randomness", "make_spec", "CoupledStream", "check_stream_state",
    "TupleStream", "StatefulLoader",
]

#: The tag of the training stream's KeyedStream (step t uses ``SAMPLING_TAG/t/positives`` and ``/negatives``).
SAMPLING_TAG = "lightning_dprel/sampling"
#: Saved-state format 3: the position (epoch, index) and the KeyedStream's position; no key, no drawn seed.
STATE_VERSION = 3


def sampling_randomness(sampling_seed: int | None) -> KeyedStream:
    """The training stream's randomness: secret (``os.urandom`` key, rank 0's under DDP) unless a seed is given."""
    if sampling_seed is None:
        return KeyedStream.secret(SAMPLING_TAG)
    return KeyedStream.seeded(sampling_seed, SAMPLING_TAG, warn=False)  # the datamodule warns in its own words


def make_spec(
    num_nodes: int, num_edges: int, *, max_degree: int, expected_batch_size: float, neg_per_pos: int,
    steps_per_epoch: int | None, max_overflow_probability: float, privacy_unit: str = ENTITY.name,
) -> SamplingSpec:
    """The sampling facts for the accountant, refusing γ = b/m > 1 and a likely |E⁺|·k > n (Algorithm 2).

    ``privacy_unit``: the datamodule's declared unit (its class attribute); ``entity`` for the standalone settings."""
    n, m, b, k = num_nodes, num_edges, expected_batch_size, neg_per_pos
    capped = "capped " if max_degree < NO_DEGREE_CAP else ""
    if m < 1:
        raise ValueError(f"no training relations are left{' after degree capping; raise max_degree' if capped else ''}.")
    if b > m:
        raise ValueError(
            f"`expected_batch_size` (b={b:g}) exceeds the {m} {capped}training relations (gamma = b/m > 1); "
            f"lower expected_batch_size or use a larger graph{' / larger max_degree' if capped else ''}."
        )
    gamma = b / m
    if k > 0:
        from scipy.stats import binom

        limit = n // k  # |E+|·k <= n  ⟺  |E+| <= n // k
        tail = float(binom.sf(limit, m, gamma))
        if tail > max_overflow_probability:
            raise ValueError(
                f"NEG-SAMPLE-WOR needs |E+|*k <= n, but with m={m}, gamma={gamma:.3g}, k={k}, n={n} "
                f"P(|E+| > {limit}) = {tail:.3g} > max_overflow_probability={max_overflow_probability:g}; "
                "lower expected_batch_size or neg_per_pos (or use a graph with more nodes)."
            )
    steps = steps_per_epoch if steps_per_epoch is not None else math.ceil(1.0 / gamma)
    return SamplingSpec(
        population=m, contribution_bound=max_degree, sampling_rate=gamma, expected_batch_size=b,
        steps_per_epoch=steps, privacy_unit=privacy_unit,
        detail=EdgeTuples(num_nodes=n, neg_per_pos=k),
    )


class CoupledStream:
    """Per step: E⁺ ~ Poisson(Ē, γ), then NEG-SAMPLE-WOR; each step a :class:`TupleBatch` (Algorithms 2-3).

    Args:
        edges: ``[2, m]`` capped training relations.
        inputs: cached per-node encoder inputs (``x`` or ``input_ids``/``attention_mask``).
        spec: the :class:`SamplingSpec` (m, n, γ, k, b, steps per epoch).
        randomness: the stream's :class:`KeyedStream` (see :func:`sampling_randomness`).
    """

    def __init__(self, edges: Tensor, inputs: dict[str, Tensor], spec: SamplingSpec, randomness: KeyedStream) -> None:
        self.edges, self.inputs, self.spec, self.randomness = edges, inputs, spec, randomness
        self.epoch, self.index = 0, 0  # the next batch handed out is (epoch, index)
        self._pending: dict[str, Any] | None = None

    # ------------------------------------------------------------------ drawing
    def draw_global(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """Step ``step``'s global batch: positive edges [B, 2], negatives [B, k], anchors [B, k].

        Positives and negatives come from two children of the key, so the negatives depend on the positives
        only through their count (Algorithm 2 never sees them); every rank draws the same global batch.
        """
        spec, tuples = self.spec, edge_tuples(self.spec)
        positives = self.randomness.child(step, "positives")
        idx = poisson_positives(spec.population, spec.sampling_rate, generator=positives)
        if idx.numel() * tuples.neg_per_pos > tuples.num_nodes:
            raise RuntimeError(
                f"this step drew |E+|={idx.numel()} positives and "
                f"|E+|*k={idx.numel() * tuples.neg_per_pos} exceeds n={tuples.num_nodes}: "
                "NEG-SAMPLE-WOR is impossible and the batch is never truncated; lower "
                "expected_batch_size or neg_per_pos (or max_overflow_probability)."
            )
        negatives = self.randomness.child(step, "negatives")
        k, n = tuples.neg_per_pos, tuples.num_nodes
        neg, anchor = neg_sample_wor(idx.numel(), k, n, generator=negatives)
        return self.edges.index_select(1, idx).t().contiguous(), neg, anchor

    def make_batch(
        self, pos: Tensor, neg: Tensor, anchor: Tensor, *, step: int, rank: int = 0, world_size: int = 1
    ) -> TupleBatch:
        """Rank ``rank``'s slice of a global batch, with max-freq counted on the whole global batch (Algorithm 1)."""
        freq = max_freq(pos, neg)  # before slicing
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
            node_inputs=gather_rows(self.inputs, node_ids),  # full max_length width: tuples stay independent
            expected_batch_size=self.spec.expected_batch_size,
            global_size=int(pos.shape[0]),
            step=step,
        )

    def batches(self, rank: int = 0, world_size: int = 1) -> Iterator[TupleBatch]:
        """The rest of the current epoch from the cursor (the next epoch if this one is done).

        The cursor moves when a batch is handed out. Lightning 2.x does not prefetch from a sized loader
        (``_PrefetchDataFetcher`` skips pre-fetching when the length is known), so at a checkpoint the cursor
        sits right after the last batch the trainer consumed.
        """
        self._apply_pending()
        steps = self.spec.steps_per_epoch
        epoch, start = (self.epoch + 1, 0) if self.index >= steps else (self.epoch, self.index)

        def stream() -> Iterator[TupleBatch]:
            for index in range(start, steps):
                step = epoch * steps + index
                with one_thread():
                    batch = self.make_batch(*self.draw_global(step), step=step, rank=rank, world_size=world_size)
                self.epoch, self.index = epoch, index + 1
                yield batch

        return stream()

    # ------------------------------------------------------------------ position
    def seek(self, epoch: int, index: int = 0) -> None:
        """Put the cursor at batch ``index`` of ``epoch`` (O(1): step t's batch depends only on the key and t)."""
        check_int("epoch", epoch, 0)
        check_int("index", index, 0)
        if index > self.spec.steps_per_epoch:
            raise ValueError(f"`index` must be <= steps_per_epoch={self.spec.steps_per_epoch}, got {index}.")
        self._pending, self.epoch, self.index = None, epoch, index

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "index", "spec": [m, steps_per_epoch], "stream": KeyedStream.state_dict()}``: no key."""
        if self._pending is not None:
            return dict(self._pending)
        return {
            "epoch": self.epoch,
            "index": self.index,
            "spec": [self.spec.population, self.spec.steps_per_epoch],
            "stream": self.randomness.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the saved position; the (m, steps) check runs at the next :meth:`batches`."""
        check_stream_state(state, self.randomness)
        self._pending = {key: state[key] for key in ("epoch", "index", "spec", "stream") if key in state}

    def _apply_pending(self) -> None:
        if self._pending is None:
            return
        saved, now = self._pending.get("spec"), (self.spec.population, self.spec.steps_per_epoch)
        if saved is not None and tuple(saved) != now:
            raise ValueError(
                f"the checkpoint's sampling stream had (m, steps_per_epoch) = {tuple(saved)}, this datamodule has "
                f"{now}; resume with the same graph, capping and batch options."
            )
        pending, self._pending = self._pending, None
        if "stream" in pending:
            self.randomness.load_state_dict(pending["stream"])
        self.epoch, self.index = int(pending.get("epoch", 0)), int(pending.get("index", 0))


def check_stream_state(state: Mapping[str, Any], randomness: KeyedStream) -> None:
    """Refuse an older state format, or a stream drawn with another ``sampling_seed`` setting (a secret one holds
    no key to reuse)."""
    if "version" in state and state["version"] != STATE_VERSION:
        raise ValueError(
            f"the checkpoint's sampling stream has state version {state['version']}, this datamodule reads version "
            f"{STATE_VERSION}: the training batches now come from a keyed CSPRNG (issue 11) and cannot continue a "
            "torch-generator stream. Resume from a newer checkpoint or start a new run."
        )
    saved = state.get("stream")
    if saved is None:
        return
    if saved.get("tag") != randomness.tag or saved.get("seed") != randomness.seed:
        was = "secret (sampling_seed=None)" if saved.get("seed") is None else f"sampling_seed={saved.get('seed')}"
        now = "secret (sampling_seed=None)" if randomness.seed is None else f"sampling_seed={randomness.seed}"
        raise ValueError(
            f"the checkpoint's training batches were drawn with {was}, this datamodule's with {now}; resume with "
            "the same sampling_seed (a secret stream's key is never saved, so a resumed secret run draws fresh batches)."
        )


class TupleStream(IterableDataset):
    """The training dataset: the rest of the current epoch of a :class:`CoupledStream` per ``iter()``."""

    def __init__(self, stream: CoupledStream, world: Callable[[], tuple[int, int]]) -> None:
        self.stream, self.world = stream, world

    def __len__(self) -> int:
        return self.stream.spec.steps_per_epoch

    def __iter__(self) -> Iterator[TupleBatch]:
        return self.stream.batches(*self.world())


class StatefulLoader(DataLoader):
    """A DataLoader whose position Lightning saves and restores through ``owner`` (exact mid-epoch resumes)."""

    def __init__(self, dataset: IterableDataset, owner: Any) -> None:
        super().__init__(dataset, batch_size=None, num_workers=0)
        self._owner = owner

    def state_dict(self) -> dict[str, Any]:
        return self._owner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._owner.load_state_dict(state_dict)
