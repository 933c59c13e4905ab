"""Node classification with random graph splits (DP-GCN, Igamberdiev & Habernal 2022): graph → subgraph examples.

Provable mode (default): the training nodes are split into s subgraphs by a secret keyed hash of each node's stable
id ``data.node_id``, not its row number (:func:`~lightning_dprel.datamodules.graph_splits.keyed_split`, data-independent), edges
between subgraphs are masked, and each step keeps each subgraph independently with probability q (Poisson sampling,
secret keyed stream). A node with its edges lies in one subgraph, so removing it changes one example: the
accountant's ``subgraph_replace`` mechanism.
Paper-faithful mode: the published pipeline — an equal-size random split, a fixed order of lots of ⌈q·s⌉ subgraphs,
and (``full_graph_forward=True``) each example's forward pass on the whole training graph. Its ε (``gcn_paper``)
does not hold; a warning says so.

Evaluation (val/test) runs on the whole graph with every node's features and edges: it is outside the guarantee,
which covers the training steps only (the released model).

Your own GNN (``as_pyg_batches=True``, provable mode only): each training batch is a PyG ``Batch`` of the sampled
subgraphs, each a ``Data(x, edge_index, y, train_mask)`` (local ids; ``train_mask`` = the example's loss mask), and
val/test batches are the whole graph as one ``Data`` with its three masks, so a plain LightningModule's steps run
unchanged; :attr:`example_view` (:class:`~lightning_dprel.core.example_views.SubgraphGraphs`) tells the privacy callback
that one subgraph is one example (one backward each). A sampled subgraph with no node is left out of the ``Batch``
(gradient 0, as :class:`DPNodeModule` gives it); an empty sample is a ``Batch`` with ``num_graphs == 0`` (a real step:
the noise is still released).

The mapping to the accountant's :class:`~lightning_dprel.core.specs.SamplingSpec`: one subgraph = one "node" with no
relations of its own, K = 1, k = 0, s examples, rate q, b = q·s — the per-example Poisson-subsampled Gaussian our
coupled accountant reduces to (tested against dp-accounting); the replace-one bound is built on it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_dprel.core.batch import ExampleBatch
from lightning_dprel.core.checks import check_choice, check_int, check_probability
from lightning_dprel.core.datamodule import StepStream, SteppedDataModule
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.datasets.nodes import NodeSource, stable_node_ids
from lightning_dprel.datamodules.graph_splits import equal_random_split, keyed_split, split_edges
from lightning_dprel.methods.dp_gcn.accounting import NODE_IN_SUBGRAPH
from lightning_dprel.methods.dp_gcn.batch import NodeEvalBatch

__all__ = ["NodeSplitDataModule", "MODES"]

MODES = ("provable", "paper_faithful")


class NodeSplitDataModule(SteppedDataModule):
    """Subgraph examples of a node-classification graph for DP-GCN (privacy unit: a node in one subgraph)."""

    privacy_unit = NODE_IN_SUBGRAPH.name

    def __init__(self, source: NodeSource, *, num_splits: int = 10, sampling_rate: float | None = None, mode: str = "provable",
                 full_graph_forward: bool = False, split_seed: int = 0, sampling_seed: int | None = None,
                 allow_row_ids: bool = False, as_pyg_batches: bool = False) -> None:
        """Check and keep the options; the graph is loaded and split in :meth:`setup`.

        Args:
            source: a :class:`~lightning_dprel.datamodules.datasets.nodes.NodeSource` (e.g. ``WordNetNodes``).
            num_splits: s ≥ 1 subgraphs (1: the whole training graph is one example, "DP-GCN without splits").
            sampling_rate: q in (0, 1], each subgraph's chance to be in a step (default: 1 for s = 1, else min(1, 10/s)).
            mode: ``"provable"`` (default) or ``"paper_faithful"``.
            full_graph_forward: paper-faithful only: each example's forward runs on the whole training graph (as the
                published code does; edges between subgraphs then leak across examples).
            split_seed: the paper-faithful equal-size split (public, data-dependent).
            allow_row_ids: let row numbers serve as node ids when the graph has no ``node_id`` (provable mode refuses
                otherwise: rows move when a node is removed).
            sampling_seed: None (default): the split key and the batches come from a secret keyed stream. An int makes them
                reproducible and voids the guarantee (a warning says so).
            as_pyg_batches: batches for your own LightningModule under ``PrivacyCallback`` (provable mode only): training
                batches are PyG ``Batch``es of subgraph ``Data(x, edge_index, y, train_mask)``, val/test the whole graph
                as one ``Data`` with ``train_mask``, ``val_mask``, ``test_mask``; :attr:`example_view` is set.
        """
        super().__init__()
        if not isinstance(source, NodeSource):
            raise TypeError(f"`source` must be a NodeSource (e.g. WordNetNodes, SyntheticNodes), got {type(source).__name__}.")
        check_int("num_splits", num_splits, 1)
        q = (1.0 if num_splits == 1 else min(1.0, 10.0 / num_splits)) if sampling_rate is None else float(sampling_rate)
        check_probability("sampling_rate", q, one=True)
        check_choice("mode", mode, MODES)
        if full_graph_forward and mode != "paper_faithful":
            raise ValueError("`full_graph_forward=True` reproduces the published pipeline and breaks the guarantee: it needs mode='paper_faithful'.")
        if as_pyg_batches and mode != "provable":
            raise ValueError(
                "`as_pyg_batches=True` makes your own module private under PrivacyCallback, which charges the provable "
                "'subgraph_replace' accountant (keyed split, Poisson-sampled subgraphs); the paper-faithful pipeline (an "
                "equal-size split, a fixed order of lots) does not satisfy it, so that ε would not hold. Use "
                "mode='provable', or DPNodeModule to reproduce the published pipeline."
            )
        if sampling_seed is not None:
            self.warn_seeded(f"NodeSplitDataModule(sampling_seed={sampling_seed})")
        if mode == "paper_faithful":
            warnings.warn(
                "NodeSplitDataModule(mode='paper_faithful'): an equal-size split, a fixed order of lots"
                + (" and a full-graph forward pass" if full_graph_forward else "")
                + " as published; no differential-privacy guarantee holds for this pipeline.", UserWarning, stacklevel=2,
            )
        self.source, self.num_splits, self.sampling_rate, self.mode = source, num_splits, q, mode
        self.full_graph_forward, self.split_seed = bool(full_graph_forward), int(split_seed)
        self.allow_row_ids = bool(allow_row_ids)
        self.as_pyg_batches = bool(as_pyg_batches)
        if self.as_pyg_batches:
            from lightning_dprel.core.example_views import SubgraphGraphs

            self.example_view = SubgraphGraphs()  # the privacy callback's per-example split: one subgraph each
        self.stream = KeyedStream("node-batches", seed=sampling_seed, _warn=False)
        self.data = None
        self._step = 0

    # --- facts ---------------------------------------------------------------------------------------------
    @property
    def sampling_spec(self) -> SamplingSpec:
        """s examples, rate q, K = 1, k = 0, b = q·s, for the unit "node in one subgraph" (N = training nodes)."""
        s, q = self.num_splits, self.sampling_rate
        self._require()
        return SamplingSpec(population=s, sampling_rate=q, expected_batch_size=q * s,
                            steps_per_epoch=max(1, math.ceil(1.0 / q)),
                            privacy_unit=self.privacy_unit, num_units=max(1, int(self.data.train_mask.sum())))

    @property
    def num_features(self) -> int:
        self._require()
        return int(self.data.x.shape[1])

    @property
    def num_classes(self) -> int:
        self._require()
        return int(self.data.num_classes)

    def _require(self) -> None:
        if self.data is None:
            self.setup("fit")

    # --- preparation ---------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        data = self.source.load()
        for key in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
            if getattr(data, key, None) is None:
                raise ValueError(f"{self.source!r} gave a graph without `{key}`; a NodeSource must set x, y, edge_index and the masks.")
        if not torch.isfinite(data.x).all():
            raise ValueError(f"{self.source!r}: node features contain NaN or inf; clean them before training.")
        if int(data.train_mask.sum()) < self.num_splits:
            raise ValueError(f"{int(data.train_mask.sum())} training nodes cannot fill num_splits={self.num_splits} subgraphs.")
        allow_rows = self.allow_row_ids or self.mode != "provable"
        ids = stable_node_ids(data, repr(self.source), allow_rows=allow_rows)  # rows only if allowed (warned)
        if getattr(data, "node_id", None) is not ids:
            data = data.clone()
            data.node_id = ids
        if self.mode == "provable":
            split = keyed_split(data.train_mask, self.num_splits, self.stream, node_ids=ids)
        else:
            split = equal_random_split(data.train_mask, self.num_splits, self.split_seed)
        self.data, self.split = data, split
        self.split_edge_index = split_edges(data.edge_index, split)
        train = data.train_mask
        self.train_edge_index = data.edge_index[:, train[data.edge_index[0]] & train[data.edge_index[1]]]
        members = [torch.nonzero(split == j).view(-1) for j in range(self.num_splits)]
        self._members = [m[torch.argsort(ids[m])] for m in members]  # by id: an example does not depend on row order
        self._order = torch.randperm(self.num_splits, generator=torch.Generator().manual_seed(self.split_seed))

    def example(self, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Subgraph j as ``(x, edge_index, y, loss_mask)`` (local ids), or the full training graph with its mask."""
        self._require()
        data, nodes = self.data, self._members[j]
        if self.full_graph_forward:
            mask = self.split[data.train_mask] == j
            idx = torch.nonzero(data.train_mask).view(-1)
            local = torch.full((data.num_nodes,), -1, dtype=torch.long)
            local[idx] = torch.arange(idx.numel())
            return data.x[idx], local[self.train_edge_index], data.y[idx], mask
        local = torch.full((data.num_nodes,), -1, dtype=torch.long)
        local[nodes] = torch.arange(nodes.numel())
        ei = self.split_edge_index[:, self.split[self.split_edge_index[0]] == j]
        return data.x[nodes], local[ei], data.y[nodes], torch.ones(nodes.numel(), dtype=torch.bool)

    def sampled(self, step: int) -> list[int]:
        """The subgraphs of global step ``step``: Poisson(q) from the keyed stream, or the published fixed order."""
        s, q = self.num_splits, self.sampling_rate
        if self.mode == "provable":
            return torch.nonzero(self.stream.child(step, "subgraphs").uniform(s) < q).view(-1).tolist()
        lot = max(1, math.ceil(q * s))
        start = (step * lot) % s
        return [int(self._order[(start + i) % s]) for i in range(lot)]

    def next_batch(self) -> Any:
        """Step ``_step``'s sampled subgraph examples, each ``(x, edge_index, y, loss_mask)`` local to its own ``x``
        (with ``as_pyg_batches``: a PyG ``Batch`` of them, :meth:`pyg_batch`)."""
        self._require()
        step, self._step = self._step, self._step + 1
        chosen = self.sampled(step)
        chosen = self.rank_share(chosen)  # the sum is all-reduced by the DP optimizer
        if self.as_pyg_batches:
            return self.pyg_batch(chosen)
        return ExampleBatch(examples=[self.example(j) for j in chosen], expected_batch_size=self.sampling_rate * self.num_splits,
                            step=step)

    def pyg_batch(self, chosen: list[int]) -> Any:
        """Subgraphs ``chosen`` as one PyG ``Batch`` of ``Data(x, edge_index, y, train_mask)``; a subgraph with no node to
        fit is left out (gradient 0); none left: an empty ``Batch`` (``num_graphs == 0``, the graph's feature width)."""
        from torch_geometric.data import Batch, Data

        graphs = []
        for j in chosen:
            x, edge_index, y, mask = self.example(j)
            if bool(mask.any()):
                graphs.append(Data(x=x, edge_index=edge_index, y=y, train_mask=mask))
        if graphs:
            return Batch.from_data_list(graphs)
        d, none = self.data, torch.zeros(0, dtype=torch.long)
        return Batch(x=d.x[:0], edge_index=d.edge_index[:, :0], y=d.y[:0], train_mask=torch.zeros(0, dtype=torch.bool),
                     batch=none, ptr=torch.zeros(1, dtype=torch.long))

    # --- loaders -------------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepStream(self), batch_size=None)

    def _eval(self, mask_name: str) -> DataLoader:
        self._require()
        d = self.data
        if self.as_pyg_batches:  # the whole graph with its public masks, as a plain PyG project's loaders give it
            from torch_geometric.data import Data

            graph = Data(x=d.x, edge_index=d.edge_index, y=d.y, train_mask=d.train_mask, val_mask=d.val_mask,
                         test_mask=d.test_mask)
            return DataLoader([graph], batch_size=None, collate_fn=lambda b: b)
        return DataLoader([NodeEvalBatch(d.x, d.edge_index, d.y, getattr(d, mask_name))], batch_size=None, collate_fn=lambda b: b)

    def val_dataloader(self) -> DataLoader:
        return self._eval("val_mask")

    def test_dataloader(self) -> DataLoader:
        return self._eval("test_mask")
