"""AdvSGM's generators: per-node parameters θ^G that give fake neighbours v' (AdvSGM Section II-B1, Eq. 17).

Provable mode: the generator is post-processing. It reads only released tables (after the noised step) and public
ids, its randomness is keyed, and its fakes enter the next step's per-tuple loss as constants, so each tuple's
whole gradient (adversarial terms included) is clipped with the tuple. Paper-faithful mode: the authors' code, whose
fakes are the generator's normalised rows and whose generator trains on real edges (Algorithm 3 line 17: it reads E).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprel.methods.advsgm.losses import log_sigmoid

__all__ = ["FakeNeighbours"]


class FakeNeighbours(nn.Module):
    """θ^G ``[n, r]``; the fake neighbour of node j is θ^G_j + s·ξ (provable) or θ^G_j/‖θ^G_j‖ (paper code).

    Args:
        num_nodes: n.
        dim: r.
        noise_std: s, the scale of the keyed perturbation ξ ~ N(0, I) of the provable fakes (the paper's ξ ⊙ θ^G).
        lr: the generator's Adam learning rate.
        seed: public initialisation seed.
    """

    def __init__(self, num_nodes: int, dim: int, *, noise_std: float = 0.1, lr: float = 0.01, seed: int = 1) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(int(seed))
        self.theta = nn.Parameter(torch.randn(num_nodes, dim, generator=gen) / dim**0.5)
        self.noise_std, self.lr = float(noise_std), float(lr)
        self._opt: torch.optim.Optimizer | None = None

    def fakes(self, ids: Tensor, noise: Tensor | None = None, *, normalised: bool = False) -> Tensor:
        """Fake neighbours of ``ids`` (constants for the discriminator): ``[..., r]``."""
        rows = self.theta.detach()[ids.long()]
        if normalised:
            return F.normalize(rows, dim=-1)
        return rows if noise is None else rows + self.noise_std * noise.to(rows.dtype).reshape(rows.shape)

    def _optimizer(self) -> torch.optim.Optimizer:
        if self._opt is None:
            self._opt = torch.optim.Adam([self.theta], lr=self.lr)
        return self._opt

    def fit_released(self, node_vectors: Tensor, context_vectors: Tensor, ids: Tensor, noise: Tensor) -> float:
        """One generator step (Eq. 17) on released tables: make v'_j score high with v_j and c_j, for public ids j."""
        with torch.enable_grad():
            v, c = node_vectors.detach()[ids], context_vectors.detach()[ids]
            fake = self.theta[ids] + self.noise_std * noise.to(v.dtype).reshape(v.shape)
            loss = -(log_sigmoid((v * fake).sum(-1)) + log_sigmoid((fake * c).sum(-1))).mean()
            return self._step(loss)

    def fit_edges(self, node_vectors: Tensor, context_vectors: Tensor, edges: Tensor, sigmoid: str = "constrained") -> float:
        """The authors' generator step on real neighbours (i, j) ∈ E (Algorithm 3 line 17; reads E: paper mode only)."""
        with torch.enable_grad():
            i, j = edges[:, 0].long(), edges[:, 1].long()
            fake_j, fake_i = F.normalize(self.theta[j], dim=-1), F.normalize(self.theta[i], dim=-1)
            v, c = node_vectors.detach(), context_vectors.detach()
            loss = -(log_sigmoid((v[i] * fake_j).sum(-1), sigmoid) + log_sigmoid((fake_i * c[j]).sum(-1), sigmoid)).mean()
            return self._step(loss)

    def _step(self, loss: Tensor) -> float:
        opt = self._optimizer()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())
