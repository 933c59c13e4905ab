"""What may leave a private fit besides the noised release: logs, monitored metrics, validation on public data.

A value computed on a private batch without noise (a loss logged from any hook or callback) is not released: while the
trainer trains, :class:`TrainingLogGuard` drops a plain module's ``self.log`` / ``log_dict`` calls (kept, with a
warning, under ``log_private_metrics=True``), and refuses any training-time log of a metric that a scheduler,
``EarlyStopping`` or ``ModelCheckpoint`` monitors. A monitor with no validation loop to feed it is refused at fit start.
Validation data that shares rows with the training data is refused where the library can see it
(:func:`check_validation_disjoint`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["monitored_metrics", "refuse_training_monitors", "TrainingLogGuard",
           "check_validation_disjoint", "PUBLIC_METRICS"]

#: Metrics a private fit logs during training that are functions of public facts only (the privacy callback's).
PUBLIC_METRICS = frozenset({"epsilon", "delta", "noise_multiplier"})

_FIX = ("monitor a metric of a public validation set instead (log it in validation_step on a validation loader of "
        "public data, e.g. monitor='val_loss')")


def monitored_metrics(trainer: Any) -> list[tuple[str, str]]:
    """(who, metric) for every scheduler config and callback that monitors a logged metric (EarlyStopping,
    ModelCheckpoint, ReduceLROnPlateau, any callback with a ``monitor``; not one that scores public data itself and says
    so with ``monitors_public_data = True``, as :class:`~lightning_dprel.callbacks.ValidationSelection`)."""
    found = [(f"the lr scheduler {type(c.scheduler).__name__}", c.monitor)
             for c in trainer.lr_scheduler_configs if getattr(c, "monitor", None)]
    found += [(type(cb).__name__, cb.monitor) for cb in trainer.callbacks
              if isinstance(getattr(cb, "monitor", None), str) and not getattr(cb, "monitors_public_data", False)]
    return [(who, key) for who, key in found if key not in PUBLIC_METRICS]


def refuse_training_monitors(trainer: Any, validation_runs: Any) -> None:
    """Refuse, at fit start, a monitor that only training could feed: the fit has no validation loop
    (``validation_runs()`` says whether it has one)."""
    monitors = monitored_metrics(trainer)
    if monitors and not validation_runs():
        who, key = monitors[0]
        raise ValueError(
            f"{who} monitors {key!r}, but this private fit runs no validation, so {key!r} could only be computed on "
            f"private training batches without noise: the learning rate, the stop or the checkpoint would be a "
            f"non-private function of the data. Refused before training; {_FIX}."
        )


def _names(key: str) -> set[str]:
    return {key, f"{key}_step", f"{key}_epoch"}  # Lightning's names for on_step and on_epoch logs


class TrainingLogGuard:
    """``module.log`` / ``log_dict`` while the trainer trains: a monitored metric is refused; other logs are dropped,
    or kept when ``keep`` (``log_private_metrics=True``); validation and test logs pass (public data)."""

    def __init__(self, module: Any, trainer: Any, *, keep: bool) -> None:
        self.module, self.trainer, self.keep = module, trainer, bool(keep)
        self.monitored = {name: who for who, key in monitored_metrics(trainer) for name in _names(key)}
        self._log, self._log_dict = module.log, module.log_dict  # the module's own (bound)
        module.__dict__["log"], module.__dict__["log_dict"] = self.log, self.log_dict

    def _allowed(self, names: list[str]) -> bool:
        if not self.trainer.training:
            return True
        for name in names:
            if name in self.monitored:
                raise ValueError(
                    f"{type(self.module).__name__} logs {name!r} during training, and {self.monitored[name]} monitors "
                    f"it: it is computed on a private batch without noise, so the learning rate, the stop or the "
                    f"checkpoint it steers would be a non-private function of the data. Refused; {_FIX}."
                )
        return self.keep

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if self._allowed([name]):
            self._log(name, value, *args, **kwargs)

    def log_dict(self, dictionary: Any, *args: Any, **kwargs: Any) -> None:
        if self._allowed(list(dictionary)):
            self._log_dict(dictionary, *args, **kwargs)

    def remove(self) -> None:
        for key, mine in (("log", self.log), ("log_dict", self.log_dict)):
            if self.module.__dict__.get(key) == mine:
                del self.module.__dict__[key]


def _rows(dataset: Any) -> tuple[Any, set[int] | None]:
    """(the underlying dataset, the row indices used; None: all) through ``Subset`` wrappers."""
    from torch.utils.data import Subset

    rows = None
    while isinstance(dataset, Subset):
        idx = [int(i) for i in dataset.indices]
        rows = set(idx) if rows is None else {idx[i] for i in rows if i < len(idx)}
        dataset = dataset.dataset
    return dataset, rows


def _row_starts(t: Tensor) -> Tensor:
    """Storage offsets of the first element of each row (dimension 0) of ``t``."""
    import torch

    if t.dim() == 0:
        return torch.tensor([t.storage_offset()])
    return t.storage_offset() + torch.arange(t.shape[0]) * t.stride(0)


def _shared_tensor_rows(a: Any, b: Any) -> bool:
    """Whether two TensorDatasets hold views of the same rows of one tensor (``x[:800]`` and ``x[600:]``)."""
    import torch
    from torch.utils.data import TensorDataset

    if not (isinstance(a, TensorDataset) and isinstance(b, TensorDataset)):
        return False
    for s in a.tensors:
        for t in b.tensors:
            if s.numel() and t.numel() and s.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                    and bool(torch.isin(_row_starts(s), _row_starts(t)).any()):
                return True
    return False


def check_validation_disjoint(trainer: Any, train_dataset: Any) -> None:
    """Refuse validation loaders that read rows of the private training dataset: the same dataset object, overlapping
    ``Subset`` indices of one dataset, or TensorDatasets over overlapping memory of one tensor."""
    loaders = trainer.val_dataloaders
    loaders = [] if loaders is None else loaders if isinstance(loaders, (list, tuple)) else [loaders]
    train_base, train_rows = _rows(train_dataset)
    for loader in loaders:
        base, rows = _rows(getattr(loader, "dataset", None))
        if base is None:
            continue
        if base is train_base:
            shared = rows is None or train_rows is None or bool(rows & train_rows)
        else:
            shared = _shared_tensor_rows(base, train_base)
        if shared:
            raise ValueError(
                "The validation loader reads rows of the private training dataset (the same dataset object, "
                "overlapping Subset indices, or tensors sharing memory): validation metrics (and what they select or "
                "stop) would then be non-private functions of the training rows. Validate on a disjoint, public split. "
                "The library sees only these cases; a copy of the same rows, or one person with rows in both, is yours "
                "to rule out."
            )
