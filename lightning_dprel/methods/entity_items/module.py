"""A plain LightningModule that ranks public items for an entity's text: made private by ``PrivacyCallback``.

score(e, j) = ⟨x_e + A·x_e, t_j⟩ / τ (+ β_j), x_e the entity's frozen text embedding, t_j the public item's, A a
linear adapter (full, rank r, or k×k in the public items' top-k singular directions; zero at the start: the base
encoder) and β an optional per-item bias. The loss is the
mean over the example's items of −log softmax over all items, over the item and its k public negatives, or (a
sampled softmax) over the example's items P and the step's S shared public items: the s drawn items that are not in
P are a uniform sample of the n_items − |P| others, so their terms weighted by (n_items − |P|)/s estimate the full
softmax's denominator without bias (Bengio & Senécal 2008, uniform proposal); with every item drawn it is exact.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from lightning_dprel.core.checks import positive_finite
from lightning_dprel.methods.entity_items.public_basis import PublicBasisAdapter

__all__ = ["EntityItemRanker"]


class EntityItemRanker(pl.LightningModule):
    """Rank all public items for an entity (Eq.: softmax over items of adapter-mapped text embeddings).

    Args:
        item_x: ``[n_items, d]`` public item embeddings (None: read from the datamodule's ``item_x`` at setup).
        rank: None (a full d×d adapter) or r (A = U·Vᵀ, rank r).
        public_basis: k: the adapter lives in the span of the public item embeddings' top-k right singular vectors
            (:class:`~lightning_dprel.methods.entity_items.public_basis.PublicBasisAdapter`; k² + k noised
            coordinates instead of d²). A function of public data only, so it costs no privacy.
        precondition: γ: the adapter's output is written in the public items' singular directions scaled by
            (s/s̄)^−γ (full rank unless ``public_basis``; public, so free of privacy cost).
        item_bias: learn a per-item bias β (a popularity prior).
        temperature: τ.
        lr: Adam's learning rate.
        item_prior: an optional fixed ``[n_items]`` score added to every entity's (e.g. a DP popularity histogram);
            with ``query_weight=0`` the model ranks by it alone.
    """

    def __init__(self, item_x: Tensor | None = None, *, dim: int = 384, rank: int | None = None,
                 public_basis: int | None = None, precondition: float | None = None, item_bias: bool = False,
                 temperature: float = 0.05, lr: float = 3e-3, item_prior: Tensor | None = None,
                 query_weight: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["item_x", "item_prior"])  # the tensors travel in the state dict
        positive_finite("temperature", temperature)
        self.temperature, self.lr, self.query_weight = float(temperature), float(lr), float(query_weight)
        if public_basis is not None or precondition is not None:
            if rank is not None:
                raise ValueError("Give `rank` or `public_basis` / `precondition`, not both.")
            basis = public_basis is not None
            self.adapter = PublicBasisAdapter(dim, public_basis if basis else dim, item_x, precondition=precondition or 0.0,
                                              project_input=basis, bias=basis)
        elif rank is None:
            self.adapter = nn.Linear(dim, dim, bias=False)
            nn.init.zeros_(self.adapter.weight)
        else:
            self.adapter = nn.Sequential(nn.Linear(dim, int(rank), bias=False), nn.Linear(int(rank), dim, bias=False))
            nn.init.normal_(self.adapter[0].weight, std=dim ** -0.5)
            nn.init.zeros_(self.adapter[1].weight)
        self.register_buffer("item_x", None if item_x is None else item_x.float())
        self.register_buffer("item_prior", None if item_prior is None else item_prior.float())
        self._wants_bias = bool(item_bias)
        self.item_bias = nn.Parameter(torch.zeros(item_x.size(0))) if item_bias and item_x is not None else None
        self.ranking: dict[str, Any] = {}
        self._eval: list[tuple[Tensor, Tensor]] = []

    def setup(self, stage: str) -> None:
        if self.item_x is None:
            dm = self.trainer.datamodule if self.trainer is not None else None
            if dm is None or getattr(dm, "item_x", None) is None:
                raise ValueError("EntityItemRanker needs `item_x` (the public item embeddings) or a datamodule that has it.")
            self.item_x = dm.item_x.to(self.device)
        if isinstance(self.adapter, PublicBasisAdapter) and not self.adapter.ready:
            self.adapter.fit(self.item_x)
        if self._wants_bias and (self.item_bias is None or self.item_bias.numel() != self.item_x.size(0)):
            self.item_bias = nn.Parameter(torch.zeros(self.item_x.size(0), device=self.device))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Rebuilt from its hyper-parameters, the module takes the item tensors' shapes from the saved state."""
        state = checkpoint.get("state_dict", {})
        for name in ("item_x", "item_prior"):
            if getattr(self, name) is None and name in state:
                setattr(self, name, torch.empty_like(state[name]))
        if self._wants_bias and self.item_bias is None and "item_bias" in state:
            self.item_bias = nn.Parameter(torch.empty_like(state["item_bias"]))

    def forward(self, query: Tensor) -> Tensor:
        """Scores ``[B, n_items]`` of every item for each query."""
        q = self.query_weight * (query + self.adapter(query))
        scores = q @ self.item_x.t() / self.temperature
        if self._wants_bias:
            scores = scores + self.item_bias
        if self.item_prior is not None:
            scores = scores + self.item_prior
        return scores

    def training_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> Tensor:
        if "sampled" in batch:
            return self.sampled_softmax_loss(batch["query"], batch["items"], batch["sampled"]).mean()
        items = batch["items"]
        scores = self(batch["query"])
        if "negatives" in batch:  # the item against its k public negatives (item in column 0)
            scores = torch.gather(scores, 1, torch.cat([items.clamp(min=0), batch["negatives"]], 1))
            items = torch.zeros_like(items)
        logp = torch.log_softmax(scores, dim=1)
        valid = (batch["items"] >= 0).to(logp.dtype)
        picked = torch.gather(logp, 1, items.clamp(min=0)) * valid
        per_example = -picked.sum(1) / valid.sum(1).clamp(min=1.0)
        return per_example.mean()

    def sampled_softmax_loss(self, query: Tensor, items: Tensor, sampled: Tensor) -> Tensor:
        """Per-example −log softmax of each of its items ``[B, K]`` (−1: padding) against them and the shared public
        items ``sampled`` ``[S]`` (a sampled one among its own items is dropped), averaged over its items: ``[B]``."""
        q = self.query_weight * (query + self.adapter(query))
        valid = items >= 0
        rows = items.clamp(min=0)
        pos = torch.matmul(self.item_x[rows], q.unsqueeze(-1)).squeeze(-1) / self.temperature
        neg = q @ self.item_x[sampled].t() / self.temperature
        if self._wants_bias:
            pos, neg = pos + self.item_bias[rows], neg + self.item_bias[sampled]
        if self.item_prior is not None:
            pos, neg = pos + self.item_prior[rows], neg + self.item_prior[sampled]
        slot = torch.full((self.item_x.size(0),), sampled.numel(), dtype=torch.long, device=q.device)
        slot[sampled] = torch.arange(sampled.numel(), device=q.device)  # each item's column among the sampled (S: none)
        where = torch.where(valid, slot[rows], sampled.numel())
        hit = torch.zeros(q.size(0), sampled.numel() + 1, dtype=q.dtype, device=q.device).scatter(1, where, 1.0)[:, :-1] > 0
        others = self.item_x.size(0) - valid.sum(1, keepdim=True).to(q.dtype)  # the items that are not its own
        drawn = (sampled.numel() - hit.sum(1, keepdim=True)).clamp(min=1).to(q.dtype)  # a uniform sample of them
        neg = (neg + torch.log(others / drawn)).masked_fill(hit, float("-inf"))
        log_z = torch.logsumexp(torch.cat([pos.masked_fill(~valid, float("-inf")), neg], 1), 1, keepdim=True)
        per_item = torch.where(valid, pos - log_z, torch.zeros_like(pos))
        return -per_item.sum(1) / valid.sum(1).clamp(min=1).to(pos.dtype)

    #: The CLI's closing table: its title, metric columns and row names.
    report_title = "Ranking all public items for held-out entities"
    report_metrics = (("test_map", "MAP"), ("test_recall@20", "recall@20"))
    report_rows = ("base (zero-shot)", "private model")

    @torch.no_grad()
    def ranking_metrics(self, loader: Any) -> dict[str, float]:
        """MAP and recall@20 of the entities of ``loader`` (eval batches: ``query``, ``target``), by one sort
        (:func:`~lightning_dprel.methods.entity_items.evaluation.fast_ranking_metrics`; checkpoint selection)."""
        from lightning_dprel.methods.entity_items.evaluation import fast_ranking_metrics

        was = self.training
        self.eval()
        parts = [(self(b["query"].to(self.device)).float(), b["target"].to(self.device)) for b in loader]
        self.train(was)
        scores, target = (torch.cat(t) for t in zip(*parts))
        return fast_ranking_metrics(scores, target)

    def _collect(self, batch: dict[str, Tensor]) -> None:
        self._eval.append((self(batch["query"]).float().cpu(), batch["target"].cpu()))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> None:
        self._collect(batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> None:
        self._collect(batch)

    def _report(self, prefix: str) -> None:
        from lightning_dprel.methods.entity_items.evaluation import fast_ranking_metrics

        scores, target = (torch.cat(t) for t in zip(*self._eval))
        self._eval = []
        self.ranking = fast_ranking_metrics(scores, target)  # tested equal to torchmetrics' (ranking_metrics)
        for name, value in self.ranking.items():
            self.log(f"{prefix}_{name}", value, prog_bar=name == "map")

    def on_validation_epoch_end(self) -> None:
        self._report("val")

    def on_test_epoch_end(self) -> None:
        self._report("test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)
