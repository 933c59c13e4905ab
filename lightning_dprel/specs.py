"""The facts the accountant needs, as frozen records (one fact, one place).

A datamodule tells the accountant *how it samples* (:class:`SamplingSpec`); a module tells it *how it
clips and noises* (:class:`NoiseSpec`). The privacy callback reads both and never guesses either.

Compatibility rule (after dp_accounting's ``dp_event.py``): fields are never removed and never change
meaning; new fields arrive optional, with a default that keeps the old meaning.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees. Algorithm 3 (coupled sampling), Eq. 3 and Theorem C.1 (accounting).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SamplingSpec", "NoiseSpec", "CLIPPING_MODES", "ACCOUNTING_MODES", "PRIVACY_UNIT"]

#: The privacy unit of every mechanism in this package unless its docs say otherwise.
PRIVACY_UNIT = (
    "one entity: a node together with all of its relations (edges); neighbouring graphs differ by "
    "adding or removing one node and its at most K capped edges (node-level DP, add/remove)"
)

CLIPPING_MODES = ("freq", "standard", "none")
ACCOUNTING_MODES = ("corrected", "paper")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} ({value!r}).")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}.")


@dataclass(frozen=True)
class SamplingSpec:
    """How a relational datamodule samples one step (Algorithm 3, lines 1-3).

    Each step draws positives E⁺ by Poisson sampling of the ``num_edges`` capped edges Ē at rate
    ``sampling_rate`` γ = b / |Ē|, then ``neg_per_pos`` · |E⁺| negative nodes *without replacement*,
    uniformly from all ``num_nodes`` nodes, independent of which positives were drawn (Algorithm 2,
    NEG-SAMPLE-WOR). After degree capping every node has at most ``max_degree`` capped edges.

    Args:
        num_nodes: n = |V|.
        num_edges: m = |Ē|, undirected edges after degree capping.
        max_degree: K, the cap on every node's degree in Ē.
        sampling_rate: γ in (0, 1], the Poisson rate of positives.
        neg_per_pos: k ≥ 0, negatives per positive tuple.
        expected_batch_size: b = γ·m; the private step divides by b, never by |E⁺|.
        steps_per_epoch: ceil(1/γ).
    """

    num_nodes: int
    num_edges: int
    max_degree: int
    sampling_rate: float
    neg_per_pos: int
    expected_batch_size: float
    steps_per_epoch: int

    def __post_init__(self) -> None:
        _check_int("num_nodes", self.num_nodes, 1)
        _check_int("num_edges", self.num_edges, 1)
        _check_int("max_degree", self.max_degree, 1)
        _check_int("neg_per_pos", self.neg_per_pos, 0)
        _check_int("steps_per_epoch", self.steps_per_epoch, 1)
        if not (0.0 < float(self.sampling_rate) <= 1.0):
            raise ValueError(f"`sampling_rate` must be in (0, 1], got {self.sampling_rate}.")
        if not (float(self.expected_batch_size) > 0.0) or math.isinf(self.expected_batch_size):
            raise ValueError(f"`expected_batch_size` must be > 0 and finite, got {self.expected_batch_size}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NoiseSpec:
    """How a private module clips and noises one step (Algorithm 3, lines 4-5).

    The clipped per-tuple gradients are summed, N(0, σ²C²I) is added once per step (globally, not
    per rank), and the result is divided by the expected batch size b.

    Args:
        noise_multiplier: σ ≥ 0; the noise std on the clipped sum is σ·C.
        clip_norm: C > 0.
        clipping: ``"freq"`` (Algorithm 1, FREQ-CLIP: tuple i clipped to C / (2·max-freq_i)),
            ``"standard"`` (every tuple clipped to C), or ``"none"`` (non-private baseline, σ must be 0).
        accounting: for ``clipping="freq"``: ``"corrected"`` (default; sensitivity profile
            Δ_freq(i, j) = C(1/2 + 3j/4 + i(1+k)/4), which holds) or ``"paper"`` (Eq. 3 as
            published, Δ ≡ C; rests on Proposition 4.1, which does not hold as stated). Any clipping: the
            name of a mechanism registered with ``register_mechanism(..., clipping=(clipping,))``.
    """

    noise_multiplier: float
    clip_norm: float
    clipping: str = "freq"
    accounting: str = "corrected"

    def __post_init__(self) -> None:
        if self.clipping not in CLIPPING_MODES:
            raise ValueError(f"`clipping` must be one of {CLIPPING_MODES}, got {self.clipping!r}.")
        if not isinstance(self.accounting, str) or not self.accounting:
            raise ValueError(
                f"`accounting` must be one of {ACCOUNTING_MODES} or a registered mechanism name, got {self.accounting!r}."
            )
        if not (float(self.noise_multiplier) >= 0.0) or math.isinf(self.noise_multiplier):
            raise ValueError(f"`noise_multiplier` must be >= 0 and finite, got {self.noise_multiplier}.")
        if not (float(self.clip_norm) > 0.0) or math.isinf(self.clip_norm):
            raise ValueError(f"`clip_norm` must be > 0 and finite, got {self.clip_norm}.")
        if self.clipping == "none" and self.noise_multiplier != 0.0:
            raise ValueError(
                "`clipping='none'` is the non-private baseline and needs `noise_multiplier=0`, "
                f"got {self.noise_multiplier}."
            )

    @property
    def is_private(self) -> bool:
        return self.clipping != "none" and self.noise_multiplier > 0.0

    @property
    def mechanism(self) -> str:
        """The accountant mechanism name: ``freq_corrected``, ``freq_paper``, ``standard``, ``none``, or the
        registered mechanism named by ``accounting`` (checked against the registry by the ledger)."""
        if self.clipping == "none":
            return "none"
        if self.accounting not in ACCOUNTING_MODES:
            return self.accounting
        return f"freq_{self.accounting}" if self.clipping == "freq" else self.clipping

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
