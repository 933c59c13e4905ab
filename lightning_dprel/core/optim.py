"""The one private step, as an optimizer wrapper with named stages (Algorithm 3, lines 4-6).

``DPOptimizer`` wraps any torch optimizer (Adam by default in the module). A step consumes one record of
per-tuple gradients and runs, in order:

1. :meth:`DPOptimizer.clip` — FREQ-CLIP factors (Algorithm 1), standard clipping to C, or none;
2. :meth:`DPOptimizer.sum_clipped` — Σ_i factor_i·g(T_i);
3. :meth:`DPOptimizer.all_reduce` — sum over ranks when ``torch.distributed`` is initialised;
4. :meth:`DPOptimizer.add_noise` — N(0, σ²C²I) once per step, the same on every rank (so the noise is
   drawn once globally and parameters stay identical), from a keyed CSPRNG stream
   (:class:`~lightning_dprel.core.randomness.KeyedStream`; rank 0's key on every rank); or banded correlated
   noise w = C⁻¹z (:meth:`DPOptimizer.set_correlated_noise`, :mod:`~lightning_dprel.core.correlated_noise`);
5. :meth:`DPOptimizer.scale` — divide by the *expected* batch size b, never the realised one;
6. the wrapped optimizer steps, then every step hook receives the :class:`~lightning_dprel.core.events.StepRecord`
   of what was done (σ and C the noise was drawn with, clipping, b), as Opacus's optimizer feeds its accountant.

A record is consumed exactly once (the guard raises on a step without a fresh record, and on a second
record before the step), after Opacus's ``_check_processed_flag``.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 (lines 4-6) and Algorithm 1. Opacus ``optimizers/optimizer.py``
    (``DPOptimizer.pre_step``, ``attach_step_hook``); secure randomness as motivated in arXiv 2107.10138 §5.1.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_dprel.core.clipping import clipping_mode, factors_from_norms
from lightning_dprel.core.correlated_noise import BandedNoise, refuse_resume
from lightning_dprel.core.diagnostics import norm_stats, sum_stats, update_norm
from lightning_dprel.core.events import StepRecord
from lightning_dprel.grad_sample.base import MaterializedGrads, TupleGradients
from lightning_dprel.core.randomness import KeyedStream, distributed
from lightning_dprel.core.specs import NoiseSpec
from lightning_dprel.core.subspace import SUBSPACE, GradientSubspace, check_projected, check_subspace

__all__ = ["DPOptimizer"]


def _proxy(name: str) -> property:
    """An attribute of the wrapped optimizer, read and written through (Lightning and schedulers use these)."""
    return property(lambda self: getattr(self.original_optimizer, name), lambda self, v: setattr(self.original_optimizer, name, v))


@dataclass
class _Pending:
    """The record waiting for the next step, shared by reference (Lightning's optimizer wrapper copies ``__dict__``)."""

    pending: dict[str, Any] | None = None
    last: dict[str, float] = field(default_factory=dict)
    dropped_total: int = 0


class DPOptimizer(Optimizer):
    """Clip → sum → all-reduce → noise once → ÷ b → step, wrapping a torch optimizer (Algorithm 3).

    Args:
        optimizer: the wrapped optimizer over exactly the parameters in ``named_params``.
        named_params: name → parameter; per-tuple gradient records use these names.
        noise_multiplier, clip_norm, clipping, accounting: σ ≥ 0 (noise std σ·C), C > 0, a registered clipping
            mode (``"standard"``, ``"none"`` with σ = 0, or a method's, e.g. ``"freq"``), and the mechanism key that labels the step records; or ``noise_spec``.
        noise: the :class:`~lightning_dprel.core.randomness.KeyedStream` of the noise (default: a secret one, keyed
            from ``os.urandom``; ``KeyedStream.seeded`` for reproducible tests, which warns).
        process_group: the ``torch.distributed`` group to all-reduce over (default: the world).
        diagnostics: also record per step (in :attr:`last_step_stats`) norm quantiles, the clipped/unclipped cosine,
            the norms of the sum, noise and update: computed without noise, **outside the guarantee**, never released.

    Example: ``dp = DPOptimizer(Adam(params.values()), named_params=params, noise_multiplier=1.0, clip_norm=1.0,
    clipping="standard"); dp.record(grads, max_freq=None, expected_batch_size=b); dp.step()``.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        named_params: Mapping[str, nn.Parameter],
        noise_multiplier: float | None = None,
        clip_norm: float | None = None,
        clipping: str | None = None,
        accounting: str | None = None,
        noise_spec: NoiseSpec | None = None,
        noise: KeyedStream | None = None,
        process_group: Any = None,
        diagnostics: bool = False,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        opt_ids, named_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}, {id(p) for p in named_params.values()}
        if opt_ids != named_ids:
            raise ValueError("`named_params` must hold exactly the parameters of the wrapped optimizer "
                             f"({len(named_ids)} named vs {len(opt_ids)} in the optimizer); build both from the same dict.")
        self.original_optimizer = optimizer
        self.named_params = OrderedDict(named_params)
        if noise is not None and not isinstance(noise, KeyedStream):
            raise TypeError(f"`noise` must be a lightning_dprel.core.randomness.KeyedStream, got {type(noise).__name__}; "
                            "torch generators are refused because a released model reveals their output (issue 11).")
        if noise_spec is None:
            if noise_multiplier is None or clip_norm is None or clipping is None:
                raise TypeError("DPOptimizer needs `noise_spec`, or `noise_multiplier`, `clip_norm` and `clipping`.")
            noise_spec = NoiseSpec(float(noise_multiplier), float(clip_norm), clipping=clipping, accounting=accounting)
        elif not isinstance(noise_spec, NoiseSpec):
            raise TypeError(f"`noise_spec` must be a NoiseSpec, got {type(noise_spec).__name__}.")
        self.noise_spec = noise_spec  # σ and C live here once the optimizer exists
        self.noise = noise if noise is not None else KeyedStream.secret("noise")
        self.correlation: BandedNoise | None = None  # banded correlated noise (core/correlated_noise.py), or None
        self.process_group = process_group
        self.diagnostics = bool(diagnostics)
        self._state = _Pending()
        self.subspace: GradientSubspace | None = None
        self._step_hooks: list[Callable[[StepRecord], None]] = []
        self._pre_release_checks: list[Callable[[], None]] = []
        for kind in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre", "load_state_dict_post"):
            setattr(self, f"_optimizer_{kind}_hooks", OrderedDict())  # torch.optim.Optimizer bookkeeping hooks look up

    # --- proxies to the wrapped optimizer -------------------------------------------------------
    param_groups = _proxy("param_groups")  # type: ignore[assignment]
    state = _proxy("state")  # type: ignore[assignment]
    defaults = _proxy("defaults")  # type: ignore[assignment]

    # read-outs of the noise spec (its one home)
    noise_multiplier = property(lambda self: self.noise_spec.noise_multiplier)
    clip_norm = property(lambda self: self.noise_spec.clip_norm)
    clipping = property(lambda self: self.noise_spec.clipping)

    @property
    def last_step_stats(self) -> dict[str, float]:
        """Diagnostics of the last step: realised tuples, fraction clipped, mean per-tuple norm."""
        return dict(self._state.last)

    def attach_step_hook(self, fn: Callable[[StepRecord], None]) -> None:
        """Call ``fn(record)`` after every step with the :class:`StepRecord` of what the step did (once per ``fn``)."""
        if fn not in self._step_hooks:
            self._step_hooks.append(fn)

    def attach_pre_release_check(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` in every step before anything is released (after the closure); it raises to refuse the step."""
        if fn not in self._pre_release_checks:
            self._pre_release_checks.append(fn)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def set_subspace(self, subspace: GradientSubspace | None) -> None:
        """Clip and noise later steps' k coordinates on a PUBLIC subspace (GEP, :mod:`~lightning_dprel.core.subspace`); None: all."""
        self.subspace = check_subspace(subspace, self.named_params)

    def set_correlated_noise(self, correlation: BandedNoise | None) -> None:
        """Release g_t + w_t, w = C⁻¹z (banded MF, before step 1), accounted with its mechanism; None: independent noise."""
        if (correlation is not None and not isinstance(correlation, BandedNoise)) or (self.correlation and self.correlation.steps):
            raise TypeError(f"`correlation` must be a BandedNoise or None, set before step 1, got {correlation!r}.")
        self.correlation = correlation
        if correlation is not None:
            self.noise_spec = replace(self.noise_spec, accounting=correlation.mechanism)

    def set_noise_multiplier(self, sigma: float) -> None:
        """Change σ from the next step on (each step's record carries the σ its noise was drawn with)."""
        self.noise_spec = replace(self.noise_spec, noise_multiplier=float(sigma))

    # --- the record and its guard -----------------------------------------------------------------
    def record(
        self,
        per_tuple_grads: Mapping[str, Tensor] | TupleGradients,
        *,
        max_freq: Tensor | None,
        expected_batch_size: float,
    ) -> None:
        """Hand over this step's per-tuple gradients (consumed by the next :meth:`step`, exactly once).

        Args:
            per_tuple_grads: name → ``[B, *param.shape]`` for every wrapped parameter (B may be 0), or a
                :class:`~lightning_dprel.grad_sample.per_tuple.TupleGradients` (e.g. the ghost path's norms and sums).
            max_freq: ``[B]`` max-freq over the global batch; required for ``clipping="freq"``.
            expected_batch_size: b of the global batch (the datamodule's γ·m).
        """
        if self._state.pending is not None:
            raise RuntimeError(
                "A record of per-tuple gradients is already pending; call step() before recording the next batch (each "
                "record is clipped, noised and applied exactly once). An optimizer_step override must call optimizer.step()."
            )
        grads = per_tuple_grads if isinstance(per_tuple_grads, TupleGradients) else MaterializedGrads(per_tuple_grads)
        shapes = check_projected(grads, self.subspace)  # {} for coordinates already on the optimizer's subspace
        if shapes and set(shapes) != set(self.named_params):
            missing = sorted(set(self.named_params) - set(shapes))
            extra = sorted(set(shapes) - set(self.named_params))
            raise ValueError(f"Per-tuple gradients must cover exactly the wrapped parameters; missing {missing}, extra {extra}.")
        for name, p in self.named_params.items() if shapes else ():
            if tuple(shapes[name]) != tuple(p.shape):
                raise ValueError(f"Per-tuple gradient `{name}` has shape {(grads.size,) + tuple(shapes[name])}, expected [B, *{tuple(p.shape)}].")
        if isinstance(expected_batch_size, bool) or not float(expected_batch_size) > 0.0:
            raise ValueError(f"`expected_batch_size` must be > 0 (b = γ·m from the datamodule), got {expected_batch_size!r}.")
        size = grads.size
        if clipping_mode(self.clipping).needs_max_freq:
            if max_freq is None or max_freq.shape != (size,):
                raise ValueError(
                    f"`clipping={self.clipping!r}` needs `max_freq` of shape [B] = [{size}], got "
                    f"{None if max_freq is None else tuple(max_freq.shape)}; take it from TupleBatch.max_freq."
                )
        self._state.pending = {"grads": grads, "max_freq": max_freq, "b": float(expected_batch_size)}

    # --- the named stages ---------------------------------------------------------------------------
    def clip(self, grads: TupleGradients, max_freq: Tensor | None) -> Tensor:
        """Stage 1: per-tuple clip factors ``[B]`` (FREQ-CLIP, standard, or ones for ``"none"``)."""
        norms = grads.norms()
        factors = factors_from_norms(norms, self.clipping, clip_norm=self.clip_norm, max_freq=max_freq)
        if norms.numel():  # one device sync for the step's counters
            stats = torch.stack([norms.double().mean(), (~torch.isfinite(norms)).sum().double(), (factors < 1).double().mean()])
            mean_norm, dropped, clipped = stats.tolist()
        else:
            mean_norm, dropped, clipped = 0.0, 0.0, 0.0
        dropped = int(dropped) if clipping_mode(self.clipping).private else 0
        self._state.last = {"tuples": float(norms.numel()), "mean_norm": mean_norm, "dropped": float(dropped)}
        if dropped:
            self._state.dropped_total += dropped
            warnings.warn(
                f"DPOptimizer: {dropped} of {norms.numel()} tuples in this step had non-finite gradients and were "
                f"dropped (clip factor 0; {self._state.dropped_total} so far). The guarantee still holds (0 is within "
                "every clip bound), but the model is diverging or its inputs are broken: lower the learning rate or "
                "check the features. (This count is computed from the private batch: do not release it.)",
                UserWarning, stacklevel=3,
            )
        self._state.last["clipped_fraction"] = clipped
        if self.diagnostics:
            self._state.last.update(norm_stats(norms, factors))
        return factors

    def sum_clipped(self, grads: TupleGradients, factors: Tensor) -> dict[str, Tensor]:
        """Stage 2: Σ_i factor_i·g(T_i) per parameter (formed sums, or book-keeping on the ghost path)."""
        return grads.weighted_sum(factors)

    def all_reduce(self, summed: dict[str, Tensor]) -> dict[str, Tensor]:
        """Stage 3: sum the clipped sums over ranks (one flat all-reduce), when distributed."""
        if not distributed():
            return summed
        names = list(self.named_params) if self.subspace is None else [SUBSPACE]
        flat = torch.cat([summed[n].reshape(-1) for n in names])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
        out, offset = {}, 0
        for n in names:
            numel = summed[n].numel()
            out[n] = flat[offset : offset + numel].view_as(summed[n])
            offset += numel
        return out

    def draw_noise(self, device: torch.device | None = None) -> Tensor | None:
        """The step's N(0, σ²C²I) over all wrapped coordinates, flat (None when σ = 0): one call of the noise stream.

        :meth:`pre_step` draws it before the per-tuple work is synchronised, so on a GPU the CPU generates it while
        the device still computes the norms.
        """
        std = self.noise_multiplier * self.clip_norm if self.noise_multiplier > 0.0 else 0.0
        if std == 0.0:  # banded noise refuses σ = 0 (nothing to amplify)
            return None if self.correlation is None else self.correlation.correlate(torch.zeros(0), std, self.noise_spec.mechanism)
        total = self.subspace.dim if self.subspace is not None else sum(p.numel() for p in self.named_params.values())
        noise = self.noise.normal(total, std, dtype=torch.float32)
        noise = noise if self.correlation is None else self.correlation.correlate(noise, std, self.noise_spec.mechanism)  # w_t = C⁻¹z
        return noise if device is None else noise.to(device, non_blocking=True)

    def add_noise(self, summed: dict[str, Tensor], noise: Tensor | None | str = "draw") -> dict[str, Tensor]:
        """Stage 4: add N(0, σ²C²I) once to the global sum (same stream position on every rank)."""
        std = self.noise_multiplier * self.clip_norm if self.noise_multiplier > 0.0 else 0.0
        self._state.last["noise_std"] = std
        if isinstance(noise, str):
            noise = self.draw_noise()
        if std == 0.0 or noise is None:
            return summed
        out, offset = {}, 0
        for n in list(self.named_params) if self.subspace is None else [SUBSPACE]:  # noise slices in this order
            t = summed[n]
            numel = t.numel()
            out[n] = t + noise[offset : offset + numel].view(t.shape).to(device=t.device, dtype=t.dtype)
            offset += numel
        return out

    def scale(self, noised: dict[str, Tensor], expected_batch_size: float) -> dict[str, Tensor]:
        """Stage 5: divide by the expected batch size b (Algorithm 3, line 5), never by |E⁺|."""
        return {n: t / expected_batch_size for n, t in noised.items()}

    def pre_step(self) -> None:
        """Run stages 1-5 on the pending record and write the result into ``p.grad``."""
        pending = self._state.pending
        if pending is None:
            raise RuntimeError(
                "DPOptimizer.step() without fresh per-tuple gradients: call record(...) once per step "
                "(gradients are never reused across steps)."
            )
        self._state.pending = None  # consumed, whatever happens next
        self._state.last = {}
        grads = pending["grads"]
        if self.subspace is not None:  # GEP: clip and noise the public-subspace coordinates (core/subspace.py)
            grads = self.subspace.project(grads)
        noise = self.draw_noise(next(iter(self.named_params.values())).device)
        factors = self.clip(grads, pending["max_freq"])
        summed = self.sum_clipped(grads, factors)
        summed = self.all_reduce(summed)
        noised = self.add_noise(summed, noise)
        if self.diagnostics:
            self._record_diagnostics(grads, factors, summed, noised)
        self._state.last["expected_batch_size"] = pending["b"]
        if self.subspace is not None:
            noised = self.subspace.lift(noised[SUBSPACE])
        final = self.scale(noised, pending["b"])
        for name, p in self.named_params.items():
            p.grad = final[name].to(dtype=p.dtype, device=p.device)

    def _record_diagnostics(self, grads: TupleGradients, factors: Tensor, summed: dict[str, Tensor], noised: dict[str, Tensor]) -> None:
        ones = torch.where(factors > 0, torch.ones_like(factors), factors)  # the non-finite tuples stay dropped
        raw = self.all_reduce(grads.weighted_sum(ones))
        self._state.last.update(sum_stats(list(summed), summed, raw, noised))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Run the private stages, then the wrapped optimizer's step (Algorithm 3, line 6)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for check in self._pre_release_checks:
            check()
        self.pre_step()
        before = [p.detach().clone() for p in self.named_params.values()] if self.diagnostics else None
        self.original_optimizer.step()
        if before is not None:
            self._state.last["update_norm"] = update_norm(list(self.named_params.values()), before)
        spec, last = self.noise_spec, self._state.last
        record = StepRecord(
            mechanism=spec.mechanism, noise_multiplier=spec.noise_multiplier, clip_norm=spec.clip_norm,
            clipping=spec.clipping, noise_std=last["noise_std"], expected_batch_size=last["expected_batch_size"],
        )
        for hook in self._step_hooks:
            hook(record)
        return loss

    # --- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state, the noise spec and the noise stream's position (never its key)."""
        return {
            "optimizer": self.original_optimizer.state_dict(),
            "noise": self.noise.state_dict(),
            "noise_spec": self.noise_spec.to_dict(),
            **({} if self.correlation is None else {"correlation": self.correlation.state_dict()}),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        missing = [key for key in ("optimizer", "noise", "noise_spec") if key not in state_dict]
        if missing:
            raise ValueError(f"DPOptimizer.load_state_dict: missing key {missing[0]!r} (got {sorted(state_dict)}).")
        refuse_resume(state_dict.get("correlation"))  # a banded run's previous w's are not saved
        saved = NoiseSpec(**state_dict["noise_spec"])
        if saved.clipping != self.clipping:
            raise ValueError(
                f"The checkpoint was trained with clipping={saved.clipping!r}, this optimizer uses "
                f"{self.clipping!r}; resume with the same clipping mode."
            )
        self.original_optimizer.load_state_dict(state_dict["optimizer"])
        self.noise.load_state_dict(state_dict["noise"])
        self.noise_spec = saved

    def __repr__(self) -> str:
        return (f"DPOptimizer(clipping={self.clipping!r}, noise_multiplier={self.noise_multiplier}, "
                f"clip_norm={self.clip_norm}, optimizer={type(self.original_optimizer).__name__})")
