"""The one private step, as an optimizer wrapper with named stages (Algorithm 3, lines 4-6).

``DPOptimizer`` wraps any torch optimizer (Adam by default in the module). A step consumes one record of
per-tuple gradients and runs, in order:

1. :meth:`DPOptimizer.clip` — FREQ-CLIP factors (Algorithm 1), standard clipping to C, or none;
2. :meth:`DPOptimizer.sum_clipped` — Σ_i factor_i·g(T_i);
3. :meth:`DPOptimizer.all_reduce` — sum over ranks when ``torch.distributed`` is initialised;
4. :meth:`DPOptimizer.add_noise` — N(0, σ²C²I) once per step, the same on every rank (so the noise is
   drawn once globally and parameters stay identical): from a dedicated generator whose state is the same
   on every rank, or (``secure=True``) from the OS CSPRNG on rank 0, broadcast to the others;
5. :meth:`DPOptimizer.scale` — divide by the *expected* batch size b, never the realised one;
6. the wrapped optimizer steps.

A record is consumed exactly once (the guard raises on a step without a fresh record, and on a second
record before the step), after Opacus's ``_check_processed_flag``.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Algorithm 3 (lines 4-6) and Algorithm 1. Opacus ``optimizers/optimizer.py``
    (``DPOptimizer.pre_step``); secure seeding as motivated in arXiv 2107.10138 §5.1.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_dprel.clipping import clip_factors, freq_clip_thresholds, per_tuple_norms, weighted_sum
from lightning_dprel.sampling import secret_generator
from lightning_dprel.specs import CLIPPING_MODES, NoiseSpec

__all__ = ["NoiseSource", "DPOptimizer", "csprng_normal"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _broadcast_from_rank0(t: Tensor) -> Tensor:
    """Rank 0's ``t`` on every rank (on the current CUDA device under NCCL), back on ``t``'s device."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    box = t.to(device)
    dist.broadcast(box, src=0)
    return box.to(t.device)


def csprng_normal(numel: int, std: float) -> Tensor:
    """``numel`` float64 draws of N(0, std²) from the OS CSPRNG (``os.urandom``), by Box–Muller.

    Each uniform is built from 53 random bits of ``os.urandom`` (u1 in (0, 1], u2 in [0, 1)), so no
    pseudo-random generator state exists that could be recovered or saved; the Gaussian is computed in
    float64 and cast by the caller.
    """
    if numel == 0:
        return torch.empty(0, dtype=torch.float64)
    pairs = (numel + 1) // 2
    words = torch.frombuffer(bytearray(os.urandom(16 * pairs)), dtype=torch.int64)
    bits = torch.bitwise_right_shift(words, 11).bitwise_and_((1 << 53) - 1).to(torch.float64)  # 53-bit ints
    u1 = (bits[:pairs] + 1.0) * 2.0**-53  # (0, 1]: log never sees 0
    u2 = bits[pairs:] * 2.0**-53  # [0, 1)
    radius = torch.sqrt(-2.0 * torch.log(u1)).mul_(std)
    angle = u2.mul_(2.0 * math.pi)
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:numel]


class NoiseSource:
    """The Gaussian source of the private step (never the global torch seed).

    Two modes:

    * seeded (``secure=False``): a dedicated CPU ``torch.Generator``. ``seed=None`` (the default) draws a
      64-bit secret from ``os.urandom`` that fills the whole mt19937 state
      (:func:`~lightning_dprel.sampling.secret_generator`); under ``torch.distributed`` rank 0's secret is
      broadcast at the first draw, so every rank holds the same state and draws the same noise. The
      generator state is written to checkpoints so a resume continues the stream. **Anyone who knows the seed or the saved state can
      regenerate the noise and subtract it (ε = ∞)**: a user-given seed is for reproducible experiments
      and tests only (torch's ``manual_seed`` keeps only its low 32 bits), and checkpoints of a seeded
      source must be kept as secret as the training data.
    * secure (``secure=True``): every draw comes from the OS CSPRNG (:func:`csprng_normal`, float64
      Box–Muller, then cast); under ``torch.distributed`` rank 0 draws and broadcasts, so every rank adds
      the same noise. There is no state to save: checkpoints hold only ``{"secure": True}``.

    Args:
        seed: the generator seed; ``None`` draws one from ``os.urandom``. Must be None when ``secure``.
        secure: draw from the OS CSPRNG (see above).
    """

    def __init__(self, *, seed: int | None = None, secure: bool = False) -> None:
        if secure and seed is not None:
            raise ValueError(
                f"`secure_noise=True` draws its noise from os.urandom, so `noise_seed` must be None, got {seed!r}."
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"`noise_seed` must be a non-negative int or None, got {seed!r}.")
        self.secure = bool(secure)
        self.seed = seed
        self._generator: torch.Generator | None = None
        self._pending_state: Tensor | None = None

    def _ensure(self) -> torch.Generator:
        if self.secure:
            raise RuntimeError("A secure NoiseSource has no torch.Generator; its draws come from os.urandom.")
        if self._generator is None:
            if self.seed is None:  # 64 secret bits fill the whole mt19937 state (manual_seed keeps 32)
                secret = int.from_bytes(os.urandom(8), "little", signed=True)
                if _distributed():  # one secret for all ranks
                    secret = int(_broadcast_from_rank0(torch.tensor([secret], dtype=torch.long)).item())
                self._generator = secret_generator(secret % (1 << 64), "noise")
            else:
                self._generator = torch.Generator().manual_seed(self.seed)
            if self._pending_state is not None:
                self._generator.set_state(self._pending_state)
                self._pending_state = None
        return self._generator

    @property
    def generator(self) -> torch.Generator:
        """The underlying CPU ``torch.Generator`` (created on first use; not in secure mode)."""
        return self._ensure()

    def normal(self, numel: int, std: float, *, dtype: torch.dtype = torch.float32) -> Tensor:
        """``numel`` draws of N(0, std²) on the CPU (the same on every rank)."""
        if self.secure:
            if not _distributed() or dist.get_rank() == 0:
                draws = csprng_normal(numel, std).to(dtype)
            else:
                draws = torch.empty(numel, dtype=dtype)
            return _broadcast_from_rank0(draws) if _distributed() and numel else draws
        out = torch.empty(numel, dtype=dtype)
        return out.normal_(0.0, std, generator=self._ensure()) if numel else out

    def state_dict(self) -> dict[str, Any]:
        """Generator state so a resume never repeats earlier noise (SECRET: it regenerates all later noise).

        Secure mode stores nothing but ``{"secure": True}``.
        """
        if self.secure:
            return {"secure": True}
        return {"secure": False, "seed": self.seed, "state": self._ensure().get_state().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state or "secure" not in state:
            raise ValueError("NoiseSource.load_state_dict got an empty dict or one without the key 'secure'.")
        if bool(state["secure"]) != self.secure:
            raise ValueError(
                f"The checkpoint's noise source has secure={state['secure']}, this one secure={self.secure}; "
                "resume with the same `secure_noise` setting."
            )
        if self.secure:  # nothing stored: draws keep coming from os.urandom
            return
        self.seed = state.get("seed", self.seed)
        if self._generator is None:
            self._pending_state = state["state"].clone()
        else:
            self._generator.set_state(state["state"].clone())


@dataclass
class _Ledger:
    """Mutable step state, shared by reference (Lightning's optimizer wrapper copies ``__dict__``)."""

    pending: dict[str, Any] | None = None
    steps: int = 0
    last: dict[str, float] = field(default_factory=dict)


class DPOptimizer(Optimizer):
    """Clip → sum → all-reduce → noise once → ÷ b → step, wrapping a torch optimizer (Algorithm 3).

    Args:
        optimizer: the wrapped optimizer over exactly the parameters in ``named_params``.
        named_params: name → parameter; per-tuple gradient records use these names.
        noise_multiplier: σ ≥ 0; noise std on the clipped sum is σ·C.
        clip_norm: C > 0.
        clipping: ``"freq"`` (Algorithm 1), ``"standard"`` or ``"none"`` (baseline; needs σ = 0).
        noise: the :class:`NoiseSource` (default: one seeded from ``os.urandom``).
        process_group: the ``torch.distributed`` group to all-reduce over (default: the world).
        diagnostics: also record, per step, the per-tuple norm quantiles, the cosine between the clipped sum
            and the unclipped sum, the norms of the clipped sum, of the noise and of the parameter update in
            :attr:`last_step_stats`. They are computed from the private batch without noise and are
            **outside the guarantee**: for diagnosis only, never to be released.

    Example::

        dp = DPOptimizer(torch.optim.Adam(params.values()), named_params=params,
                         noise_multiplier=1.0, clip_norm=1.0)
        dp.record(per_tuple.grads, max_freq=batch.max_freq, expected_batch_size=batch.expected_batch_size)
        dp.step()
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        named_params: Mapping[str, nn.Parameter],
        noise_multiplier: float,
        clip_norm: float,
        clipping: str = "freq",
        noise: NoiseSource | None = None,
        process_group: Any = None,
        diagnostics: bool = False,
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        NoiseSpec(noise_multiplier=noise_multiplier, clip_norm=clip_norm, clipping=clipping)  # validates
        opt_ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named_ids = {id(p) for p in named_params.values()}
        if opt_ids != named_ids:
            raise ValueError(
                "`named_params` must hold exactly the parameters of the wrapped optimizer "
                f"({len(named_ids)} named vs {len(opt_ids)} in the optimizer); build both from the same dict."
            )
        self.original_optimizer = optimizer
        self.named_params = OrderedDict(named_params)
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.clipping = clipping
        self.noise = noise if noise is not None else NoiseSource()
        self.process_group = process_group
        self.diagnostics = bool(diagnostics)
        self._ledger = _Ledger()
        # torch.optim.Optimizer bookkeeping that hooks and profilers look up
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict = OrderedDict()

    # --- proxies to the wrapped optimizer -------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict:  # type: ignore[override]
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict) -> None:
        self.original_optimizer.defaults = value

    @property
    def steps(self) -> int:
        """Private steps taken (each one noised once)."""
        return self._ledger.steps

    @property
    def last_step_stats(self) -> dict[str, float]:
        """Diagnostics of the last step: realised tuples, fraction clipped, mean per-tuple norm."""
        return dict(self._ledger.last)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def set_noise_multiplier(self, sigma: float) -> None:
        """Change σ (the module calls this; the accountant must see the same value)."""
        NoiseSpec(noise_multiplier=sigma, clip_norm=self.clip_norm, clipping=self.clipping)
        self.noise_multiplier = float(sigma)

    # --- the record and its guard -----------------------------------------------------------------
    def record(
        self,
        per_tuple_grads: Mapping[str, Tensor],
        *,
        max_freq: Tensor | None,
        expected_batch_size: float,
    ) -> None:
        """Hand over this step's per-tuple gradients (consumed by the next :meth:`step`, exactly once).

        Args:
            per_tuple_grads: name → ``[B, *param.shape]`` for every wrapped parameter (B may be 0).
            max_freq: ``[B]`` max-freq over the global batch; required for ``clipping="freq"``.
            expected_batch_size: b of the global batch (the datamodule's γ·m).
        """
        if self._ledger.pending is not None:
            raise RuntimeError(
                "A record of per-tuple gradients is already pending; call step() before recording the next "
                "batch (each record is clipped, noised and applied exactly once)."
            )
        if set(per_tuple_grads) != set(self.named_params):
            missing = sorted(set(self.named_params) - set(per_tuple_grads))
            extra = sorted(set(per_tuple_grads) - set(self.named_params))
            raise ValueError(f"Per-tuple gradients must cover exactly the wrapped parameters; missing {missing}, extra {extra}.")
        for name, p in self.named_params.items():
            g = per_tuple_grads[name]
            if tuple(g.shape[1:]) != tuple(p.shape):
                raise ValueError(f"Per-tuple gradient `{name}` has shape {tuple(g.shape)}, expected [B, *{tuple(p.shape)}].")
        if isinstance(expected_batch_size, bool) or not float(expected_batch_size) > 0.0:
            raise ValueError(
                f"`expected_batch_size` must be > 0 (b = γ·m from the datamodule), got {expected_batch_size!r}."
            )
        size = next(iter(per_tuple_grads.values())).shape[0]
        if self.clipping == "freq":
            if max_freq is None or max_freq.shape != (size,):
                raise ValueError(
                    f"`clipping='freq'` needs `max_freq` of shape [B] = [{size}], got "
                    f"{None if max_freq is None else tuple(max_freq.shape)}; take it from TupleBatch.max_freq."
                )
        self._ledger.pending = {
            "grads": dict(per_tuple_grads),
            "max_freq": max_freq,
            "b": float(expected_batch_size),
        }

    # --- the named stages ---------------------------------------------------------------------------
    def clip(self, grads: Mapping[str, Tensor], max_freq: Tensor | None) -> Tensor:
        """Stage 1: per-tuple clip factors ``[B]`` (FREQ-CLIP, standard, or ones for ``"none"``)."""
        norms = per_tuple_norms(grads)
        self._ledger.last = {
            "tuples": float(norms.numel()),
            "mean_norm": float(norms.mean()) if norms.numel() else 0.0,
        }
        if self.clipping == "freq":
            if max_freq is None or max_freq.shape != norms.shape:
                raise ValueError(f"`max_freq` must have shape [B] = {tuple(norms.shape)}, got {None if max_freq is None else tuple(max_freq.shape)}.")
            factors = clip_factors(norms, freq_clip_thresholds(max_freq.to(norms.device), self.clip_norm).to(norms.dtype))
        elif self.clipping == "standard":
            factors = clip_factors(norms, self.clip_norm)
        elif self.clipping == "none":
            factors = torch.ones_like(norms)
        else:
            raise ValueError(f"`clipping` must be one of {CLIPPING_MODES}, got {self.clipping!r}.")
        self._ledger.last["clipped_fraction"] = float((factors < 1).float().mean()) if factors.numel() else 0.0
        if self.diagnostics and norms.numel():
            finite = norms[torch.isfinite(norms)].double()
            for q in (0.1, 0.5, 0.9):
                self._ledger.last[f"norm_q{int(q * 100)}"] = float(torch.quantile(finite, q)) if finite.numel() else float("nan")
            clipped = norms.double() * factors.double()
            self._ledger.last["mean_clipped_norm"] = float(clipped[torch.isfinite(clipped)].mean()) if finite.numel() else 0.0
        return factors

    def sum_clipped(self, grads: Mapping[str, Tensor], factors: Tensor) -> dict[str, Tensor]:
        """Stage 2: Σ_i factor_i·g(T_i) per parameter."""
        return dict(weighted_sum(grads, factors))

    def all_reduce(self, summed: dict[str, Tensor]) -> dict[str, Tensor]:
        """Stage 3: sum the clipped sums over ranks (one flat all-reduce), when distributed."""
        if not _distributed():
            return summed
        names = list(self.named_params)
        flat = torch.cat([summed[n].reshape(-1) for n in names])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
        out, offset = {}, 0
        for n in names:
            numel = summed[n].numel()
            out[n] = flat[offset : offset + numel].view_as(summed[n])
            offset += numel
        return out

    def add_noise(self, summed: dict[str, Tensor]) -> dict[str, Tensor]:
        """Stage 4: add N(0, σ²C²I) once to the global sum (same generator state on every rank)."""
        if self.noise_multiplier == 0.0:
            return summed
        names = list(self.named_params)
        total = sum(summed[n].numel() for n in names)
        noise = self.noise.normal(total, self.noise_multiplier * self.clip_norm, dtype=torch.float32)
        out, offset = {}, 0
        for n in names:
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
        pending = self._ledger.pending
        if pending is None:
            raise RuntimeError(
                "DPOptimizer.step() without fresh per-tuple gradients: call record(...) once per step "
                "(gradients are never reused across steps)."
            )
        self._ledger.pending = None  # consumed, whatever happens next
        grads = pending["grads"]
        factors = self.clip(grads, pending["max_freq"])
        summed = self.sum_clipped(grads, factors)
        summed = self.all_reduce(summed)
        noised = self.add_noise(summed)
        if self.diagnostics:
            self._record_diagnostics(grads, factors, summed, noised)
        final = self.scale(noised, pending["b"])
        for name, p in self.named_params.items():
            p.grad = final[name].to(dtype=p.dtype, device=p.device)

    def _record_diagnostics(self, grads: Mapping[str, Tensor], factors: Tensor, summed: dict[str, Tensor], noised: dict[str, Tensor]) -> None:
        """Cosine(clipped sum, unclipped sum), clipped-sum norm and noise norm (diagnostics, outside the guarantee)."""
        names = list(self.named_params)
        ones = torch.where(factors > 0, torch.ones_like(factors), factors)  # the non-finite tuples stay dropped
        raw = self.all_reduce(dict(weighted_sum(grads, ones)))
        flat_c = torch.cat([summed[n].reshape(-1).double() for n in names])
        flat_r = torch.cat([raw[n].reshape(-1).double() for n in names])
        flat_n = torch.cat([(noised[n] - summed[n]).reshape(-1).double() for n in names])
        denom = float(flat_c.norm() * flat_r.norm())
        self._ledger.last.update(
            cos_clipped_unclipped=float(flat_c @ flat_r) / denom if denom > 0 else float("nan"),
            clipped_sum_norm=float(flat_c.norm()),
            unclipped_sum_norm=float(flat_r.norm()),
            noise_norm=float(flat_n.norm()),
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Run the private stages, then the wrapped optimizer's step (Algorithm 3, line 6)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.pre_step()
        before = [p.detach().clone() for p in self.named_params.values()] if self.diagnostics else None
        self.original_optimizer.step()
        if before is not None:
            sq = sum(float((p.detach() - b).double().pow(2).sum()) for p, b in zip(self.named_params.values(), before))
            self._ledger.last["update_norm"] = math.sqrt(sq)
        self._ledger.steps += 1
        return loss

    # --- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {
            "optimizer": self.original_optimizer.state_dict(),
            "noise": self.noise.state_dict(),
            "steps": self._ledger.steps,
            "clipping": self.clipping,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        for key in ("optimizer", "noise", "clipping"):
            if key not in state_dict:
                raise ValueError(f"DPOptimizer.load_state_dict: missing key {key!r} (got {sorted(state_dict)}).")
        if state_dict["clipping"] != self.clipping:
            raise ValueError(
                f"The checkpoint was trained with clipping={state_dict['clipping']!r}, this optimizer uses "
                f"{self.clipping!r}; resume with the same clipping mode."
            )
        self.original_optimizer.load_state_dict(state_dict["optimizer"])
        self.noise.load_state_dict(state_dict["noise"])
        self._ledger.steps = int(state_dict.get("steps", 0))

    def __repr__(self) -> str:
        return (
            f"DPOptimizer(clipping={self.clipping!r}, noise_multiplier={self.noise_multiplier}, "
            f"clip_norm={self.clip_norm}, optimizer={type(self.original_optimizer).__name__})"
        )
