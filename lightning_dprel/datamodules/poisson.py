"""Poisson sampling of a user's dataset for example-level DP-SGD (Abadi et al. 2016, Alg. 1; Mironov et al. 2019).

:class:`DPDataLoader` replaces a ``DataLoader(dataset, batch_size=b, shuffle=True)``: every step keeps each row
independently with probability q = b/N, drawn from the secret keyed stream (never replayed; a seed makes it
reproducible for tests and warns). A user's ``collate_fn`` runs on each example alone (:class:`PerExampleCollate`).
Under DDP every rank draws the same global sample and keeps its share, so the
clipped sums the DP optimizer all-reduces are the global batch's. It states its :attr:`sampling_spec` (unit
``example``: one row, add/remove) and its :attr:`example_view` for the privacy callback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from lightning_dprel.accounting.mechanisms.banded import CyclicPoisson
from lightning_dprel.core.checks import check_int
from lightning_dprel.core.example_views import TensorRows, empty_like_rows
from lightning_dprel.core.per_example_data import PerExampleCollate
from lightning_dprel.core.randomness import SEEDED_WARNING, KeyedStream
from lightning_dprel.core.specs import EXAMPLE, SamplingSpec

__all__ = ["DPDataLoader", "PoissonSampledBatches"]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class PoissonSampledBatches(IterableDataset):
    """An epoch of ⌈N/b⌉ Poisson samples of ``dataset`` at rate q = b/N, collated (this rank's share under DDP).

    With ``partitions`` P (cyclic Poisson, b-min-sep; Choquette-Choo et al. 2023, Section 4): row i is in partition
    i mod P (its index is its identity), draw t samples partition t mod P at rate p = b/⌈N/P⌉, so a row takes part
    only in draws P apart; an epoch is P·⌈1/p⌉ draws."""

    def __init__(self, dataset: Dataset, expected_batch_size: float, collate_fn: Callable[[list], Any],
                 stream: KeyedStream, partitions: int | None = None) -> None:
        self.dataset, self.collate_fn, self.stream = dataset, collate_fn, stream
        self.num_examples = check_int("len(dataset)", len(dataset), 1)  # type: ignore[arg-type]
        self.partitions = None if partitions is None else check_int("partitions", partitions, 1)
        if self.partitions is not None and self.partitions > self.num_examples:
            raise ValueError(f"`partitions` must be at most N = {self.num_examples}, got {self.partitions}.")
        self.population = math.ceil(self.num_examples / (self.partitions or 1))  # the rows one draw samples from
        b = float(expected_batch_size)
        if not 0.0 < b <= self.population:
            rows = f"N = {self.num_examples}" if self.partitions is None else f"⌈N/P⌉ = {self.population}, P = {self.partitions}"
            raise ValueError(f"`batch_size` (the expected batch size b) must be in (0, {rows}], got {b}.")
        self.expected_batch_size, self.sampling_rate = b, b / self.population
        self.draws = 0  # samples drawn so far: the stream's path, so no (key, path) pair is ever drawn twice
        #: A TensorDataset with the default collate: index its tensors at once (picklable, for ddp_spawn).
        self.indexes_tensors = isinstance(dataset, TensorDataset) and collate_fn is default_collate

    def __len__(self) -> int:
        return math.ceil(1.0 / self.sampling_rate) * (self.partitions or 1)

    def indices(self, draw: int) -> torch.Tensor:
        """The global sample of draw ``draw``: each row (of partition ``draw`` mod P, if partitioned) kept with
        probability q."""
        kept = self.stream.child(draw, "rows").uniform(self.num_examples) < self.sampling_rate
        if self.partitions is not None:
            kept &= torch.arange(self.num_examples) % self.partitions == draw % self.partitions
        return torch.nonzero(kept).view(-1)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(len(self)):
            draw, self.draws = self.draws, self.draws + 1
            rank, world = _world()
            rows = self.indices(draw)[rank::world]
            if self.indexes_tensors:
                yield [t[rows] for t in self.dataset.tensors]
            elif rows.numel():
                yield self.collate_fn([self.dataset[i] for i in rows.tolist()])
            else:  # an empty sample is a real step: noise is still released
                yield empty_like_rows(self.collate_fn([self.dataset[0]]))


class DPDataLoader(DataLoader):
    """A ``DataLoader`` whose batches are Poisson samples at rate b/N from the keyed stream (unit: one example).

    Args:
        dataset: a map-style dataset of N examples, one per privacy unit (one person's row).
        batch_size: b, the *expected* batch size (q = b/N); the private step divides by b.
        collate_fn: as ``DataLoader``'s (default: ``default_collate``). Another collate runs on each example alone and
            the results are concatenated (each row its own example's); one whose whole-batch result differs (it mixes
            examples: batch normalisation, mixup) is refused at the first batch.
        seed: None (default: secret key from the OS) or a public seed (reproducible, voids the guarantee, warns).
        pin_memory: as ``DataLoader``'s.
        partitions: P for cyclic Poisson (b-min-sep) sampling, which banded correlated noise needs
            (``PrivacyCallback(noise="banded", bands=P)``): row i in partition i mod P, draw t samples partition t mod P;
            ``batch_size`` is then the expected batch of one draw. None (default): plain Poisson over all rows.

    Example::

        loader = DPDataLoader(TensorDataset(x, y), batch_size=64)   # was DataLoader(..., batch_size=64, shuffle=True)
    """

    def __init__(self, dataset: Dataset, batch_size: float, *, collate_fn: Callable[[list], Any] | None = None,
                 seed: int | None = None, pin_memory: bool = False, partitions: int | None = None, **kwargs: Any) -> None:
        bad = sorted(k for k in kwargs if k not in ("batch_sampler", "sampler", "shuffle", "num_workers", "drop_last"))
        if bad:
            raise TypeError(f"DPDataLoader got unexpected arguments {bad}.")
        given = {k: v for k, v in kwargs.items() if v not in (None, False, 0)}
        if given:
            raise ValueError(
                f"DPDataLoader draws its own Poisson samples; it refuses {sorted(given)} (a fixed-size, shuffled or "
                "worker-split sampler is not what the accountant charges). Pass only the dataset and batch_size = b."
            )
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError("DPDataLoader needs a map-style dataset with a length (one row per privacy unit).")
        if seed is not None:
            import warnings

            warnings.warn(SEEDED_WARNING.format(what=f"DPDataLoader(seed={seed})"), UserWarning, stacklevel=2)
        stream = KeyedStream.secret("poisson_rows") if seed is None else KeyedStream.seeded(seed, "poisson_rows", warn=False)
        collate = default_collate if collate_fn in (None, default_collate) else PerExampleCollate(collate_fn)
        self.batches = PoissonSampledBatches(dataset, batch_size, collate, stream, partitions)
        super().__init__(self.batches, batch_size=None, pin_memory=pin_memory)
        self.example_view = TensorRows()

    def __len__(self) -> int:
        """Steps per epoch, ⌈N/b⌉ (no workers split the stream, so torch's length caveat does not apply)."""
        return len(self.batches)

    @property
    def sampling_spec(self) -> SamplingSpec:
        """What the accountant charges: Poisson rate q = b/N over N examples, one per unit (K = 1, no negatives); with
        partitions, rate p over the largest partition and the :class:`CyclicPoisson` detail."""
        n, s = self.batches.num_examples, self.batches
        detail = None if s.partitions is None else CyclicPoisson(s.partitions)
        return SamplingSpec(population=s.population, sampling_rate=s.sampling_rate,
                            expected_batch_size=s.expected_batch_size, steps_per_epoch=len(s),
                            privacy_unit=EXAMPLE, num_units=n, detail=detail)
