"""Keyed node partitions (DP-GCN's random graph splits, Igamberdiev & Habernal 2022, Sec. 4; DP-GPL's teacher groups).

Provable: :func:`keyed_split` gives node v the split ⌊s·u(id_v)⌋, u a 53-bit uniform that is a keyed PRF of v's
**stable id** (AES-256 of the id under a key derived from the secret stream): u depends only on the key and the id —
not on v's row number, on how many nodes there are or on which are present. Removing a node (and renumbering the rows)
moves no other node, and each node lies in exactly one subgraph. :func:`public_id_uniforms` is the same map under a
public seed, for the public subset and train/val/test masks of the node sources.
Paper-faithful: :func:`equal_random_split` permutes the training nodes once and cuts them into s groups of equal size
(±1), as published: the groups depend on which nodes are present.
:func:`split_edges` keeps the edges whose ends lie in the same split; the others are masked, so no message crosses
subgraphs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from torch import Tensor

from lightning_dprel.core.checks import check_int
from lightning_dprel.core.randomness import KeyedStream

__all__ = ["keyed_split", "equal_random_split", "split_edges", "check_node_ids", "id_uniforms", "public_id_uniforms"]

_DOMAIN = b"lightning_dprel/node-id-hash/v1"


def _check_splits(num_splits: int) -> int:
    return check_int("num_splits", num_splits, 1)


def check_node_ids(node_ids: Tensor, num_nodes: int | None = None) -> Tensor:
    """``node_ids`` as a 1-D int64 tensor of unique ids (one per row); a clear error otherwise."""
    if not isinstance(node_ids, Tensor) or node_ids.dim() != 1 or node_ids.dtype.is_floating_point or node_ids.dtype == torch.bool:
        raise ValueError(f"`node_id` must be a 1-D integer tensor of stable node ids, got {node_ids!r:.80}.")
    if num_nodes is not None and node_ids.numel() != num_nodes:
        raise ValueError(f"`node_id` has {node_ids.numel()} entries for {num_nodes} nodes; give one stable id per node.")
    ids = node_ids.to(torch.int64, copy=False)
    uniq, counts = torch.unique(ids, return_counts=True)
    if uniq.numel() != ids.numel():
        dup = uniq[counts > 1][:5].tolist()
        raise ValueError(f"`node_id` has duplicate ids (e.g. {dup}); every node needs its own stable id.")
    return ids


def id_uniforms(node_ids: Tensor, key: bytes) -> Tensor:
    """u(id) in [0, 1): top 53 bits of AES-256(key, id as 16 little-endian bytes) — a keyed PRF of each id alone."""
    ids = np.ascontiguousarray(node_ids.to(torch.int64).cpu().numpy(), dtype="<i8")
    blocks = np.zeros((ids.size, 2), dtype="<i8")
    blocks[:, 0] = ids
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # one block per id: ECB is the PRF here, not a mode
    words = np.frombuffer(enc.update(blocks.tobytes()) + enc.finalize(), dtype="<u8").reshape(-1, 2)[:, 0]
    return torch.from_numpy((words >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def public_id_uniforms(node_ids: Tensor, seed: int, purpose: str) -> Tensor:
    """u(id) under a key from a public seed and purpose (public subsets and masks: anyone can recompute them)."""
    key = hashlib.shake_256(_DOMAIN + b"/public/" + purpose.encode() + b"\x00" + str(int(seed)).encode()).digest(32)
    return id_uniforms(node_ids, key)


def keyed_split(train_mask: Tensor, num_splits: int, stream: KeyedStream, *, node_ids: Tensor) -> Tensor:
    """Split in [0, s) of every training node, −1 elsewhere: ⌊s·u(id)⌋, u a secret keyed PRF of the node's stable id."""
    _check_splits(num_splits)
    ids = check_node_ids(node_ids, int(train_mask.numel()))
    key = hashlib.shake_256(_DOMAIN + b"/graph-split/" + stream.key_now() + stream.tag.encode()).digest(32)
    split = (id_uniforms(ids, key) * num_splits).floor().long().clamp_(max=num_splits - 1)
    return torch.where(train_mask.bool().cpu(), split, torch.full_like(split, -1))


def equal_random_split(train_mask: Tensor, num_splits: int, seed: int) -> Tensor:
    """The published split: a random permutation of the training nodes cut into s equal groups (data-dependent)."""
    _check_splits(num_splits)
    idx = train_mask.nonzero().view(-1)
    perm = idx[torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(int(seed)))]
    split = torch.full((train_mask.numel(),), -1, dtype=torch.long)
    for j, part in enumerate(torch.tensor_split(perm, num_splits)):
        split[part] = j
    return split


def split_edges(edge_index: Tensor, split: Tensor) -> Tensor:
    """The edges whose two ends lie in the same split (≥ 0); every edge between subgraphs or to held-out nodes is masked."""
    a, b = split[edge_index[0]], split[edge_index[1]]
    return edge_index[:, (a == b) & (a >= 0)]
