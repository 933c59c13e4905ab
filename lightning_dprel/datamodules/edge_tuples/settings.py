"""Settings for a new graph: the cap K from a DP estimate, batch and noise from public sizes and the budget (issue 24).

What is public here: the number of entities n and of training relations m (the accountant's γ = b/m and δ = 1/m
already treat them so), the budget, the public data. What is not: the degree distribution, on which K depends, so
:class:`DPDegreeCap` spends a stated sliver of the budget on a Gaussian estimate of it, charged to the model's ledger
as a :class:`~lightning_dprel.core.events.GaussianRelease` for the unit ``entity``.

Neighbouring relation of the estimate: the graph capped at the public bound ``k_max`` (every entity ≤ k_max
relations) taken as the dataset, one entity and its relations removed, the convention every capped run of this
library uses (see :func:`~lightning_dprel.datamodules.edge_tuples.sampling.cap_degree` for what it covers). Training
then reads the graph capped at K ≤ k_max: composing the two is exact when capping at k_max and at K removes nothing;
otherwise it rests on accepting both capped graphs as the dataset (removing an entity from the raw graph can add a
relation at a neighbour of either, cap_degree's case (c)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_int, check_probability, positive_finite
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.randomness import KeyedStream, check_stream

__all__ = ["survival_counts", "survival_sensitivity", "cap_for_share", "DegreeCapEstimate", "DPDegreeCap", "Settings", "suggest_settings", "choose_settings"]

#: γ = b/m of the HPO main job (1024 / 11,575), the rate the measured recipe was tuned at.
DEFAULT_SAMPLING_RATE = 0.09


def survival_counts(edge_index: Tensor, num_nodes: int, k_max: int) -> Tensor:
    """c_j = #{entities with at least j relations}, j = 1 … k_max (degrees of the simple undirected graph)."""
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"`edge_index` must have shape [2, m], got {tuple(edge_index.shape)}.")
    deg = torch.bincount(edge_index.long().flatten(), minlength=num_nodes).clamp_(max=k_max)
    return torch.bincount(deg, minlength=k_max + 1).flip(0).cumsum(0).flip(0)[1:].to(torch.float64)


def survival_sensitivity(k_max: int) -> float:
    """L2 sensitivity of (c_1 … c_kmax) to removing one entity of degree d ≤ k_max: √((k_max + 1)² + k_max − 1).

    The entity leaves c_1 … c_d (one each) and each of its d neighbours u leaves c_{d_u} (one each), so
    Δ = 1[j ≤ d] + n_j with n_j ≥ 0, Σ n_j = d; ‖Δ‖² is convex in n, largest with all d neighbours at j = 1:
    (1 + d)² + (d − 1), increasing in d.
    """
    return math.sqrt((k_max + 1) ** 2 + k_max - 1)


@dataclass(frozen=True)
class DegreeCapEstimate:
    """The released estimate: K, the noised survival counts it came from, and its charge."""

    max_degree: int
    kept_fraction: float
    keep: float
    k_max: int
    noise_multiplier: float
    noisy_counts: tuple[float, ...]

    @property
    def release(self) -> GaussianRelease:
        """What to charge to the model's ledger (``module.charge(estimate.release)``) before the first private step."""
        return GaussianRelease(self.noise_multiplier, "entity")

    def describe(self) -> dict[str, Any]:
        return {"max_degree": self.max_degree, "estimated_kept_fraction": round(self.kept_fraction, 4), "keep": self.keep,
                "k_max": self.k_max, "noise_multiplier": self.noise_multiplier, "sensitivity": survival_sensitivity(self.k_max)}


class DPDegreeCap:
    """Choose K as the smallest cap whose estimated share of relation endpoints kept, Σ_{j≤K} ĉ_j / Σ_j ĉ_j, is ≥ ``keep``.

    ĉ = c + N(0, (z·Δ₂)² I) with Δ₂ = :func:`survival_sensitivity` (Gaussian mechanism, α/(2z²) RDP), noise from a
    :class:`KeyedStream` (secret unless a seeded one is passed, for tests).

    Args:
        keep: share of relation endpoints to keep, in (0, 1]; 0.8 gives K = 5 on HPO (the cap the main job was tuned
            with: 0.82 of its endpoints) and K = 6 on WordNet nouns (a heavier tail).
        k_max: the public upper bound on K (and the cap of the graph the estimate reads).
        noise_multiplier: z; at 3 the σ that 500 steps need for ε = 10 on HPO rose from 8.49 to 8.61
            (``benchmarks/settings_for_new_graphs.py``).
        stream: the noise source (default: a secret ``KeyedStream``).
    """

    def __init__(self, keep: float = 0.8, k_max: int = 32, noise_multiplier: float = 3.0, *, stream: KeyedStream | None = None) -> None:
        check_probability("keep", keep, one=True)
        check_int("k_max", k_max, 1)
        positive_finite("noise_multiplier", noise_multiplier)
        if stream is not None:
            check_stream(stream)
        self.keep, self.k_max, self.noise_multiplier = float(keep), k_max, float(noise_multiplier)
        self.stream = stream if stream is not None else KeyedStream.secret("degree-cap")

    def estimate(self, edge_index: Tensor, num_nodes: int) -> DegreeCapEstimate:
        """Release ĉ for a graph whose degrees are ≤ ``k_max`` and choose K from it."""
        deg = torch.bincount(edge_index.long().flatten(), minlength=num_nodes)
        if deg.numel() and int(deg.max()) > self.k_max:
            raise ValueError(f"the graph has an entity of degree {int(deg.max())} > k_max = {self.k_max}; cap it at k_max "
                             f"first (RelationalDataModule(max_degree={self.k_max})): the sensitivity holds only then.")
        counts = survival_counts(edge_index, num_nodes, self.k_max)
        noise = self.stream.normal(self.k_max, self.noise_multiplier * survival_sensitivity(self.k_max), dtype=torch.float64)
        noisy = (counts + noise).clamp_(min=0.0)  # post-processing
        k, kept = cap_for_share(noisy, self.keep)
        return DegreeCapEstimate(k, kept, self.keep, self.k_max, self.noise_multiplier, tuple(noisy.tolist()))


def cap_for_share(counts: Tensor, keep: float) -> tuple[int, float]:
    """(K, share): the smallest K whose share of relation endpoints Σ_{j≤K} c_j / Σ_j c_j is ≥ ``keep``, and that share."""
    total = float(counts.sum())
    kept = counts.cumsum(0) / total if total > 0 else torch.ones(counts.numel(), dtype=torch.float64)
    reach = torch.nonzero(kept >= keep - 1e-12)
    k = int(reach[0]) + 1 if reach.numel() else counts.numel()
    return k, float(kept[k - 1])


@dataclass(frozen=True)
class Settings:
    """Training settings for a graph: cap, batch, steps and the σ that spends the budget, with b/σ to read them by."""

    max_degree: int
    expected_batch_size: int
    steps: int
    noise_multiplier: float
    target_epsilon: float
    delta: float
    num_relations: int
    degree_cap: DegreeCapEstimate | None = None

    @property
    def signal_to_noise(self) -> float:
        """b/σ: the expected clipped sum over its noise std in units of C (HPO at ε = 10: ≈ 155)."""
        return self.expected_batch_size / self.noise_multiplier

    def describe(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("max_degree", "expected_batch_size", "steps", "noise_multiplier", "target_epsilon",
                                             "delta", "num_relations")}
        out["signal_to_noise"] = round(self.signal_to_noise, 1)
        out["degree_cap"] = None if self.degree_cap is None else self.degree_cap.describe()
        return out


def suggest_settings(
    num_relations: int, num_nodes: int, *, target_epsilon: float, max_degree: int, delta: float | None = None,
    steps: int = 500, sampling_rate: float = DEFAULT_SAMPLING_RATE, neg_per_pos: int = 1, mechanism: str = "standard",
    spent: tuple[GaussianRelease, ...] = (),
) -> Settings:
    """b = γ·m (γ the rate the main job was tuned at), the given steps, and the σ that spends what ``spent`` leaves.

    Only public facts (m, n, K, the budget) enter; δ defaults to min(1/m, 1/n, 1e-5)."""
    from lightning_dprel.accounting import Accountant, noise_multiplier_for
    from lightning_dprel.datamodules.edge_tuples.coupled_stream import make_spec

    check_int("num_relations", num_relations, 1)
    check_probability("sampling_rate", sampling_rate, one=True)
    delta = min(1.0 / num_relations, 1.0 / num_nodes, 1e-5) if delta is None else float(delta)
    b = max(1, round(sampling_rate * num_relations))
    spec = make_spec(num_nodes, num_relations, max_degree=max_degree, expected_batch_size=b, neg_per_pos=neg_per_pos,
                     steps_per_epoch=None, max_overflow_probability=1e-6)
    acc = Accountant(mechanism)
    for release in spent:
        if release.unit != spec.privacy_unit:
            raise ValueError(f"a release for the unit {release.unit!r} cannot be composed with training for {spec.privacy_unit!r}.")
        acc.step(None, release.noise_multiplier, release.count, mechanism=release.mechanism)
    sigma = noise_multiplier_for(target_epsilon, delta=delta, steps=steps, sampling=spec, mechanism=mechanism, spent=acc)
    return Settings(max_degree, b, steps, float(sigma), float(target_epsilon), delta, num_relations)


def choose_settings(
    make_datamodule: Callable[..., Any], *, target_epsilon: float, module: Any = None, degree_cap: DPDegreeCap | None = None,
    **suggest: Any,
) -> tuple[Any, Settings]:
    """The recipe for a new graph: ``make_datamodule(max_degree=..., expected_batch_size=...)`` builds a
    :class:`RelationalDataModule`; a probe capped at ``degree_cap.k_max`` gives the DP estimate of K; the final datamodule
    is capped at K with b = γ·m and carries the estimate as a data release (:meth:`PrivateDataModule.record_release`), so
    whichever model trains on it is charged for it once (``module``, if given, at once).
    """
    for name in ("max_degree", "spent"):
        if name in suggest:
            raise TypeError(f"choose_settings sets `{name}` itself (from the DP estimate); do not pass it.")
    if module is not None and not callable(getattr(module, "charge_data_releases", None)):
        raise TypeError("`module` must be None or a lightning_dprel private model (a PrivateModule; it is charged for the estimate), got "
                        f"{type(module).__name__}.")
    cap = degree_cap if degree_cap is not None else DPDegreeCap()
    probe = make_datamodule(max_degree=cap.k_max, expected_batch_size=1)
    probe.setup("fit")
    estimate = cap.estimate(probe.train_edges, probe.sampling_spec.num_nodes)
    sized = make_datamodule(max_degree=estimate.max_degree, expected_batch_size=1)
    sized.setup("fit")
    spec = sized.sampling_spec
    settings = suggest_settings(spec.num_edges, spec.num_nodes, target_epsilon=target_epsilon, max_degree=estimate.max_degree,
                                spent=(estimate.release,), **suggest)
    settings = Settings(**{**settings.__dict__, "degree_cap": estimate})
    final = make_datamodule(max_degree=estimate.max_degree, expected_batch_size=settings.expected_batch_size)
    final.record_release(estimate.release)  # the estimate travels with the data: any model trained on it is charged
    if module is not None:
        module.charge_data_releases(final)  # released now: charged whatever happens next
    return final, settings
