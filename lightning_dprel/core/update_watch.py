"""Parameters that moved without a charged release: detected every step, charged as unprotected (ε = ∞), refused.

A DP-SGD fit's parameters may change only by a DP optimizer's step (whose release the ledger charges) or by an update
declared public (:func:`public_update`: a warm start or a step on public data, post-processing of released values). The watch keeps the
parameters as they stood after the last such change and compares them at every batch end: any other movement (a plain
optimizer, ``p.data -= …``, a module that fakes the facts it is asked for) is an update no private step charged.
State kept outside parameters and buffers is watched the same way: every tensor, NumPy array or float held in a plain
attribute of the module or a submodule (or in a list, tuple or dict there), so a value set from a private batch in a
hook and read by a later step is caught wherever it was set.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_dprel.core.events import StepRecord

__all__ = ["UpdateWatch", "public_update"]

_WATCH = "_lightning_dprel_update_watch"
_DEPTH = 3  # containers followed this deep
_LEAVES = (Tensor, np.ndarray, np.generic, float)
_CONTAINERS = (list, tuple, dict)


def _leaves(name: str, value: Any, out: dict[str, Any], depth: int = 0) -> None:
    """The watched leaves of one attribute: tensors, arrays and floats, through lists, tuples and dicts (whose length
    or keys are watched too when they hold any)."""
    if isinstance(value, _LEAVES):
        out[name] = value
    elif depth < _DEPTH and isinstance(value, _CONTAINERS) and value:
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        inner: dict[str, Any] = {}
        for k, v in items:
            _leaves(f"{name}[{k!r}]", v, inner, depth + 1)
        if inner:
            out[f"{name}#keys"] = tuple(repr(k) for k, _ in items)
            out.update(inner)


@functools.lru_cache(maxsize=None)
def _framework_keys(cls: type) -> frozenset[str]:
    """Attribute names nn.Module (and LightningModule, torchmetrics' Metric) keep for themselves: hooks, flags, the
    trainer; never the user's data. A user's own attribute, with or without a leading underscore, is not among them."""
    keys = set(vars(nn.Module()))
    try:
        from pytorch_lightning import LightningModule

        if issubclass(cls, LightningModule):
            keys |= set(vars(LightningModule()))
    except ImportError:  # pragma: no cover - a dependency
        pass
    return frozenset(keys - {"training"}) | {"_lightning_dprel_ledger", "_lightning_dprel_public_data", _WATCH}


def _metric_class() -> type | None:
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - a dependency of Lightning
        return None
    return Metric


def module_state(module: nn.Module, *, skip_metrics: bool = False) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(parameters and buffers by name, as ``named_parameters`` names them; the tensors, arrays and floats held in
    plain attributes of ``module`` and its submodules), in one pass over the modules.

    A torchmetrics ``Metric`` that holds no update (reset: its defaults) is left out of the plain state, and every
    metric with ``skip_metrics`` (taken right before Lightning resets the metrics an evaluation logged)."""
    metric = _metric_class()
    tensors: dict[str, Tensor] = {}
    plain: dict[str, Any] = {}
    seen: set[int] = set()
    for prefix, m in module.named_modules():
        pre = f"{prefix}." if prefix else ""
        for slot in (m._parameters, m._buffers):
            for k, t in slot.items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    tensors[pre + k] = t
        if metric is not None and isinstance(m, metric) and (skip_metrics or not getattr(m, "_update_count", 1)):
            continue
        skip = _framework_keys(type(m))
        for key, value in m.__dict__.items():
            if key not in skip and (isinstance(value, _LEAVES) or isinstance(value, _CONTAINERS)):
                _leaves(pre + key, value, plain)
    return tensors, plain


def plain_state(module: nn.Module, *, skip_metrics: bool = False) -> dict[str, Any]:
    """The tensors, arrays and floats in plain attributes of ``module`` and its submodules (:func:`module_state`)."""
    return module_state(module, skip_metrics=skip_metrics)[1]


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
    """The parameters, buffers and plain tensor attributes (:func:`plain_state`) after the last charged (or public)
    update of ``module``, checked before every release, at every batch's start and end, and at the end of training."""

    def __init__(self, module: nn.Module, ledger: Any) -> None:
        self.module, self.ledger = module, ledger
        self.base: dict[str, Tensor] = {}
        self.plain: dict[str, Any] = {}
        self.optimizers: list[Any] = []
        module.__dict__[_WATCH] = self
        self.rebase()

    def tensors(self) -> dict[str, Tensor]:
        """The parameters and buffers now, by name (read anew: a re-assigned buffer is a new tensor)."""
        return module_state(self.module)[0]

    @property
    def names(self) -> list[str]:
        return list(self.base)

    def rebase(self, *, plain_only: bool = False) -> None:
        """Take the parameters as they are now as the base (after a charged release or a public update); with
        ``plain_only``, only the plain attributes (after validation on public data; its metrics as reset, as Lightning
        resets the logged ones right after)."""
        now, plain = module_state(self.module, skip_metrics=plain_only)
        self.plain = {k: _snapshot(v) for k, v in plain.items()}
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

    def moved(self) -> list[str]:
        """Names of the parameters, buffers and plain attributes that differ from the base (or appeared or went)."""
        tensors, now = module_state(self.module)
        moved = sorted(tensors.keys() ^ self.base.keys())
        moved += [n for n, t in tensors.items() if n in self.base and not _same(t, self.base[n])]
        changed = sorted({k for k in now.keys() ^ self.plain.keys()}
                         | {k for k in now.keys() & self.plain.keys() if not _same(now[k], self.plain[k])})
        return moved + sorted({k.split("#")[0].split("[")[0] for k in changed})  # the attribute, not its element

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
        parameters after it as the base."""
        dp.attach_pre_release_check(self.check_before_release)
        dp.attach_step_hook(self.after_release)
        self.optimizers.append(dp)

    def check_before_release(self) -> None:
        self.check(type(self.module).__name__)

    def close(self) -> None:
        """Stop watching: leave the module and the DP optimizers as they were."""
        self.module.__dict__.pop(_WATCH, None)
        for dp in self.optimizers:
            dp._pre_release_checks.remove(self.check_before_release)
            dp._step_hooks.remove(self.after_release)
        self.optimizers = []
