"""Node classifiers on PyG message passing: GCN (Kipf & Welling 2017), GraphSAGE, GAT, or an MLP without edges.

``conv="none"`` is the no-graph baseline: the same layers with the neighbourhood aggregation removed.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprel.core.checks import check_choice, check_int, check_probability

__all__ = ["GNNClassifier", "CONVS"]

CONVS = ("gcn", "sage", "gat", "none")


class GNNClassifier(nn.Module):
    """``num_layers`` graph convolutions with ReLU and dropout; logits ``[N, num_classes]`` (the paper: 2 layers, 32, 0.5).

    Args:
        in_dim: node feature dimension.
        num_classes: output classes.
        hidden_dim: width of the hidden layers.
        num_layers: convolutions (≥ 1).
        dropout: dropout on the inputs of each layer.
        conv: ``"gcn"``, ``"sage"``, ``"gat"`` or ``"none"`` (an MLP: edges ignored).
    """

    def __init__(self, in_dim: int, num_classes: int, *, hidden_dim: int = 32, num_layers: int = 2, dropout: float = 0.5, conv: str = "gcn") -> None:
        super().__init__()
        sizes = {"in_dim": in_dim, "num_classes": num_classes, "hidden_dim": hidden_dim}
        for name, value in {**sizes, "num_layers": num_layers}.items():
            check_int(name, value, 1)
        check_choice("conv", conv, CONVS)
        check_probability("dropout", dropout, zero=True)
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [num_classes]
        make = {"gcn": lambda a, b: GCNConv(a, b, cached=False), "sage": SAGEConv, "gat": lambda a, b: GATConv(a, b, heads=1),
                "none": nn.Linear}[conv]
        self.layers = nn.ModuleList(make(dims[i], dims[i + 1]) for i in range(num_layers))
        self.conv, self.dropout = conv, float(dropout)
        self.init_args = {"in_dim": in_dim, "num_classes": num_classes, "hidden_dim": hidden_dim, "num_layers": num_layers,
                          "dropout": float(dropout), "conv": conv}

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = layer(x) if self.conv == "none" else layer(x, edge_index)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x
