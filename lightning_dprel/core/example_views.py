"""How a user's batch splits into its privacy units' examples (the per-example side of DP-SGD, Abadi et al. 2016, Alg. 1).

A private loader states its view next to its SamplingSpec; the privacy callback asks the view for the examples of a
batch and hands each, as a batch of one, to the user's own ``training_step``:

- :class:`TensorRows`: row i of every tensor (a ``TensorDataset``'s tuple, a dict of tensors); one example is the batch
  of that row. Stackable, so per-example gradients come from one ``torch.func.vmap``.
- :class:`LinkTuples`: one coupled edge tuple (a positive and its k negatives, Algorithm 3) of a PyG link-prediction
  batch (``x``, ``n_id``, ``edge_label_index``, ``edge_label``); every tuple has 2 + k nodes, so it stacks too.
- :class:`SubgraphGraphs`: one subgraph of a PyG ``Batch`` (DP-GCN's random graph splits); sizes differ, so one
  backward per example.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor

__all__ = ["ExampleView", "TensorRows", "LinkTuples", "SubgraphGraphs", "tree_map", "empty_like_rows"]


def tree_map(fn: Any, tree: Any) -> Any:
    """``fn`` on every tensor of a (nested) tuple / list / dict; other leaves unchanged."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, Mapping):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(tree_map(fn, v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v) for v in tree)
    return tree


class ExampleView:
    """The examples (one per privacy unit) of a batch, each as a batch of one the user's ``training_step`` accepts."""

    #: True when the examples stack along one dimension (one vmap); False: one backward per example.
    stacks: bool = True
    #: True when the full batch's loss must be the mean or sum of the examples' (checked once before the first step).
    checks_reduction: bool = True

    def size(self, batch: Any) -> int:
        raise NotImplementedError

    def stacked(self, batch: Any) -> Any:
        """The batch as a tree of tensors with leading dimension B (what vmap maps over)."""
        raise NotImplementedError

    def one(self, example: Any) -> Any:
        """One stacked example (leading dimension removed) as the batch of one the user's step takes."""
        raise NotImplementedError

    def head(self, batch: Any, n: int) -> Any:
        """A batch of the first ``n`` examples (for a check that needs a few; a view that cannot cut keeps them all)."""
        return batch

    def in_dims(self, stacked: Any) -> Any:
        """vmap's ``in_dims`` for :meth:`stacked`: 0 for every tensor (a view with shared tensors says None for them)."""
        return tree_map(lambda t: 0, stacked)

    def describe(self) -> str:
        """What one example is, in the user's terms, for an error the user's step raised on it ("": nothing to add)."""
        return ""

    def examples(self, batch: Any) -> Iterator[Any]:
        """Each example as a batch of one (the loop path)."""
        stacked = self.stacked(batch)
        for i in range(self.size(batch)):
            yield self.one(tree_map(lambda t, i=i: t[i], stacked))


def _text_fields(tree: Any, path: str = "batch") -> list[str]:
    """Paths of the lists or tuples of strings in a batch (named, never shown: they are private)."""
    if isinstance(tree, Mapping):
        return [p for k, v in tree.items() for p in _text_fields(v, f"{path}[{k!r}]")]
    if isinstance(tree, (list, tuple)):
        if tree and all(isinstance(v, (str, bytes)) for v in tree):
            return [path]
        return [p for i, v in enumerate(tree) for p in _text_fields(v, f"{path}[{i}]")]
    return []


class TensorRows(ExampleView):
    """Row i of every tensor of the batch is example i (``TensorDataset``, dicts of tensors).

    ``shared`` names keys of a dict batch that every example shares whole, not by row: public randomness the datamodule
    draws from the keyed stream independently of the data (a sampled softmax's item ids). Each example's batch of one
    holds them as they are, and vmap does not map over them."""

    def __init__(self, shared: tuple[str, ...] = ()) -> None:
        self.shared = tuple(shared)

    def _by_row(self, batch: Any, fn: Any, shared: Any = lambda v: v) -> Any:
        """``fn`` on every row tensor, ``shared`` on each shared key's value."""
        if self.shared and isinstance(batch, Mapping):
            return {k: shared(v) if k in self.shared else tree_map(fn, v) for k, v in batch.items()}
        return tree_map(fn, batch)

    def _rows(self, batch: Any) -> Any:
        if self.shared and isinstance(batch, Mapping):
            for k in self.shared:
                v = batch.get(k)
                if v is not None and not (isinstance(v, Tensor) and not v.is_floating_point() and not v.is_complex()):
                    raise ValueError(
                        f"The shared key {k!r} of a private batch must hold integer ids (public draws, e.g. sampled item "
                        f"ids), got {type(v).__name__ if not isinstance(v, Tensor) else v.dtype}: a float value shared "
                        "by every example (a batch statistic, say) would reach each example's loss unclipped."
                    )
            return {k: v for k, v in batch.items() if k not in self.shared}
        return batch

    def head(self, batch: Any, n: int) -> Any:
        return self._by_row(batch, lambda t: t[:n])

    def in_dims(self, stacked: Any) -> Any:
        return self._by_row(stacked, lambda t: 0, lambda v: tree_map(lambda t: None, v))

    def examples(self, batch: Any) -> Iterator[Any]:
        if not (self.shared and isinstance(batch, Mapping)):
            yield from super().examples(batch)
            return
        for i in range(self.size(batch)):
            yield self._by_row(batch, lambda t, i=i: t[i:i + 1])

    def size(self, batch: Any) -> int:
        batch = self._rows(batch)
        texts = _text_fields(batch)
        if texts:
            raise ValueError(
                f"The private batch holds texts ({', '.join(texts[:3])}): a batch of examples is tensors with one row "
                "per example, and a per-example step cannot slice texts. Tokenise in the Dataset's __getitem__ or in "
                "the collate_fn (it runs on each example alone), so the batch holds token ids and masks."
            )
        sizes = set()
        tree_map(lambda t: sizes.add(int(t.shape[0])) if t.dim() else None, batch)
        if len(sizes) != 1:
            raise ValueError(
                f"Every tensor of a batch of examples needs the same leading (example) dimension, got sizes {sorted(sizes)}; "
                "a batch-level tensor (a class-weight vector, say) belongs in the module, not the batch."
            )
        return sizes.pop()

    def stacked(self, batch: Any) -> Any:
        return batch

    def one(self, example: Any) -> Any:
        return self._by_row(example, lambda t: t.unsqueeze(0))


class LinkTuples(ExampleView):
    """One coupled tuple (e⁺, e⁻₁..e⁻ₖ) of a :class:`~lightning_dprel.datamodules.edge_tuples.link_batches.LinkBatch`."""

    def size(self, batch: Any) -> int:
        return int(batch.tuple_x.shape[0]) if "tuple_x" in batch else int(batch.tuple_n_id.shape[0])

    def stacked(self, batch: Any) -> Any:
        keys = ("tuple_x", "tuple_n_id", "tuple_edge_label_index", "tuple_edge_label")
        return {k: batch[k] for k in keys if k in batch}

    def __init__(self, data_class: type | None = None) -> None:
        self.data_class = data_class  # the Data type one tuple is handed as (None: PyG's Data)

    def one(self, example: Any) -> Any:
        if self.data_class is None:
            from torch_geometric.data import Data

            self.data_class = Data
        out = self.data_class(n_id=example["tuple_n_id"], edge_label_index=example["tuple_edge_label_index"],
                              edge_label=example["tuple_edge_label"])
        if "tuple_x" in example:
            out.x = example["tuple_x"]
        return out

    def describe(self) -> str:
        return ("Each example is one coupled tuple, a Data with `x` and `n_id` (its 2 + k nodes), `edge_label_index` "
                "[2, 1 + k] and `edge_label` [1 + k]: a positive relation (label 1) and the k negatives the library's "
                "sampler drew for it (label 0), which are part of the private mechanism. A step that draws negatives "
                "of its own (torch_geometric.utils.negative_sampling) or reads a graph (`edge_index`) gives the batch "
                "and its tuples different losses and is outside the analysis: score `edge_label_index` against "
                "`edge_label`.")


class SubgraphGraphs(ExampleView):
    """One subgraph (a ``Data``) of a PyG ``Batch`` of DP-GCN's sampled subgraphs."""

    stacks = False
    checks_reduction = False  # a node-mean over the union weighs subgraphs by their sizes; each is clipped alone

    def size(self, batch: Any) -> int:
        return int(batch.num_graphs) if hasattr(batch, "num_graphs") else 0

    def examples(self, batch: Any) -> Iterator[Any]:
        yield from batch.to_data_list() if self.size(batch) else ()


def empty_like_rows(example_batch: Any) -> Any:
    """A batch of zero rows with the shapes of a collated batch of one (an empty Poisson sample is a real step)."""
    return tree_map(lambda t: t[:0], example_batch)
