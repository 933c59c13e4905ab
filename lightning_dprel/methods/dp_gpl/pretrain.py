"""The frozen GNN Φ, pre-trained on the public graph only (DP-GPL Sec. 2.2): PyG's ``DeepGraphInfomax`` or edge prediction."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, DeepGraphInfomax, GAE
from torch_geometric.utils import negative_sampling

from lightning_dprel.core.checks import check_choice
from lightning_dprel.progress import ProgressLog

__all__ = ["GraphEncoder", "pretrain", "freeze", "PRETRAINING"]

PRETRAINING = ("dgi", "edge_prediction", "none")


class GraphEncoder(nn.Module):
    """A ``num_layers`` GCN or GAT with PReLU between layers (DGI's encoder, Veličković et al. 2019)."""

    def __init__(self, in_dim: int, hidden_dim: int = 128, *, num_layers: int = 2, conv: str = "gcn") -> None:
        super().__init__()
        check_choice("conv", conv, ("gcn", "gat"))
        make = (lambda i, o: GCNConv(i, o)) if conv == "gcn" else (lambda i, o: GATConv(i, o, heads=1))
        dims = [in_dim] + [hidden_dim] * num_layers
        self.convs = nn.ModuleList(make(i, o) for i, o in zip(dims[:-1], dims[1:]))
        self.act = nn.PReLU(hidden_dim)
        self.in_dim, self.out_dim, self.num_layers = in_dim, hidden_dim, num_layers

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for conv in self.convs:
            x = self.act(conv(x, edge_index))
        return x


def _corrupt(x: Tensor, edge_index: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    return x[torch.randperm(x.shape[0], generator=generator)], edge_index


def pretrain(encoder: GraphEncoder, x: Tensor, edge_index: Tensor, *, method: str = "dgi", epochs: int = 100,
             lr: float = 1e-3, seed: int = 0) -> GraphEncoder:
    """Pre-train ``encoder`` on a **public** graph (x, edge_index) by DGI or edge prediction (GAE), then freeze it."""
    check_choice("method", method, PRETRAINING)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if method == "dgi":
        model = DeepGraphInfomax(encoder.out_dim, encoder, lambda z, *a, **k: torch.sigmoid(z.mean(0)),
                                 corruption=lambda x, ei: _corrupt(x, ei, gen))
    elif method == "edge_prediction":
        model = GAE(encoder)
    else:
        model = None
    if model is not None and epochs > 0:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        log = ProgressLog(f"pre-training Φ ({method}) on the public graph", int(epochs), unit="epochs")
        for epoch in range(int(epochs)):
            opt.zero_grad()
            if method == "dgi":
                loss = model.loss(*model(x, edge_index))
            else:
                z = encoder(x, edge_index)
                neg = negative_sampling(edge_index, num_nodes=x.shape[0]) if edge_index.numel() else None
                loss = model.recon_loss(z, edge_index, neg) if neg is not None else z.pow(2).mean()
            loss.backward()
            opt.step()
            log.update(epoch + 1)
        log.close()
    return freeze(encoder)


def freeze(encoder: nn.Module) -> nn.Module:
    """Φ frozen: no mode-dependent layer (no dropout or norm), so freezing is ``requires_grad`` alone."""
    for p in encoder.parameters():
        p.requires_grad_(False)
    return encoder
