"""Prompt tuning on example graphs: teachers in one batch (DP-GPL Alg. 2, steps 2-3), the student, and their votes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprel.methods.dp_gpl.egonets import EgoBatch
from lightning_dprel.methods.dp_gpl.prompts import AnswerHead, build_prompt
from lightning_dprel.progress import ProgressLog

__all__ = ["PromptedModel", "TuningConfig", "tune_prompts", "teacher_votes", "train_teachers_and_vote"]


@dataclass(frozen=True)
class TuningConfig:
    """How a prompt is tuned: kind (``gpf`` / ``gpf_plus``), full-batch Adam ``epochs`` at ``lr``, ``num_basis``."""

    prompt: str = "gpf_plus"
    epochs: int = 50
    lr: float = 0.01
    num_basis: int = 5
    weight_decay: float = 0.0


class PromptedModel(nn.Module):
    """Φ (frozen) with ``num_prompts`` stacked prompts and answer heads: logits of each example's center node."""

    def __init__(self, encoder: nn.Module, num_classes: int, cfg: TuningConfig, *, num_prompts: int = 1) -> None:
        super().__init__()
        self.encoder, self.cfg = encoder, cfg
        self.prompt = build_prompt(cfg.prompt, encoder.in_dim, num_prompts=num_prompts, num_basis=cfg.num_basis)
        self.head = AnswerHead(encoder.out_dim, num_classes, num_prompts=num_prompts)

    def forward(self, x: Tensor, batch: EgoBatch, owner: Tensor | int | None = None) -> Tensor:
        """Logits [B, C]; ``owner`` [B] picks each example's prompt (an int or None: one prompt for all)."""
        node_owner = owner[batch.example] if isinstance(owner, Tensor) else owner
        z = self.encoder(self.prompt(x[batch.rows], node_owner), batch.edge_index)[batch.center]
        return self.head(z, owner)

    def trainable(self) -> list[nn.Parameter]:
        return [*self.prompt.parameters(), *self.head.parameters()]


def tune_prompts(model: PromptedModel, x: Tensor, batch: EgoBatch, labels: Tensor, owner: Tensor | None = None,
                 on_epoch: Callable[[int], None] | None = None) -> PromptedModel:
    """Full-batch Adam on Σ_o mean CE of owner o's examples: each prompt learns from its own examples only
    (``on_epoch(e)`` after epoch e, counted from 1: progress)."""
    cfg = model.cfg
    if batch.size == 0:
        return model
    opt = torch.optim.Adam(model.trainable(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    weight = torch.ones(batch.size)
    if owner is not None:
        weight = 1.0 / torch.bincount(owner, minlength=model.head.bias.shape[0]).clamp(min=1).float()[owner]
    model.train()
    for epoch in range(int(cfg.epochs)):
        opt.zero_grad()
        loss = (F.cross_entropy(model(x, batch, owner), labels, reduction="none") * weight).sum()
        loss.backward()
        opt.step()
        if on_epoch is not None:
            on_epoch(epoch + 1)
    model.eval()
    return model


@torch.no_grad()
def teacher_votes(model: PromptedModel, x: Tensor, queries: EgoBatch) -> Tensor:
    """Votes [N, Q]: every prompt of ``model`` labels every query (argmax of its logits)."""
    n = model.head.bias.shape[0]
    return torch.stack([model(x, queries, j).argmax(-1) for j in range(n)]) if queries.size else torch.empty(n, 0, dtype=torch.long)


def train_teachers_and_vote(encoder: nn.Module, x: Tensor, examples: EgoBatch, labels: Tensor, teacher: Tensor,
                            queries: EgoBatch, *, num_teachers: int, num_classes: int, cfg: TuningConfig,
                            chunk: int = 25, seed: int = 0) -> Tensor:
    """Votes [N, Q] (Alg. 2, steps 2-3): teacher i is tuned on the examples with ``teacher == i`` only, ``chunk`` teachers
    per batch, each from its own public initialisation (seed + 1 + i), so a teacher's vote is a function of its group."""
    votes, epochs = [], int(cfg.epochs)
    log = ProgressLog(f"tuning {num_teachers} teacher prompts ({chunk} at a time)", num_teachers * epochs,
                      unit="teacher-epochs")  # a chunk's epochs tune all its teachers at once
    for start in range(0, num_teachers, chunk):
        stop = min(start + chunk, num_teachers)
        model = PromptedModel(encoder, num_classes, cfg, num_prompts=stop - start)
        for j in range(start, stop):  # teacher j's initial prompt depends on its index alone (public randomness)
            with torch.random.fork_rng():
                torch.manual_seed(seed + 1 + j)
                one = PromptedModel(encoder, num_classes, cfg)
            with torch.no_grad():
                for mine, init in zip(model.trainable(), one.trainable()):
                    mine[j - start].copy_(init[0])
        idx = ((teacher >= start) & (teacher < stop)).nonzero().view(-1)
        tune_prompts(model, x, examples.select(idx), labels[idx], teacher[idx] - start,
                     on_epoch=lambda e, done=start * epochs, n=stop - start: log.update(done + e * n))
        votes.append(teacher_votes(model, x, queries))
    log.close()
    return torch.cat(votes)
