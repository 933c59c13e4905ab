"""A user's data code run on each example alone, before the private step (DP-SGD, Abadi et al. 2016, Alg. 1).

Per-example clipping bounds one example's effect only if each row of the batch depends on its own example. A user's
``collate_fn`` (in :class:`~lightning_dprel.datamodules.poisson.DPDataLoader`) and overridden batch hooks
(``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_batch_transfer``, of the module or the
datamodule) could mix them, e.g. normalising by the batch's mean or mixup. :class:`PerExampleCollate` and
:func:`per_example_batch_hooks` run that code on each example alone and concatenate the results, so the batch is
per-example by construction; the first batch of two or more examples is also passed whole, and code whose whole-batch
result differs (it mixes examples, or draws randomness per call) is refused with the fix named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from lightning_dprel.core.example_views import TensorRows, tree_map

__all__ = ["concat_examples", "same_batch", "PerExampleCollate", "per_example_batch_hooks", "BATCH_HOOKS", "BatchSeal"]

BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")

_MIXES = (
    "{what} gives a different batch when it runs on the whole batch than on each example alone: it mixes examples "
    "(normalising with the batch's statistics, mixup, padding to the batch's longest row) or draws randomness per "
    "call. DP-SGD clips each example alone, so each row of the batch must depend on its own example only. Move "
    "per-example transforms into the Dataset's __getitem__ (or a transform applied to each example), and compute "
    "normalisation constants on public data before training."
)


def concat_examples(parts: list[Any], what: str = "collate_fn", shared: tuple[str, ...] = ()) -> Any:
    """Batches of one (the same structure each) concatenated along the example dimension; a ``shared`` key (the view's
    public per-step tensors) must come back equal from every example and is kept once."""
    first = parts[0]
    if shared and isinstance(first, Mapping):
        for k in shared:
            if k in first and not all(same_batch(p[k], first[k]) for p in parts):
                raise ValueError(f"{what} changed the shared public key {k!r} differently for different examples: it is "
                                 "the same for every example of a step and may not depend on one example's data.")
        return type(first)({k: first[k] if k in shared else concat_examples([p[k] for p in parts], what) for k in first})
    if isinstance(first, Tensor):
        if first.dim() == 0 or any(p.shape[1:] != first.shape[1:] for p in parts):
            raise ValueError(
                f"{what} returned tensors without a leading example dimension, or whose shapes differ between examples "
                f"({[tuple(p.shape) for p in parts[:3]]}...): a private batch is its examples' rows stacked. Pad to a "
                "fixed length in the Dataset, and keep batch-level values in the module."
            )
        return torch.cat(parts, 0)
    if isinstance(first, Mapping):
        return type(first)({k: concat_examples([p[k] for p in parts], what) for k in first})
    if isinstance(first, (list, tuple)):
        if all(not isinstance(v, (Tensor, Mapping, list, tuple)) for p in parts for v in p):  # per-example values
            return type(first)(v for p in parts for v in p)
        fields = [concat_examples([p[i] for p in parts], what) for i in range(len(first))]
        return type(first)(*fields) if hasattr(first, "_fields") else type(first)(fields)
    if all(p == first for p in parts):
        return first
    raise ValueError(f"{what} returned a {type(first).__name__} that differs between examples; return tensors with one "
                     "row per example.")


def same_batch(a: Any, b: Any) -> bool:
    """Whether two batches hold the same structure and values (floats to 1e-5 relative)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # an object without a truth value for ==
        return False


_RANDOM = (
    "{what} draws randomness: it runs on each example alone, so each example draws its own (an augmentation per example "
    "is kept as it is; one that mixes examples, such as mixup, does nothing to a batch of one)."
)


def _copy(tree: Any) -> Any:
    return tree_map(lambda t: t.clone(), tree)


def check_per_example(run: Callable[[Any], Any], whole: Any, one: Any, stacked: Any, what: str) -> None:
    """Refuse code whose result on the whole batch differs from its per-example results stacked, unless it draws
    randomness (run twice on one example, it differs: its per-example results are still each example's own, warned).
    Each run gets a copy (code that edits its input in place runs on fresh data)."""
    import warnings

    if same_batch(run(_copy(whole)), stacked):
        return
    if not same_batch(run(_copy(one)), run(_copy(one))):
        warnings.warn(_RANDOM.format(what=what), UserWarning, stacklevel=3)
        return
    raise ValueError(_MIXES.format(what=what))


class PerExampleCollate:
    """``collate_fn`` on each example alone, the results concatenated; the first batch of ≥ 2 is checked whole."""

    def __init__(self, collate_fn: Callable[[list], Any]) -> None:
        self.collate_fn, self.checked = collate_fn, False

    def __call__(self, items: list) -> Any:
        batch = concat_examples([self.collate_fn([item]) for item in items])
        if not self.checked and len(items) >= 2:
            check_per_example(self.collate_fn, list(items), [items[0]], batch,
                              f"Your collate_fn ({_name(self.collate_fn)})")
            self.checked = True
        return batch


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


class _PerExampleHook:
    """One overridden batch hook, run on each example alone while the trainer trains (public batches: whole)."""

    def __init__(self, owner: Any, name: str, trainer: Any, view: Any) -> None:
        self.owner, self.name, self.trainer, self.view = owner, name, trainer, view
        self.hook, self.checked = getattr(owner, name), False
        self.__wrapped__ = self.hook  # Lightning's is_overridden still sees the user's hook

    def __call__(self, batch: Any, *args: Any) -> Any:
        if not self.trainer.training or not self.view.size(batch):
            return self.hook(batch, *args)
        examples = [_copy(ex) for ex in self.view.examples(batch)]  # the hook may edit its input in place
        out = concat_examples([self.hook(ex, *args) for ex in examples], self.name, getattr(self.view, "shared", ()))
        if not self.checked and len(examples) >= 2:
            check_per_example(lambda b: self.hook(b, *args), batch, examples[0], out,
                              f"{type(self.owner).__name__}.{self.name}")
            self.checked = True
        return out


def per_example_batch_hooks(trainer: Any, module: Any, view: Any) -> Callable[[], None]:
    """Run the batch hooks the module or datamodule overrides on each example alone (rows views); refuse them for
    views whose examples are not rows. Returns a function that restores them."""
    from pytorch_lightning.utilities.model_helpers import is_overridden

    wrapped = []
    for name in BATCH_HOOKS:
        dm = trainer.datamodule
        owner = dm if dm is not None and is_overridden(name, dm) else module if is_overridden(name, module) else None
        if owner is None:
            continue
        if not isinstance(view, TensorRows):
            raise ValueError(
                f"{type(owner).__name__}.{name} runs on the whole private batch before the per-example step, and the "
                f"examples of this batch ({type(view).__name__}) are not rows it could run on one at a time. Remove "
                "the override: the library's sampler builds and moves these batches; transform examples in the data."
            )
        owner.__dict__[name] = _PerExampleHook(owner, name, trainer, view)
        wrapped.append((owner, name))

    def restore() -> None:
        for owner, name in wrapped:
            owner.__dict__.pop(name, None)
    return restore


def _batch_tensors(tree: Any, path: str = "batch") -> Iterator[tuple[str, Tensor]]:
    """Every tensor of a batch with its path (through mappings, sequences and PyG ``Data``'s ``to_dict``)."""
    if isinstance(tree, Tensor):
        yield path, tree
    elif isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _batch_tensors(v, f"{path}[{k!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _batch_tensors(v, f"{path}[{i}]")
    elif callable(getattr(tree, "to_dict", None)):
        yield from _batch_tensors(tree.to_dict(), path)


class BatchSeal:
    """The private batch as Lightning handed it to the batch-start hooks (the privacy callback's run first): checked
    unchanged before the release, so a hook or callback that rewrites it from the whole batch (mixup, centring) is
    refused; each example's data is transformed on its own only in the collate and the batch hooks."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.copies = {p: t.detach().clone() for p, t in _batch_tensors(batch)}

    def changed(self) -> list[str]:
        """Paths of the batch's tensors that differ from what was sealed (or appeared or went)."""
        now = dict(_batch_tensors(self.batch))
        return sorted(p for p in now.keys() | self.copies.keys() if p not in now or p not in self.copies
                      or now[p].shape != self.copies[p].shape or not torch.equal(now[p], self.copies[p]))

    def verify(self, who: str) -> None:
        changed = self.changed()
        if changed:
            raise ValueError(
                f"The private batch was changed after it was sampled and before its release ({changed[:3]}), by "
                f"{who}'s on_train_batch_start, a callback's, or the step itself. Such a change can read the whole "
                "batch (mixup, centring by the batch's mean), which per-example clipping cannot bound. Transform "
                "examples in the Dataset, a collate_fn or a batch hook (on_after_batch_transfer): those run on each "
                "example alone. Refused before the release."
            )
