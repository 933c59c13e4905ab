"""The DP-SGD layer attached to a user's own LightningModule (DP-SGD, Abadi et al. 2016, Alg. 1), by the privacy callback.

The user keeps their module, ``training_step``, loss and optimizer. :class:`AttachedDPSGD` wraps that optimizer in the
:class:`~lightning_dprel.core.optim.DPOptimizer` (σ and C live there), runs the user's step on each example alone for
per-example gradients (:mod:`~lightning_dprel.grad_sample.user_step`; ghost norms for its ``nn.Linear`` layers,
:mod:`~lightning_dprel.grad_sample.user_taps`), and charges every release to its own
:class:`~lightning_dprel.core.ledger.PrivacyLedger` (saved in the checkpoint under the ledger layer's key). What cannot
be proven is refused before the first step, with the fix named: manual optimization, a second optimizer, a loader that
is not a Poisson sampler, layers that mix examples (batch statistics; message passing outside DP-GCN's subgraphs), and a
loss whose full-batch value is neither the mean nor the sum of the examples' own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprel.core.example_views import ExampleView
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.per_example_data import per_example_batch_hooks
from lightning_dprel.core.privacy_layer import PrivacyLayer
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec, privacy_unit
from lightning_dprel.grad_sample.user_step import quiet_logging, step_loss, user_step_grads
from lightning_dprel.grad_sample.user_taps import tapped_layers, user_step_tapped_grads

__all__ = ["AttachedDPSGD", "LEDGER_KEY", "HAND_MADE_FACTS", "default_mechanism", "refuse_mixing_layers",
           "refuse_hand_made_facts",
           "attached_ledger", "attached_public_data", "record_attached_public", "restore_attached", "mark_released", "released_unchanged",
           "state_digest"]

LEDGER_KEY = "lightning_dprel"
_LEDGER_ATTR = "_lightning_dprel_ledger"
_PUBLIC_ATTR = "_lightning_dprel_public_data"
#: What only the library's layers state; a plain LightningModule that defines them is refused (they were faked before).
HAND_MADE_FACTS = ("noise_spec", "privacy_ledger", "set_noise_multiplier", "sampling_spec")
#: Why a user's step can fail when run on one example alone inside ``torch.func`` (the per-example gradients).
STEP_FAILED = (
    "{name}.training_step failed when run {how}: {err}. Steps that cannot be made private this way: one that calls "
    "backward() or an optimizer itself (a second model trained inside the step), gradient checkpointing, in-place "
    "writes to a buffer or an attribute of the module, or a custom autograd.Function without vmap support. Train one "
    "model per step, through the loss it returns, and keep the step free of side effects."
)
_VMAP = "on one example alone under torch.func (vmap of grad), as the per-example gradients need"
_CHECK = ("on the batch and on each example alone under torch.no_grad (the check that the batch's loss is the mean or "
          "the sum of the examples')")
#: The warning of ``log_private_metrics=True``: the user's training logs are computed on the private batch without noise.
PRIVATE_METRICS_WARNING = (
    "PrivacyCallback(log_private_metrics=True): your training_step's logs and returned loss are computed on the private "
    "batch without noise; they are outside the differential-privacy guarantee. Do not release them, and do not let "
    "them steer training (ReduceLROnPlateau, EarlyStopping or checkpoint selection on a training metric)."
)


def default_mechanism(unit: str) -> str:
    """The provable, standard-clipping mechanism registered for ``unit`` (per-example clipping to C)."""
    from lightning_dprel.accounting import get_mechanism, registered_mechanisms

    for name in registered_mechanisms():
        mech = get_mechanism(name)
        if mech.unit is not None and mech.unit.name == unit and "standard" in mech.clipping and not mech.warning \
                and mech.compositions is None:  # not a mechanism composed per run (banded noise is chosen explicitly)
            return name
    raise ValueError(f"No provable mechanism with per-example clipping is registered for the unit {unit!r}.")


def refuse_mixing_layers(module: nn.Module, unit: str) -> None:
    """Refuse layers whose output for one example depends on the others in the batch, naming the fix."""
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            raise ValueError(
                f"`{name}` ({type(m).__name__}) normalises with the statistics of the whole batch and updates running "
                "statistics from private data: one example's gradient depends on the others and no per-example "
                "clipping bounds it. Replace it with nn.GroupNorm / nn.LayerNorm, or freeze it in eval mode "
                "(`.eval()` in __init__, on_fit_start or on_train_start)."
            )
        if isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.training and m.track_running_stats:
            raise ValueError(
                f"`{name}` ({type(m).__name__}) updates its running statistics from the private batches without "
                "noise. Pass track_running_stats=False, or freeze it in eval mode."
            )
        pyg = type(m).__module__.startswith("torch_geometric.nn")
        if privacy_unit(unit).rows and pyg and _is_message_passing(m):
            raise ValueError(
                f"`{name}` ({type(m).__name__}) passes messages along the graph, so under the {unit!r} unit one "
                "example's loss reads other units' data. Train GNNs node-level on the DP-GCN route: "
                "NodeSplitDataModule(source, as_pyg_batches=True) with your module unchanged (random graph splits, "
                "each subgraph an example, accounting 'subgraph_replace')."
            )


def _is_message_passing(m: nn.Module) -> bool:
    try:
        from torch_geometric.nn import MessagePassing
    except ImportError:  # pragma: no cover - torch-geometric is a dependency
        return False
    return isinstance(m, MessagePassing)


def refuse_hand_made_facts(module: Any) -> None:
    """Refuse a plain LightningModule that states privacy facts itself (a module could claim them
    and train without noise while ε reads 0): the layer states them."""
    faked = [name for name in HAND_MADE_FACTS if hasattr(module, name)]
    if faked:
        raise TypeError(
            f"{type(module).__name__} defines {faked} itself. PrivacyCallback no longer trusts "
            "facts a plain LightningModule states (a module could claim them and train without "
            "noise while ε reads 0): remove them; the callback attaches the DP optimizer and the "
            "ledger itself. Give it clip_norm= and noise_multiplier= (or target_epsilon= with "
            "calibrate=True)."
        )


class AttachedDPSGD(PrivacyLayer):
    """The DP-SGD layer of a plain LightningModule: DP optimizer, ledger and per-example step.

    Built by the privacy callback's attach seam (:mod:`lightning_dprel.callbacks.attach`), which
    hands the trainer its DP optimizer and the module its :meth:`training_step`."""

    def __init__(self, trainer: Any, module: Any, *, clip_norm: float, noise_multiplier: float,
                 log_private_metrics: bool = False, chunk_size: int | None = None, saved_ledger: dict | None = None) -> None:
        refuse_hand_made_facts(module)
        self.log_private_metrics = bool(log_private_metrics)
        if not module.automatic_optimization:
            raise ValueError(
                f"{type(module).__name__} uses manual optimization: its own optimizer.step() calls bypass the DP "
                "optimizer. Use automatic optimization (return the loss from training_step; the callback clips, "
                "noises and steps your optimizer), or build on lightning_dprel.core.PrivateModule."
            )
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"{type(module).__name__}.configure_optimizers gives {len(trainer.optimizers)} optimizers; example-level "
                "DP-SGD wraps exactly one (a second, plain one would update parameters without noise). Return one."
            )
        self._trainer, self.module, self.chunk_size = trainer, module, chunk_size
        #: The module's ledger: kept on the module across fits (a refit never restarts ε at 0), restored from a checkpoint.
        self.privacy_ledger = module.__dict__.setdefault(_LEDGER_ATTR, PrivacyLedger())
        if saved_ledger is not None:
            self.privacy_ledger.load_state_dict(saved_ledger)
        inner = trainer.optimizers[0]
        if isinstance(inner, DPOptimizer):
            inner = inner.original_optimizer
        self.params = _optimized(module, inner, trainable_only=False)
        frozen = [n for n, p in self.params.items() if not p.requires_grad]
        if frozen:
            raise ValueError(f"The optimizer holds parameters with requires_grad=False ({frozen[:3]}); leave them out.")
        self.inner = inner
        spec = NoiseSpec(float(noise_multiplier), float(clip_norm), clipping="standard")
        self._dp_optimizer = DPOptimizer(inner, named_params=self.params, noise_spec=spec,
                                         noise=KeyedStream.secret("noise"))
        self._dp_optimizer.attach_step_hook(self._charge)
        self._layers = tapped_layers(module, self.params)  # nn.Linear layers whose per-example gradients are not formed
        self._outputs: dict[str, Tensor] = {}  # their outputs for one example (the taps' shapes), kept across steps
        self.view: ExampleView | None = None
        self.sampling: SamplingSpec | None = None
        self._restore_hooks = lambda: None
        self._checked_reduction = False
        self._step = module.training_step  # the user's, bound

    @property
    def dp(self) -> DPOptimizer:
        """The DP optimizer around the user's optimizer (σ and C live there)."""
        return self._dp_optimizer

    @property
    def owns_clip_norm(self) -> bool:
        """C is the privacy callback's ``clip_norm``."""
        return False

    def prepare(self, sampling: SamplingSpec, view: ExampleView) -> None:
        """Take the sampler's spec, its example view and the unit's mechanism; run overridden batch hooks on each
        example alone (before step 1)."""
        mechanism = self.dp.correlation.mechanism if self.dp.correlation else default_mechanism(sampling.privacy_unit)
        if self.dp.noise_spec.accounting != mechanism:
            self.dp.noise_spec = replace(self.dp.noise_spec, accounting=mechanism)
        self.view, self.sampling = view, sampling
        self._restore_hooks()
        self._restore_hooks = per_example_batch_hooks(self._trainer, self.module, view)

    def open_fit(self, sampling: SamplingSpec | None, noise: NoiseSpec | None = None) -> None:
        """:meth:`PrivacyLayer.open_fit`, and what the data declares public (``privacy.json``)."""
        super().open_fit(sampling, noise)
        public = getattr(self._trainer.datamodule, "public_data", None)
        if isinstance(public, dict):  # e.g. validation entities
            self.module.__dict__[_PUBLIC_ATTR] = dict(public)

    # --- the step -------------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | dict:
        """Per-example gradients of the user's step → the DP optimizer; with ``log_private_metrics``, the user's step on
        the whole batch for its logs (outside the guarantee)."""
        if self.view is None:
            raise RuntimeError("The privacy callback did not open this fit (PrivacyCallback.on_train_start).")
        refuse_mixing_layers(self.module, self.sampling.privacy_unit)  # every step: a hook may have switched one on
        self._follow_optimizer()
        size = self.view.size(batch)
        if size and not self._checked_reduction:
            self.check_reduction(batch, batch_idx)
        try:
            result = None
            if size and self.view.stacks and self._layers:  # ghost norms of the Linear layers, each example still alone
                result = user_step_tapped_grads(self.module, self._step, self.view, batch, batch_idx, self.params,
                                                self._layers, self._outputs)
            if result is None:
                result = user_step_grads(self.module, self._step, self.view, batch, batch_idx, self.params,
                                         chunk_size=self.chunk_size)
        except RuntimeError as err:
            raise RuntimeError(STEP_FAILED.format(name=type(self.module).__name__, err=err, how=_VMAP)
                               + _about(self.view)) from err
        self.dp.record(result.grads, max_freq=None, expected_batch_size=self.sampling.expected_batch_size)
        if not size or not self.log_private_metrics:  # the batch's loss is private: Lightning gets 0, the user's logs none
            return torch.zeros((), device=next(iter(self.params.values())).device)
        with torch.no_grad():
            return self._step(batch, batch_idx)

    def _follow_optimizer(self) -> None:
        """Train what the optimizer holds now: a parameter group added mid-fit (BaseFinetuning's unfreeze) joins the
        DP optimizer's parameters, and a parameter frozen mid-fit leaves them (no gradient, no update)."""
        ids = {id(p) for g in self.inner.param_groups for p in g["params"] if p.requires_grad}
        if ids == {id(p) for p in self.params.values()}:
            return
        self.params = _optimized(self.module, self.inner, trainable_only=True)
        self.dp.named_params = OrderedDict(self.params)
        self._layers, self._outputs = tapped_layers(self.module, self.params), {}

    def check_reduction(self, batch: Any, batch_idx: int) -> None:
        """Refuse a full-batch loss that is neither the mean nor the sum of the examples' own (dropout off, once)."""
        if not self.view.checks_reduction or self.view.size(batch) < 2:
            return
        self._checked_reduction = True
        batch, module = self.view.head(batch, 64), self.module  # 64 examples tell the reduction as well as all
        modes = {m: m.training for m in module.modules()}
        module.eval()  # dropout off (nn.Dropout and attention's own); BatchNorm is refused before
        rng = _RandomStates()  # every run draws what the first drew: a branch taken at random is taken alike
        try:
            with torch.no_grad(), quiet_logging(module):
                full = float(step_loss(self._step(batch, batch_idx)))
                alone = torch.stack([step_loss(rng.replay(self._step, ex, batch_idx))
                                     for ex in self.view.examples(batch)]).double()
        except RuntimeError as err:
            raise RuntimeError(STEP_FAILED.format(name=type(module).__name__, err=err, how=_CHECK)
                               + _about(self.view)) from err
        finally:
            rng.restore()
            for m, mode in modes.items():
                m.train(mode)
        mean, total = float(alone.mean()), float(alone.sum())
        if not (_close(full, mean) or _close(full, total)):
            raise ValueError(
                f"The loss of the whole batch ({full:.6g}) is neither the mean ({mean:.6g}) nor the sum ({total:.6g}) of "
                "the examples' losses computed alone: a layer mixes examples (batch statistics, attention or message "
                "passing across the batch) or the loss is not a per-example sum or mean (e.g. a contrastive loss over "
                "the batch). DP-SGD clips each example's gradient alone; make each example's loss depend on it only."
                + _about(self.view)
            )

    # --- checkpoints and teardown ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the checkpoint keeps under the ledger layer's key (as a lightning_dprel model's: ``{"ledger": …}``)."""
        return {"ledger": self.privacy_ledger.state_dict(), "public_data": attached_public_data(self.module)}

    def save_layer(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[LEDGER_KEY] = self.state_dict()

    def close_fit(self, *, failed: bool = False) -> None:
        """Give the module its batch hooks back; after a fit that ended well, mark its release."""
        self._restore_hooks()
        if not failed:
            mark_released(self.module)


_RELEASED_ATTR = "_lightning_dprel_released"


def state_digest(module: Any) -> str:
    """A digest of the module's parameters and buffers (names, shapes, dtypes, bytes)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def mark_released(module: Any) -> None:
    """What a private fit of this plain module released: its state at the fit's end (export checks it is unchanged)."""
    module.__dict__[_RELEASED_ATTR] = state_digest(module)


def released_unchanged(module: Any) -> bool:
    """Whether the module's state is what its last private fit released."""
    return module.__dict__.get(_RELEASED_ATTR) == state_digest(module)


def attached_ledger(module: Any) -> PrivacyLedger | None:
    """The ledger PrivacyCallback attached to a plain module (None if it never trained privately)."""
    return module.__dict__.get(_LEDGER_ATTR)


def attached_public_data(module: Any) -> dict:
    """What the data a plain module trained on declares public (its datamodule's ``public_data``)."""
    return dict(module.__dict__.get(_PUBLIC_ATTR, {}))


def restore_attached(module: Any, state: dict) -> None:
    """A plain module rebuilt from a checkpoint of its private fit: its ledger and public data, its weights as released."""
    ledger = PrivacyLedger()
    ledger.load_state_dict(state["ledger"])
    module.__dict__[_LEDGER_ATTR] = ledger
    module.__dict__[_PUBLIC_ATTR] = dict(state.get("public_data") or {})
    mark_released(module)


def record_attached_public(module: Any, key: str, value: Any) -> None:
    """Add ``key`` (e.g. the checkpoint selection) to what a plain module's ``privacy.json`` declares public."""
    module.__dict__.setdefault(_PUBLIC_ATTR, {})[key] = value


class _RandomStates:
    """Python's, NumPy's and torch's random states, taken once: replayed before each run, restored at the end."""

    def __init__(self) -> None:
        import random

        import numpy as np

        self.states = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def _set(self) -> None:
        import random

        import numpy as np

        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        torch.set_rng_state(self.states[2])

    def replay(self, fn: Any, *args: Any) -> Any:
        self._set()
        return fn(*args)

    restore = _set


def _optimized(module: nn.Module, optimizer: Any, *, trainable_only: bool) -> dict[str, Tensor]:
    """The module's parameters the optimizer holds (only those with requires_grad when ``trainable_only``), by name."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad or not trainable_only}
    params = {n: p for n, p in module.named_parameters() if id(p) in ids}
    if len(params) != len(ids):
        raise ValueError("The optimizer holds parameters that are not the module's; optimize the module's parameters.")
    return params


def _about(view: ExampleView) -> str:
    """What one example is, for an error about the user's step (empty where the view has nothing to add)."""
    said = view.describe()
    return f" {said}" if said else ""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
