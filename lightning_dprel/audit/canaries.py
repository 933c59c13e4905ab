"""Canary entities and their secret coins: what an audit inserts into the training graph, and whether it did.

A canary is a node with its relations. Its coin decides, before training, whether the node and every one of
its edges are in the training graph (in) or absent from it, node included (out): the entity-level
neighbouring relation of :data:`lightning_dprel.datamodules.edge_tuples.spec.PRIVACY_UNIT`. Coins are fair, independent and drawn
from the cryptographic keyed stream, so nothing the training run sees predicts them.

Two designs of *gradient canaries* (the white-box, DP-SGD threat model: the adversary chooses each tuple's
gradient; the guarantee must hold for any):

- ``"dirac"``: canary c has K edges (c, p_j); each of its tuples' gradients points along its own
  coordinate e_c. Partners have no other edge.
- ``"freq_adversarial"`` (the spec's counterexample to Proposition 4.1): as ``"dirac"``, and every partner p_j
  also has one edge (p_j, w_j), always present, whose gradient points along −e_c. Including c raises p_j's
  frequency, which halves the FREQ-CLIP threshold of (p_j, w_j): the clipped sum moves along e_c by
  C/2 + K·C/4 when all is sampled, the corrected profile Δ_freq(K, 0), not the C that Eq. 3 assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_dprel.core.checks import check_choice, check_int  # check_int: re-exported
from lightning_dprel.core.randomness import KeyedStream, check_stream

__all__ = ["DESIGNS", "CanaryGraph", "canary_graph", "check_int", "secret_coins"]

DESIGNS = ("dirac", "freq_adversarial")


def secret_coins(m: int, *, stream: KeyedStream | None = None) -> Tensor:
    """``[m]`` fair, independent coins (True = include) from a keyed CSPRNG stream (secret by default)."""
    check_int("m (the number of canaries)", m, 1)
    if stream is not None:
        check_stream(stream, why="coins from a seeded torch/numpy generator can be predicted by the training run")
    stream = stream if stream is not None else KeyedStream.secret("audit-coins")
    raw = torch.frombuffer(bytearray(stream.bytes(m)), dtype=torch.uint8)
    return (raw & 1).bool()


@dataclass(frozen=True)
class CanaryGraph:
    """Edges of all canary structures, node ids, and each edge's gradient coordinate and sign.

    ``edges`` ``[E, 2]``; ``owner`` ``[E]`` the canary whose coordinate the edge's gradient uses; ``sign`` ``[E]``
    ±1; ``removable`` ``[E]`` True for the canary's own edges (absent when its coin says out); nodes
    ``0..m-1`` are the canaries, then partners, fillers and ``extra_nodes`` isolated nodes (negatives only).
    """

    design: str
    num_canaries: int
    degree: int
    num_nodes: int
    edges: Tensor
    owner: Tensor
    sign: Tensor
    removable: Tensor

    def world(self, included: Tensor) -> tuple[Tensor, Tensor]:
        """(edge indices, node ids) of the training graph in which canary c is present iff ``included[c]``."""
        included = torch.as_tensor(included, dtype=torch.bool)
        if included.shape != (self.num_canaries,):
            raise ValueError(f"`included` must have shape [{self.num_canaries}], got {tuple(included.shape)}.")
        keep = ~self.removable | included[self.owner]
        nodes = torch.ones(self.num_nodes, dtype=torch.bool)
        nodes[: self.num_canaries] = included
        return torch.nonzero(keep).squeeze(1), torch.nonzero(nodes).squeeze(1)


def canary_graph(design: str, num_canaries: int, degree: int, *, extra_nodes: int = 0) -> CanaryGraph:
    """The gradient-canary graph of ``design`` (see the module docstring) with degree K = ``degree``."""
    check_choice("design", design, DESIGNS)
    for name, val, low in (("num_canaries", num_canaries, 2), ("degree", degree, 1), ("extra_nodes", extra_nodes, 0)):
        check_int(name, val, low)
    m, k = num_canaries, degree
    canary = torch.arange(m).repeat_interleave(k)
    partner = m + torch.arange(m * k)
    edges = [torch.stack([canary, partner], 1)]
    owner, sign, removable = [canary], [torch.ones(m * k)], [torch.ones(m * k, dtype=torch.bool)]
    num_nodes = m + m * k
    if design == "freq_adversarial":
        filler = num_nodes + torch.arange(m * k)
        edges.append(torch.stack([partner, filler], 1))
        owner.append(canary)
        sign.append(-torch.ones(m * k))
        removable.append(torch.zeros(m * k, dtype=torch.bool))
        num_nodes += m * k
    return CanaryGraph(
        design=design, num_canaries=m, degree=k, num_nodes=num_nodes + extra_nodes, edges=torch.cat(edges),
        owner=torch.cat(owner), sign=torch.cat(sign), removable=torch.cat(removable),
    )
