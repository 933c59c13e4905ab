"""White-box audit of the real private step with gradient canaries (every noised update released).

The threat model of DP-SGD: the adversary sees every released (noised, scaled) update and chooses each tuple's
gradient; the guarantee must hold for any gradients. Each canary owns a coordinate; its tuples' gradients are
G·(±e_c) with G ≫ C (see :mod:`lightning_dprel.audit.canaries`). Batches come from the library's sampler
(:func:`~lightning_dprel.datamodules.edge_tuples.sampling.poisson_positives`, :func:`~lightning_dprel.datamodules.edge_tuples.sampling.neg_sample_wor`,
:func:`~lightning_dprel.datamodules.edge_tuples.sampling.max_freq`) and the step is :class:`~lightning_dprel.core.optim.DPOptimizer`'s (clip,
sum, one noise draw from the keyed stream, ÷ b), over one parameter θ ∈ R^m with SGD at lr 1.

Score of canary c = b · Σ_t (released update_t)[c] (with SGD this is also −b·θ_T[c]: the final model). b is
public: γ times the edge count of the graph with every canary in, in every world.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_dprel.audit.canaries import CanaryGraph, check_int
from lightning_dprel.core.checks import check_choice, check_probability
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.grad_sample.per_tuple import TupleGradients
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.datamodules.edge_tuples.sampling import max_freq, neg_sample_wor, poisson_positives
from lightning_dprel.core.specs import NoiseSpec, SamplingSpec

__all__ = ["CanaryGrads", "WhiteBoxSetting", "canary_scores", "sampling_spec"]


class CanaryGrads(TupleGradients):
    """Tuple i's gradient is G·sign_i·e_{owner_i} ∈ R^m: norms G, clipped sums by one scatter-add."""

    def __init__(self, owner: Tensor, sign: Tensor, dim: int, magnitude: float) -> None:
        self.names = ("theta",)
        self.size = int(owner.numel())
        self.owner, self.sign, self.dim, self.magnitude = owner, sign.double(), dim, float(magnitude)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"theta": (self.dim,)}

    def norms(self) -> Tensor:
        return torch.full((self.size,), self.magnitude, dtype=torch.float64)

    def weighted_sum(self, factors: Tensor) -> dict[str, Tensor]:
        out = torch.zeros(self.dim, dtype=torch.float64)
        return {"theta": out.index_add_(0, self.owner, factors.double() * self.sign * self.magnitude)}


@dataclass(frozen=True)
class WhiteBoxSetting:
    """One mechanism to audit: clipping, accounting, σ, C, γ, T, k (as :class:`~lightning_dprel.core.specs.NoiseSpec`)."""

    name: str
    clipping: str = "freq"
    accounting: str = "corrected"
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0
    sampling_rate: float = 1.0
    steps: int = 4
    neg_per_pos: int = 0
    magnitude: float = 10.0

    def __post_init__(self) -> None:
        NoiseSpec(self.noise_multiplier, self.clip_norm, self.clipping, self.accounting)  # σ ≥ 0, C > 0, none ⇒ σ = 0
        check_choice("accounting", self.accounting, ("corrected", "paper"))
        if self.accounting == "paper" and self.clipping != "freq":
            raise ValueError("`accounting='paper'` (Eq. 3) is FREQ-CLIP's published accounting; use it with clipping='freq'.")
        check_int("steps", self.steps, 1)
        check_int("neg_per_pos", self.neg_per_pos, 0)
        check_probability("sampling_rate", self.sampling_rate, one=True)
        if not float(self.magnitude) > float(self.clip_norm):
            raise ValueError(
                f"`magnitude` G = {self.magnitude} must exceed `clip_norm` C = {self.clip_norm}: canaries clipped to "
                "less than their threshold do not test the bound."
            )


def sampling_spec(graph: CanaryGraph, setting: WhiteBoxSetting) -> SamplingSpec:
    """The :class:`SamplingSpec` the accountant sees: the graph with every canary in, K = its largest degree."""
    num_edges = int(graph.edges.shape[0])
    degree = int(torch.bincount(graph.edges.reshape(-1), minlength=graph.num_nodes).max())
    return SamplingSpec(
        num_nodes=graph.num_nodes, num_edges=num_edges, max_degree=degree, sampling_rate=float(setting.sampling_rate),
        neg_per_pos=setting.neg_per_pos, expected_batch_size=float(setting.sampling_rate) * num_edges,
        steps_per_epoch=max(1, round(1.0 / float(setting.sampling_rate))),
    )


def canary_scores(
    graph: CanaryGraph, included: Tensor, setting: WhiteBoxSetting, *,
    noise: KeyedStream | None = None, sampling: KeyedStream | None = None,
) -> Tensor:
    """``[m]`` white-box scores b·Σ_t update_t[c] of one training run in which canary c is in iff ``included[c]``.

    ``noise`` / ``sampling``: the keyed streams of the step's noise and batches (secret by default).
    """
    edge_idx, nodes = graph.world(included)
    edges, owner, sign = graph.edges[edge_idx], graph.owner[edge_idx], graph.sign[edge_idx]
    spec = sampling_spec(graph, setting)
    sampling = sampling if sampling is not None else KeyedStream.secret("audit-sampling")
    theta = nn.Parameter(torch.zeros(graph.num_canaries, dtype=torch.float64))
    sigma = setting.noise_multiplier if setting.clipping != "none" else 0.0
    opt = DPOptimizer(
        torch.optim.SGD([theta], lr=1.0), named_params={"theta": theta}, noise_multiplier=sigma,
        clip_norm=setting.clip_norm, clipping=setting.clipping, accounting=setting.accounting, noise=noise,
    )
    total = torch.zeros(graph.num_canaries, dtype=torch.float64)
    for _ in range(setting.steps):
        if edges.shape[0]:
            pos_idx = poisson_positives(int(edges.shape[0]), setting.sampling_rate, generator=sampling)
        else:  # every canary out of a design without other edges: empty steps (noise only)
            pos_idx = torch.zeros(0, dtype=torch.long)
        neg, _ = neg_sample_wor(int(pos_idx.numel()), setting.neg_per_pos, int(nodes.numel()), generator=sampling)
        pos = edges[pos_idx]
        grads = CanaryGrads(owner[pos_idx], sign[pos_idx], graph.num_canaries, setting.magnitude)
        opt.record(grads, max_freq=max_freq(pos, nodes[neg]), expected_batch_size=spec.expected_batch_size)
        before = theta.detach().clone()
        opt.step()
        total += (before - theta.detach()) * spec.expected_batch_size
    return total
