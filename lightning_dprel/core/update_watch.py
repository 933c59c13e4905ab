"""Parameters that moved without a charged release: detected every step, charged as unprotected (ε = ∞), refused.

A DP-SGD fit's parameters may change only by a DP optimizer's step (whose release the ledger charges) or by an update
declared public (:func:`public_update`: a warm start or a step on public data, post-processing of released values). The watch keeps the
parameters as they stood after the last such change and compares them at every batch end: any other movement (a plain
optimizer, ``p.data -= …``, a module that fakes the facts it is asked for) is an update no private step charged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprel.core.events import StepRecord

__all__ = ["UpdateWatch", "public_update"]

_WATCH = "_lightning_dprel_update_watch"


@contextlib.contextmanager
def public_update(module: nn.Module) -> Iterator[None]:
    """Declare the body's parameter updates public: they read public data or released values only (post-processing),
    so no release is charged; the watch takes the parameters after them as its new base."""
    try:
        yield
    finally:
        watch = module.__dict__.get(_WATCH)
        if watch is not None:
            watch.rebase()


class UpdateWatch:
    """The parameters and buffers after the last charged (or public) update of ``module``, checked before every release,
    at every batch's start and end, and at the end of training."""

    def __init__(self, module: nn.Module, ledger: Any) -> None:
        self.module, self.ledger = module, ledger
        named = [*module.named_parameters(), *module.named_buffers()]  # a buffer filled from data is a release too
        self.names, self.params = [n for n, _ in named], [t for _, t in named]
        self.base: list[Tensor] = []
        self.optimizers: list[Any] = []
        module.__dict__[_WATCH] = self
        self.rebase()

    def rebase(self) -> None:
        """Take the parameters as they are now as the base (after a charged release or a public update)."""
        with torch.no_grad():
            if len(self.base) == len(self.params) and all(b.shape == p.shape for b, p in zip(self.base, self.params)):
                for b, p in zip(self.base, self.params):  # copied into the same buffers: no allocation per step
                    b.copy_(p)
            else:
                self.base = [p.detach().clone() for p in self.params]

    def after_release(self, record: Any) -> None:
        """A DP optimizer's step hook: the update it just applied is charged."""
        self.rebase()

    def moved(self) -> list[str]:
        """Names of the parameters and buffers that differ from the base."""
        return [n for n, p, b in zip(self.names, self.params, self.base) if not torch.equal(p.detach(), b)]

    def check(self, who: str) -> None:
        """Refuse (and charge as unprotected, so ε reads ∞) parameters that moved since the last charged update."""
        moved = self.moved()
        if not moved:
            return
        self.ledger.charge(StepRecord("none", 0.0, 1.0, "none", 0.0, 1.0))
        self.rebase()
        raise RuntimeError(
            f"PrivacyCallback: {len(moved)} parameters or buffers of {who} changed without a charged private release "
            f"(e.g. {moved[:3]}): an optimizer other than the DP optimizer, an in-place edit, or a step outside the "
            "private path. This model is no longer private (its ledger now reads ε = ∞). Train only through the DP "
            "optimizer the callback or the module builds; wrap public-data updates in "
            "lightning_dprel.callbacks.public_update(module)."
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
