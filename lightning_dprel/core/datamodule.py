"""What every private datamodule shares (the sampler side of Algorithm 3), whatever the method.

A :class:`PrivateDataModule` declares the :class:`~lightning_dprel.core.specs.PrivacyUnit` it samples for (its
``sampling_spec`` carries it, and the ledger refuses a mechanism proven for another unit), warns once when its batch
randomness comes from a public seed, gives each DDP rank its share of a global batch, and versions its saved state.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import torch.distributed as dist
from torch.utils.data import IterableDataset
from pytorch_lightning import LightningDataModule

from lightning_dprel.core.randomness import SEEDED_WARNING
from lightning_dprel.core.specs import privacy_unit

__all__ = ["PrivateDataModule", "StepStream", "SteppedDataModule"]

T = TypeVar("T")


class PrivateDataModule(LightningDataModule):
    """Base of the private datamodules: declared unit, seeded-randomness warning, rank shares, versioned state."""

    #: The name of the :class:`~lightning_dprel.core.specs.PrivacyUnit` this datamodule samples for.
    privacy_unit: ClassVar[str] = "entity"
    #: The format of :meth:`state_dict`; a state of another version is refused with the reason.
    state_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        privacy_unit(cls.privacy_unit)  # a datamodule declares a known unit

    def warn_seeded(self, what: str) -> None:
        """Warn that ``what`` (a public seed) makes the batches reproducible and voids the guarantee."""
        warnings.warn(SEEDED_WARNING.format(what=what), UserWarning, stacklevel=3)

    def world(self) -> tuple[int, int]:
        """(rank, world size): the attached trainer's, else ``torch.distributed``'s, else (0, 1)."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return int(trainer.global_rank), int(trainer.world_size)
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def rank_share(self, items: Sequence[T]) -> list[T]:
        """This rank's share of a global batch's examples (the DP optimizer all-reduces the clipped sums)."""
        rank, world = self.world()
        return list(items[rank::world])

    def versioned(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with this datamodule's format version."""
        return {"version": self.state_version, **state}

    def check_version(self, state: Mapping[str, Any]) -> None:
        """Refuse a saved state of another format version (None: a state saved before versions, refused too)."""
        if not isinstance(state, Mapping) or state.get("version") != self.state_version:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(
                f"{type(self).__name__}: the saved state has format version {found!r}, this datamodule reads version "
                f"{self.state_version}; resume from a checkpoint of this version or start the sampling afresh."
            )


class StepStream(IterableDataset):
    """An epoch of a private datamodule's sampled steps: ``steps_per_epoch`` calls of its ``next_batch()`` (exact ``len``)."""

    def __init__(self, dm: Any) -> None:
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.sampling_spec.steps_per_epoch

    def __iter__(self):
        for _ in range(len(self)):
            yield self.dm.next_batch()


class SteppedDataModule(PrivateDataModule):
    """A private datamodule that draws step ``self._step``'s sample from the keyed ``self.stream``; its state resumes both."""

    def state_dict(self) -> dict[str, Any]:
        return self.versioned({"step": self._step, "stream": self.stream.state_dict()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_version(state)
        self._step = int(state["step"])
        self.stream.load_state_dict(state["stream"])
