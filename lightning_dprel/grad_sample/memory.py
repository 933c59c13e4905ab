"""Tuples per chunk from the memory that is free, instead of a fixed chunk size.

A chunk of c tuples costs about c·(2+k)·(activation bytes of one node slot)·``_SAVED`` (what a backward keeps),
plus, on the vmap path, c·3·(bytes of the trainable parameters) (each tuple's gradient and its intermediates).
The activation bytes of one slot are measured once per encoder and input shape by a forward of one slot with
hooks on every leaf module (no gradients), so the estimate follows the model rather than a constant.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lightning_dprel.grad_sample.layers import watching

__all__ = ["available_bytes", "slot_activation_bytes", "auto_chunk_size"]

_SAVED = 3  # activations kept for the backward ≈ 3× the leaf outputs (inputs, outputs, intermediates)
_FRACTION = 0.5  # of the free memory one chunk may take
_cache: dict[tuple, int] = {}


def available_bytes(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA's free memory, or the host's ``MemAvailable``."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3  # unknown host: assume 8 GiB free


def slot_activation_bytes(encoder: nn.Module, inputs: Mapping[str, Tensor]) -> int:
    """Bytes of all leaf-module outputs for one node slot (inputs ``[B, 2+k, ...]``; the first slot is used)."""
    key = (id(encoder), tuple((k, tuple(v.shape[2:]), v.dtype) for k, v in inputs.items()))
    if key in _cache:
        return _cache[key]
    total = [0]

    def count(_m: nn.Module, _args: tuple, out) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                total[0] += t.numel() * t.element_size()

    with watching([m for m in encoder.modules() if not list(m.children())], count), torch.no_grad():
        encoder(**{k: v[:1, 0] for k, v in inputs.items()})
    _cache[key] = max(total[0], 1)
    return _cache[key]


def auto_chunk_size(
    encoder: nn.Module,
    inputs: Mapping[str, Tensor],
    params: Mapping[str, Tensor],
    *,
    per_tuple_gradients: bool,
    budget_bytes: int | None = None,
) -> int | None:
    """Tuples per chunk that fit half the free memory (None: the whole batch fits at once)."""
    size, width = next(iter(inputs.values())).shape[:2]
    if size == 0:
        return None
    ref = next(iter(params.values()))
    budget = int(_FRACTION * available_bytes(ref.device)) if budget_bytes is None else int(budget_bytes)
    per_tuple = width * slot_activation_bytes(encoder, inputs) * _SAVED
    if per_tuple_gradients:
        per_tuple += 3 * sum(p.numel() * p.element_size() for p in params.values())
    chunk = max(1, budget // max(per_tuple, 1))
    return None if chunk >= size else int(chunk)
