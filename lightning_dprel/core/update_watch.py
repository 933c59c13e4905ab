"""Parameters that moved without a charged release: detected every step, charged as unprotected (ε = ∞), refused.

A DP-SGD fit's parameters may change only by a DP optimizer's step (whose release the ledger charges) or by an update
declared public (:func:`public_update`: a warm start or a step on public data, post-processing of released values).
The watch keeps the parameters as they stood after the last such change and compares them at every batch start and
before every release: any other movement (a plain optimizer, ``p.data -= …``, a module that fakes the facts it is
asked for) is an update no private step charged. State kept outside parameters and buffers is watched the same way
(:func:`module_state`): every tensor, array, number or string in a plain attribute of the module or a submodule,
through sequences, mappings, sets and the user's own objects, and the optimizers' hyper-parameters; so a value set
from a private batch in a hook and read by a later step is caught wherever it was set. A torchmetrics metric updated
in training is a training log: reset at the next check. The batch itself is sealed at batch start and checked at the
release (:class:`~lightning_dprel.core.per_example_data.BatchSeal`).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from collections.abc import Hashable, Iterator, Mapping, Sequence, Set as AbstractSet
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_dprel.core.events import StepRecord
from lightning_dprel.core.per_example_data import BatchSeal

__all__ = ["UpdateWatch", "public_update", "declare_public", "module_state", "optimizer_state"]

_OWN = "_lightning_dprel"  # the prefix of what the library keeps on a module (its ledger, this watch): not user state
_WATCH = f"{_OWN}_update_watch"
_DEPTH = 3  # containers and objects followed this deep
_BIG = 1024  # a container with more items is watched by its type, length and identity only
_SCALARS = (Tensor, np.ndarray, np.generic, numbers.Number, str, bytes)  # bools are numbers
#: Packages whose objects a module may hold (a tokenizer, an optimizer, the library's own): never the user's data.
_LIBRARIES = frozenset({"lightning_dprel", "torch", "pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics",
                        "torch_geometric", "transformers", "tokenizers", "peft", "numpy", "scipy", "safetensors"})


def _user_object(value: Any) -> bool:
    """An instance of the user's own class (a helper holding state, a dataclass): its attributes are followed."""
    return (hasattr(value, "__dict__") and not isinstance(value, (type, nn.Module)) and not callable(value)
            and type(value).__module__.split(".")[0] not in _LIBRARIES)


def _leaves(name: str, value: Any, out: dict[str, Any], depth: int = 0) -> None:
    """The watched leaves of one attribute: tensors, arrays, numbers and strings, through sequences, mappings, sets and
    the user's own objects (whose length, keys or attribute names are watched too)."""
    if isinstance(value, _SCALARS):
        out[name] = value
    elif depth >= _DEPTH or value is None:
        return
    elif isinstance(value, (Sequence, Mapping, AbstractSet)):
        if len(value) > _BIG:
            out[f"{name}#big"] = (type(value).__name__, len(value), id(value))
        elif isinstance(value, AbstractSet):
            out[name] = frozenset(v if isinstance(v, Hashable) and not isinstance(v, Tensor) else id(v) for v in value)
        else:
            items = list(value.items()) if isinstance(value, Mapping) else list(enumerate(value))
            out[f"{name}#keys"] = (type(value).__name__, tuple(repr(k) for k, _ in items))
            for k, v in items:
                _leaves(f"{name}[{k!r}]", v, out, depth + 1)
    elif _user_object(value):
        out[f"{name}#keys"] = (type(value).__name__, tuple(vars(value)))
        for k, v in vars(value).items():
            _leaves(f"{name}.{k}", v, out, depth + 1)


@functools.lru_cache(maxsize=None)
def _framework_keys(cls: type) -> frozenset[str]:
    """Attribute names nn.Module (and LightningModule) keep for themselves: hooks, flags, the trainer; never the user's
    data. A user's own attribute, with or without a leading underscore, is not among them."""
    keys = set(vars(nn.Module()))
    try:
        from pytorch_lightning import LightningModule

        if issubclass(cls, LightningModule):
            keys |= set(vars(LightningModule()))
    except ImportError:  # pragma: no cover - a dependency
        pass
    return frozenset(keys)


def _metric_class() -> type | None:
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - a dependency of Lightning
        return None
    return Metric


def module_state(module: nn.Module) -> tuple[dict[str, Tensor], dict[str, Any], list[nn.Module]]:
    """(parameters and buffers by name, as ``named_parameters`` names them; the tensors, arrays, numbers and strings
    held in plain attributes of ``module`` and its submodules; its torchmetrics metrics), in one pass over the modules.
    A metric's state is not in the plain state: :class:`UpdateWatch` resets what training accumulated in it."""
    metric = _metric_class()
    tensors: dict[str, Tensor] = {}
    plain: dict[str, Any] = {}
    metrics: list[nn.Module] = []
    seen: set[int] = set()
    for prefix, m in module.named_modules():
        pre = f"{prefix}." if prefix else ""
        for slot in (m._parameters, m._buffers):
            for k, t in slot.items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    tensors[pre + k] = t
        if metric is not None and isinstance(m, metric):
            metrics.append(m)
            continue
        skip = _framework_keys(type(m))
        for key, value in m.__dict__.items():
            if key not in skip and not key.startswith(_OWN):
                _leaves(pre + key, value, plain)
    return tensors, plain, metrics


def optimizer_state(optimizers: list[Any]) -> dict[str, Any]:
    """Every optimizer's hyper-parameters (each param group's entries but its parameters): a learning rate set from a
    private loss in a hook steers every later update."""
    return {f"optimizer[{i}].param_groups[{j}].{k}": v for i, opt in enumerate(optimizers)
            for j, group in enumerate(opt.param_groups) for k, v in group.items() if k != "params"}


def _snapshot(value: Any) -> Any:
    try:
        if isinstance(value, Tensor):
            return value.detach().clone()
        return np.copy(value) if isinstance(value, np.ndarray) else value
    except RuntimeError:  # a tensor that escaped a transform (vmap): unreadable, so it never compares equal
        return _UNREADABLE


_UNREADABLE = object()


def _same(a: Any, b: Any) -> bool:
    if a is _UNREADABLE or b is _UNREADABLE:
        return False
    try:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype \
                and bool(torch.equal(a.detach(), b.detach()))
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return bool(np.array_equal(a, b, equal_nan=True))
        return a == b or (a != a and b != b)  # NaN floats equal
    except RuntimeError:
        return False


def declare_public(module: nn.Module, owner: Any, name: str) -> Any:
    """Run ``owner.<name>`` (a hook of a callback or of the module) inside :func:`public_update` from now on; returns a
    function that gives the hook back. For the updates Lightning's own schedulers and callbacks make from public facts
    (a scheduler's step, SWA's learning rate, a fine-tuning callback's new parameter group)."""
    original = getattr(owner, name)

    def hook(*args: Any, **kwargs: Any) -> Any:
        with public_update(module):
            return original(*args, **kwargs)

    hook.__wrapped__ = original  # Lightning's is_overridden still sees the original
    owner.__dict__[name] = hook
    return lambda: owner.__dict__.pop(name, None)


@contextlib.contextmanager
def public_update(module: nn.Module) -> Iterator[None]:
    """Declare the body's updates of ``module`` public: they read public data or released values only (post-processing),
    so no release is charged; the watch takes the state after them as its new base. What moved before the body is
    checked first (it is not declared by it)."""
    watch = module.__dict__.get(_WATCH)
    if watch is not None:
        watch.check(type(module).__name__)
    try:
        yield
    finally:
        watch = module.__dict__.get(_WATCH)
        if watch is not None:
            watch.rebase()


class UpdateWatch:
    """The parameters, buffers and plain attributes (:func:`module_state`) after the last charged (or public)
    update of ``module``, checked before every release, at every batch's start, before validation and at the end of training."""

    def __init__(self, module: nn.Module, ledger: Any, *, reset_metrics: bool = True) -> None:
        self.module, self.ledger, self.reset_metrics = module, ledger, bool(reset_metrics)
        self.base: dict[str, Tensor] = {}
        self.plain: dict[str, Any] = {}
        self.counts: dict[int, int] = {}  # each metric's updates at the base
        self.inner: list[Any] = []  # the optimizers whose hyper-parameters are watched
        self._seal: BatchSeal | None = None
        self.optimizers: list[Any] = []
        self.on_close: list[Any] = []  # functions that undo what was attached for this watch
        module.__dict__[_WATCH] = self
        self.rebase()

    def _plain(self, plain: dict[str, Any]) -> dict[str, Any]:
        return {**plain, **optimizer_state(self.inner)}

    def rebase(self, *, plain_only: bool = False) -> None:
        """Take the state as it is now as the base (after a charged release or a public update); with ``plain_only``,
        only the plain attributes and the metrics' counts (after validation on public data)."""
        now, plain, metrics = module_state(self.module)
        self.plain = {k: _snapshot(v) for k, v in self._plain(plain).items()}
        self.counts = {id(m): int(getattr(m, "_update_count", 0)) for m in metrics}
        if plain_only:
            return
        with torch.no_grad():
            if now.keys() == self.base.keys() and all(self.base[n].shape == t.shape and self.base[n].dtype == t.dtype
                                                      for n, t in now.items()):
                for n, t in now.items():  # copied into the same buffers: no allocation per step
                    self.base[n].copy_(t)
            else:
                self.base = {n: t.detach().clone() for n, t in now.items()}

    def after_release(self, record: Any) -> None:
        """A DP optimizer's step hook: the update it just applied is charged."""
        self.rebase()

    def _forget_training_metrics(self, metrics: list[nn.Module]) -> None:
        """A metric updated on private batches since the base is a training log: reset, so nothing it accumulated
        reaches a later step (kept under ``log_private_metrics=True``, outside the guarantee)."""
        for m in metrics:
            count = int(getattr(m, "_update_count", 0))
            if count != self.counts.get(id(m), 0) and count and self.reset_metrics:
                m.reset()
            self.counts[id(m)] = int(getattr(m, "_update_count", 0))

    def moved(self) -> list[str]:
        """Names of the parameters, buffers, plain attributes and optimizer hyper-parameters that differ from the base
        (or appeared or went)."""
        tensors, now, metrics = module_state(self.module)
        self._forget_training_metrics(metrics)
        now = self._plain(now)
        moved = sorted(tensors.keys() ^ self.base.keys())
        moved += [n for n, t in tensors.items() if n in self.base and not _same(t, self.base[n])]
        changed = sorted({k for k in now.keys() ^ self.plain.keys()}
                         | {k for k in now.keys() & self.plain.keys() if not _same(now[k], self.plain[k])})
        return moved + sorted({k.split("#")[0].split("[")[0] if not k.startswith("optimizer[") else k
                               for k in changed})  # the attribute, not its element

    def settle(self) -> None:
        """After an error: charge what moved as unprotected (ε = ∞) without raising, so a failed fit never reads a
        finite ε for weights it changed."""
        if self.moved():
            self.ledger.charge(StepRecord("none", 0.0, 1.0, "none", 0.0, 1.0))
            self.rebase()

    def check(self, who: str) -> None:
        """Refuse (and charge as unprotected, so ε reads ∞) parameters that moved since the last charged update."""
        moved = self.moved()
        if not moved:
            return
        self.ledger.charge(StepRecord("none", 0.0, 1.0, "none", 0.0, 1.0))
        self.rebase()
        attrs = [n for n in moved if n not in self.base]
        raise RuntimeError(
            f"PrivacyCallback: {len(moved)} parameters, buffers or attributes of {who} changed without a charged "
            f"private release (e.g. {moved[:3]}): an optimizer other than the DP optimizer, an in-place edit, or a "
            "step outside the private path. This model is no longer private (its ledger now reads ε = ∞). Train only "
            "through the DP optimizer the callback or the module builds; wrap public-data updates in "
            "lightning_dprel.callbacks.public_update(module)."
            + (f" {attrs[:3]} are plain attributes (not parameters or buffers): a value kept on the module from a "
               "private batch (in a hook, a callback or the step) and read later is a release no noise covers; keep "
               "such values local to the step (a value computed from released weights only, as an EMA, is declared "
               "with public_update(module))." if attrs else "")
        )

    def watch_releases_of(self, dp: Any) -> None:
        """Check before each of ``dp``'s releases (an edit in a hook or an override just before the step) and take the
        parameters after it as the base; watch its optimizer's hyper-parameters too."""
        dp.attach_pre_release_check(self.check_before_release)
        dp.attach_step_hook(self.after_release)
        self.optimizers.append(dp)
        self.inner.append(getattr(dp, "original_optimizer", dp))
        self.rebase(plain_only=True)

    def seal(self, batch: Any) -> None:
        """Keep this training batch as it stands now (the privacy callback's batch start): checked before the release."""
        self._seal = BatchSeal(batch) if batch is not None else None

    def check_before_release(self) -> None:
        self.check(type(self.module).__name__)
        seal, self._seal = self._seal, None
        if seal is not None:
            seal.verify(type(self.module).__name__)

    def close(self) -> None:
        """Stop watching: leave the module, the DP optimizers and what :attr:`on_close` restores as they were."""
        for restore in self.on_close:
            restore()
        self.on_close = []
        self.module.__dict__.pop(_WATCH, None)
        for dp in self.optimizers:
            dp._pre_release_checks.remove(self.check_before_release)
            dp._step_hooks.remove(self.after_release)
        self.optimizers = []
