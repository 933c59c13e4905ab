"""Row bookkeeping shared by the training and evaluation loaders: rank slices, node inputs, one thread."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["slice_rows", "gather_rows", "one_thread"]


def slice_rows(num_rows: int, rank: int, world_size: int) -> Tensor:
    """Rows of a global batch that rank ``rank`` takes: a contiguous block, sizes differing by ≤ 1."""
    return torch.tensor_split(torch.arange(num_rows), world_size)[rank]


def gather_rows(inputs: dict[str, Tensor], ids: Tensor, *, trim: bool = False) -> dict[str, Tensor]:
    """Rows ``ids`` of the cached node inputs.

    Training batches keep the full cached width (``max_length`` tokens): trimming to the longest text of
    the batch would make one tuple's float32 gradient depend on the other tuples' text lengths (issue 11,
    finding 4). ``trim=True`` (evaluation only, which is outside the guarantee) drops all-padding columns.
    """
    out = {key: val.index_select(0, ids) for key, val in inputs.items()}  # much faster than val[ids] on CPU
    if trim and "attention_mask" in out and ids.numel():
        length = max(1, int(out["attention_mask"].sum(dim=1).max()))
        out = {key: val[:, :length] for key, val in out.items()}
    return out


@contextmanager
def one_thread() -> Iterator[None]:
    """Run batch construction single-threaded: its O(b·k) tensor ops gain nothing from OpenMP, whose
    fork-join stalls for milliseconds when cores are shared (measured: 3-12x slower per batch at 2 threads
    on a loaded 2-core machine). The loader runs in the training thread, so the setting is restored before
    the batch is handed out."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
