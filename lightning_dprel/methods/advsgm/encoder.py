"""Skip-gram's two tables as an encoder: node vectors W_in and context vectors W_out (AdvSGM Section II-B, Eq. 2)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_dprel.core.checks import check_int, non_negative

__all__ = ["NodeIdEmbedding"]


class NodeIdEmbedding(nn.Module):
    """Row i of the output is ``[v_i ‖ c_i]``: node vector v_i = W_in[i] and context vector c_i = W_out[i] (Eq. 2).

    The directed score of a pair is v_a·c_b (LINE, second order). Each output row depends on its own id only and each
    table is called once per forward, so ghost clipping is exact here (``ghost_safe``): a tuple's gradient norm comes
    from the Gram of its ids, never from a per-tuple copy of the tables.

    Args:
        num_nodes: n, the public id universe (one row per id in both tables).
        dim: r, the embedding width.
        init_std: both tables start as N(0, init_std²/r) per coordinate (public randomness, ``seed``).
        seed: seed of the initialisation (public: the initial tables carry no private information).
    """

    ghost_safe = True

    def __init__(self, num_nodes: int, dim: int = 128, *, init_std: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        num_nodes, dim = check_int("num_nodes", num_nodes, 1), check_int("dim", dim, 1)
        non_negative("init_std", init_std)
        self.init_args = {"num_nodes": num_nodes, "dim": dim, "init_std": float(init_std), "seed": int(seed)}
        self.node_vectors = nn.Embedding(num_nodes, dim)
        self.context_vectors = nn.Embedding(num_nodes, dim)
        gen = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for table in (self.node_vectors, self.context_vectors):
                table.weight.copy_(torch.randn(num_nodes, dim, generator=gen) * (float(init_std) / dim**0.5))

    @property
    def dim(self) -> int:
        return self.node_vectors.embedding_dim

    def forward(self, node_id: Tensor) -> Tensor:
        """``[..., 2r]`` rows ``[v_i ‖ c_i]`` for the ids ``node_id`` ``[...]``."""
        node_id = node_id.long()
        return torch.cat([self.node_vectors(node_id), self.context_vectors(node_id)], dim=-1)
