"""What every private datamodule shares (the sampler side of Algorithm 3), whatever the method.

A :class:`PrivateDataModule` declares the :class:`~lightning_dprel.core.specs.PrivacyUnit` it samples for once, in its
``privacy_unit`` class attribute: every SamplingSpec it builds takes the unit from there (the ledger then refuses a
mechanism proven for another unit), and a ``sampling_spec`` that names another unit is refused when read. It warns
once when its batch randomness comes from a public seed, gives each DDP rank its share of a global batch, and versions
its saved state.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import torch.distributed as dist
from torch.utils.data import IterableDataset
from pytorch_lightning import LightningDataModule

from lightning_dprel.core.randomness import SEEDED_WARNING
from lightning_dprel.core.specs import PrivacyUnit, SamplingSpec, privacy_unit

__all__ = ["PrivateDataModule", "StepStream", "SteppedDataModule"]

T = TypeVar("T")


class PrivateDataModule(LightningDataModule):
    """Base of the private datamodules: declared unit, seeded-randomness warning, rank shares, versioned state.

    A concrete subclass sets :attr:`privacy_unit` (there is no default) and builds its SamplingSpecs with
    ``privacy_unit=self.privacy_unit``; its ``sampling_spec`` property is checked against the declaration.
    """

    #: The :class:`~lightning_dprel.core.specs.PrivacyUnit` (or its name) this datamodule samples for: the one
    #: declaration of its unit, read by every SamplingSpec it builds. No default: each datamodule states its own.
    privacy_unit: ClassVar[str | PrivacyUnit]
    #: The format of :meth:`state_dict`; a state of another version is refused with the reason.
    state_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "privacy_unit" in cls.__dict__:
            privacy_unit(cls.privacy_unit)  # a datamodule declares a known unit
        spec = cls.__dict__.get("sampling_spec")
        if isinstance(spec, property) and spec.fget is not None and not getattr(spec.fget, "checks_unit", False):
            cls.sampling_spec = property(_checked_unit(spec.fget), spec.fset, spec.fdel, spec.__doc__)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not hasattr(type(self), "privacy_unit"):
            raise TypeError(
                f"{type(self).__name__} declares no privacy unit: set the class attribute `privacy_unit` to the unit it "
                "samples for (a registered PrivacyUnit's name, e.g. 'entity'), the one place its SamplingSpecs read it from."
            )
        super().__init__(*args, **kwargs)

    @property
    def data_releases(self) -> tuple[tuple[str, Any], ...]:
        """Releases already made on this data ((id, event) pairs, e.g. a DP degree-cap estimate): they travel with the
        data, and whichever model trains on it is charged for each once (its ledger remembers the ids)."""
        return tuple(self.__dict__.get("_data_releases", ()))

    def record_release(self, event: Any) -> str:
        """Attach a release made on this data (charged to every model that trains on it, once); returns its id."""
        import os

        release_id = os.urandom(8).hex()
        self.__dict__.setdefault("_data_releases", []).append((release_id, event))
        return release_id

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


def _checked_unit(fget: Callable[[Any], SamplingSpec]) -> Callable[[Any], SamplingSpec]:
    """``fget`` (a ``sampling_spec`` getter), refusing a spec whose unit is not the datamodule's declared one."""

    @functools.wraps(fget)
    def sampling_spec(self: Any) -> SamplingSpec:
        spec = fget(self)
        declared = privacy_unit(type(self).privacy_unit).name
        if isinstance(spec, SamplingSpec) and spec.privacy_unit != declared:
            raise ValueError(
                f"{type(self).__name__}.sampling_spec is for the unit {spec.privacy_unit!r}, but the datamodule declares "
                f"{declared!r} (its `privacy_unit` class attribute). Build the SamplingSpec with "
                "privacy_unit=self.privacy_unit, or declare the unit the data is sampled for."
            )
        return spec

    sampling_spec.checks_unit = True  # type: ignore[attr-defined]
    return sampling_spec


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
