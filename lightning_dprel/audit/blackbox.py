"""Black-box audit: canary entities, real private training, and ε lower bounds from the released model only.

Each canary is an entity: a node with random dense features and K relations to its own partner nodes (partners
are in both worlds). Its secret coin (:func:`~lightning_dprel.audit.canaries.secret_coins`) decides whether the
node and its K relations are in the training graph or absent, node included (the entity-level neighbouring
relation: negatives are drawn from the node set, so an absent canary cannot be one). The graph is trained with
:class:`~lightning_dprel.methods.relational.module.DPRelationalModule` through a Lightning ``Trainer`` on the library's own
:class:`~lightning_dprel.datamodules.RelationalDataModule` (secret Poisson sampling, secret noise, σ calibrated by
:class:`~lightning_dprel.callbacks.PrivacyCallback` from each world's own m); only the final encoder is scored:
a canary's score is the mean score of its K relations against the scores it gives the other canaries' partners,
as a z-score (higher = "in"; :func:`membership_scores`). The proven ε is the module's ledger's (the library's
accountant), the audited ε the bounds of :mod:`~lightning_dprel.audit.bounds`.

References:
    Steinke, Nasr, Jagielski. Privacy Auditing with One (1) Training Run. NeurIPS 2023 (one-run bound).
    Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning. NeurIPS 2020 (two-run bound).
    Huang, Yin, Chien, Wei, Li. Differentially Private Relational Learning with Entity-level Privacy Guarantees.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pytorch_lightning import Trainer, seed_everything
from torch import Tensor
from torch_geometric.data import Data

from lightning_dprel.audit.bounds import (
    OneRunBound,
    TwoRunBound,
    one_run_audit,
    two_run_audit,
)
from lightning_dprel.audit.canaries import check_int, secret_coins
from lightning_dprel.audit.runner import PROVEN_MECHANISM
from lightning_dprel.callbacks.checks import ACCOUNTING_LABELS
from lightning_dprel.callbacks.privacy import PrivacyCallback
from lightning_dprel.core.checks import check_choice, check_delta
from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource
from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.datasets.generators import random_feature_graph
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational.losses import pair_scores
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.progress import StepLogProgressBar

__all__ = [
    "SCORES",
    "SETTINGS",
    "BlackBoxAudit",
    "CanaryEntities",
    "CanaryWorld",
    "TrainedWorld",
    "blackbox_audit",
    "canary_entities",
    "membership_scores",
    "train_world",
    "world_datamodule",
]

#: The audited training settings: module ``clipping`` and ``accounting`` (``nonprivate``: σ = 0, no ε claimed).
SETTINGS = {
    "freq_corrected": ("freq", "corrected"),
    "freq_paper": ("freq", "paper"),
    "standard": ("standard", "corrected"),
    "nonprivate": ("none", "corrected"),
}


@dataclass(frozen=True)
class CanaryEntities:
    """The public pieces of an audit: background graph, canary and partner features, a separate test graph.

    Node ids of a world (:meth:`world`): background ``0..B-1``, partners ``B + c·K + j``, then the included
    canaries in canary order, so removing a canary renumbers only later canaries (whose K relations are never
    capped), and the held-out split is avoided altogether by the separate test graph.
    """

    background: Data
    canary_x: Tensor  # [m, d]
    partner_x: Tensor  # [m, K, d]
    test: Data

    @property
    def num_canaries(self) -> int:
        return int(self.canary_x.shape[0])

    @property
    def degree(self) -> int:
        return int(self.partner_x.shape[1])

    def canary_nodes(self, included: Tensor) -> Tensor:
        """``[m]`` node id of each canary in the world of ``included`` (−1 where absent)."""
        inc = self._coins(included)
        first = self.background.num_nodes + self.num_canaries * self.degree
        return torch.where(inc, first + torch.cumsum(inc.long(), 0) - 1, torch.full_like(inc, -1, dtype=torch.long))

    def world(self, included: Tensor) -> Data:
        """The training graph: background, all partners, and canary c with its K relations iff ``included[c]``."""
        inc = self._coins(included)
        m, k, nb = self.num_canaries, self.degree, self.background.num_nodes
        ids = self.canary_nodes(inc)[inc]
        partners = nb + torch.arange(m * k).view(m, k)[inc]
        canary_edges = torch.stack([ids.repeat_interleave(k), partners.reshape(-1)])
        x = torch.cat([self.background.x, self.partner_x.reshape(m * k, -1), self.canary_x[inc]])
        edges = torch.cat([self.background.edge_index, canary_edges], dim=1)
        return Data(x=x, edge_index=edges, num_nodes=x.shape[0])

    def _coins(self, included: Any) -> Tensor:
        inc = torch.as_tensor(included, dtype=torch.bool).reshape(-1)
        if inc.numel() != self.num_canaries:
            raise ValueError(f"`included` must have one coin per canary ({self.num_canaries}), got {inc.numel()}.")
        return inc


def canary_entities(
    num_canaries: int, degree: int, *, background_nodes: int = 200, background_edges: int = 400, dim: int = 16, seed: int = 0
) -> CanaryEntities:
    """m canaries with K partners each (Gaussian features, public ``seed``) next to a background graph."""
    check_int("num_canaries", num_canaries, 2)
    check_int("degree", degree, 1)
    check_int("background_nodes", background_nodes, 2)
    check_int("background_edges", background_edges, 1)
    check_int("dim", dim, 1)
    g = torch.Generator().manual_seed(seed)
    scale = dim ** -0.5 * 3.0  # about the norm of the background's community features
    canary_x = torch.randn(num_canaries, dim, generator=g) * scale
    partner_x = torch.randn(num_canaries, degree, dim, generator=g) * scale
    background = random_feature_graph(background_nodes, background_edges, dim=dim, seed=seed)
    test = random_feature_graph(max(background_nodes // 4, 10), max(background_edges // 4, 10), dim=dim, seed=seed + 1)
    return CanaryEntities(background=background, canary_x=canary_x, partner_x=partner_x, test=test)


class CanaryWorld(GraphSource):
    """A :class:`GraphSource` of one world: :meth:`CanaryEntities.world` for ``included``, and the test graph."""

    def __init__(self, entities: CanaryEntities, included: Tensor) -> None:
        self.entities, self.included = entities, entities._coins(included)

    def load(self) -> GraphPair:
        return GraphPair(train=self.entities.world(self.included), test=self.entities.test, name="audit canaries")


SCORES = ("relative", "raw")


@torch.no_grad()
def membership_scores(module: Any, entities: CanaryEntities, *, score: str = "relative") -> Tensor:
    """``[m]`` membership scores from the released encoder only (higher = "in").

    ``"relative"`` (default): (mean score of c's K relations − mean score of c with the other canaries' partners)
    / their std, a z-score within one model. ``"raw"``: the mean score of c's K relations; it also carries what
    differs between whole models (σ, γ = b/m, global geometry), so do not compare it across runs.
    """
    check_choice("score", score, SCORES)
    hp, m, k = module.hparams, entities.num_canaries, entities.degree
    was_training = module.encoder.training
    module.encoder.eval()
    h_c = module.encoder(x=entities.canary_x)
    h_p = module.encoder(x=entities.partner_x.reshape(m * k, -1))
    module.encoder.train(was_training)
    s = pair_scores(h_c[:, None, :], h_p[None, :, :], score=hp.score, temperature=hp.temperature).view(m, m, k)
    own = s[torch.arange(m), torch.arange(m)].mean(1)
    if score == "raw":
        return own.cpu()
    others = s[~torch.eye(m, dtype=torch.bool)].reshape(m, (m - 1) * k)
    spread = others.std(1).clamp_min(1e-12) if others.shape[1] > 1 else torch.ones(m)
    return ((own - others.mean(1)) / spread).cpu()


@dataclass(frozen=True)
class TrainedWorld:
    """One training run: its module, the ε its accounting claims, the proven ε (``inf`` without noise), δ, … seconds."""

    module: DPRelationalModule
    epsilon: float
    delta: float
    accounting: str
    steps: int
    noise_multiplier: float
    seconds: float
    epsilon_proven: float


def world_datamodule(entities: CanaryEntities, included: Tensor, *, expected_batch_size: float = 32.0, neg_per_pos: int = 4) -> RelationalDataModule:
    """The library's datamodule over one world (K = the canaries' degree; secret sampling)."""
    return RelationalDataModule(
        CanaryWorld(entities, included), max_degree=entities.degree, expected_batch_size=expected_batch_size,
        neg_per_pos=neg_per_pos, eval_batch_size=4096,
    )


def train_world(
    entities: CanaryEntities, included: Tensor, setting: str, *, steps: int, delta: float, target_epsilon: float = 8.0,
    expected_batch_size: float = 32.0, neg_per_pos: int = 4, lr: float = 0.01, hidden_dim: int = 64, out_dim: int = 32,
    clip_norm: float = 1.0, temperature: float = 0.1, init_seed: int = 0,
    progress: Callable[[str], None] | None = None, progress_label: str = "training",
) -> TrainedWorld:
    """Train ``DPRelationalModule`` (MLP encoder, cosine InfoNCE) on one world with a CPU ``Trainer`` for ``steps`` steps.

    Private settings: σ calibrated by :class:`PrivacyCallback` to spend ``target_epsilon`` at ``delta``, sampling and
    noise secret; the proven ε is the ledger's. ``"nonprivate"``: ``clipping="none"``, σ = 0, ε = ∞.
    ``progress``: where to write plain step lines (``progress_label``: step t/T, ε, time left; every tenth of the
    steps and at least every 5 s), e.g. a function printing to stderr; None (default): silent.
    """
    check_choice("setting", setting, SETTINGS)
    check_int("steps", steps, 1)
    clipping, accounting = SETTINGS[setting]
    private = clipping != "none"
    seed_everything(init_seed, verbose=False)  # the public initialisation; sampling and noise stay secret
    encoder = MLPEncoder(entities.canary_x.shape[1], hidden_dim=hidden_dim, out_dim=out_dim, num_layers=2)
    module = DPRelationalModule(
        encoder, score="cosine", temperature=temperature, loss="infonce", lr=lr, clipping=clipping,
        accounting=accounting, clip_norm=clip_norm, noise_multiplier=1.0 if private else 0.0, chunk_size=None,
    )
    dm = world_datamodule(entities, included, expected_batch_size=expected_batch_size, neg_per_pos=neg_per_pos)
    callbacks: list[Any] = [PrivacyCallback(target_epsilon=target_epsilon, delta=delta, calibrate=True)] if private else []
    if progress is not None:  # reads the step count and the logged ε only: the run itself is unchanged
        callbacks.append(StepLogProgressBar(every=5.0, fraction=0.1, what=progress_label, write=progress))
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=progress is not None, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=False, callbacks=callbacks,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():  # irrelevant here: no validation graph, loader workers
        warnings.filterwarnings("ignore", message=r".*(num_workers|validation graph).*")
        trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - start
    ledger = module.privacy_ledger
    epsilon = ledger.epsilon(delta) if private else float("inf")
    proven = ledger.epsilon(delta, mechanism=PROVEN_MECHANISM[clipping]) if private else float("inf")
    label = ACCOUNTING_LABELS[module.noise_spec.mechanism] if private else "none (non-private)"
    return TrainedWorld(
        module, float(epsilon), delta, label, ledger.steps, float(ledger.last_noise_multiplier or 0.0), seconds, float(proven)
    )


@dataclass(frozen=True)
class BlackBoxAudit:
    """A black-box audit: the ε the setting's accounting claims and the proven ε (corrected FREQ-CLIP / Thm C.1) next to
    the audited one-run / two-run lower bounds."""

    setting: str
    epsilon: float
    accounting: str
    delta: float
    num_canaries: int
    degree: int
    epochs: int
    steps: int
    noise_multiplier: float
    scores: Tensor
    coins: Tensor
    one_run: OneRunBound
    two_run: TwoRunBound | None
    in_scores: Tensor | None
    out_scores: Tensor | None
    seconds: float
    epsilon_proven: float = float("inf")

    @property
    def violation(self) -> bool:
        """An audited lower bound above the proven ε."""
        return self.one_run.epsilon > self.epsilon_proven or (self.two_run is not None and self.two_run.epsilon > self.epsilon_proven)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: numbers, lists and the bounds' dicts."""
        out = {k: getattr(self, k) for k in ("setting", "epsilon", "epsilon_proven", "accounting", "delta", "num_canaries", "degree",
                                              "epochs", "steps", "noise_multiplier", "seconds")}
        for k in ("scores", "coins", "in_scores", "out_scores"):
            out[k] = None if getattr(self, k) is None else getattr(self, k).tolist()
        out["one_run"] = self.one_run.to_dict()
        out["two_run"] = None if self.two_run is None else self.two_run.to_dict()
        return out

    def summary(self) -> str:
        two = f", two-run ε ≥ {self.two_run.epsilon:.3f}" if self.two_run is not None else ""
        return (f"{self.setting}: proven ε = {self.epsilon:.3f} ({self.accounting}, δ = {self.delta:.3g}, σ = "
                f"{self.noise_multiplier:.3g}); one-run ε ≥ {self.one_run.epsilon:.3f} ({self.one_run.correct}/"
                f"{self.one_run.guesses}){two}, each at {self.one_run.confidence:.1%}; m = {self.num_canaries}, K = "
                f"{self.degree}, {self.steps} steps, {self.seconds:.1f} s")


def blackbox_audit(
    setting: str = "nonprivate", *, num_canaries: int = 128, degree: int = 4, epochs: int = 20, delta: float = 1e-5,
    confidence: float = 0.95, two_run: bool = True, score: str = "relative", coins: Tensor | None = None,
    stream: KeyedStream | None = None, background_nodes: int = 200, background_edges: int = 400, dim: int = 16,
    seed: int = 0, expected_batch_size: float = 32.0, neg_per_pos: int = 4,
    progress: Callable[[str], None] | None = None, **train: Any,
) -> BlackBoxAudit:
    """Audit ``setting`` (a key of :data:`SETTINGS`) by real training: one run on secret coins (Steinke et al.), and
    with ``two_run`` one all-in and one all-out run (Clopper–Pearson thresholds; they treat the m in- and out-scores
    as independent trials, an assumption: the two models differ in all m canaries).

    Every run takes ``epochs`` × the all-in world's steps per epoch (so the step count never depends on the coins);
    ``train`` goes to :func:`train_world` (``target_epsilon``, ``lr``, ``hidden_dim``, …). ``progress``: where to write
    plain progress lines (e.g. a function printing to stderr): one as each fit starts and ends, and step lines during
    it (:func:`train_world`); None (default): silent.
    """
    check_choice("setting", setting, SETTINGS)
    check_choice("score", score, SCORES)
    check_int("epochs", epochs, 1)
    check_delta(delta)
    entities = canary_entities(num_canaries, degree, background_nodes=background_nodes, background_edges=background_edges, dim=dim, seed=seed)
    coins = secret_coins(num_canaries, stream=stream) if coins is None else entities._coins(coins)
    sizes = {"expected_batch_size": expected_batch_size, "neg_per_pos": neg_per_pos}
    plan = world_datamodule(entities, torch.ones(num_canaries, dtype=torch.bool), **sizes)
    plan.setup("fit")  # public: the all-in world's steps per epoch
    steps = epochs * plan.sampling_spec.steps_per_epoch
    fits = 3 if two_run else 1
    fit = 0

    def run(included: Tensor, world_name: str) -> tuple[TrainedWorld, Tensor]:
        nonlocal fit
        fit += 1
        label, start = f"{setting} fit {fit}/{fits}", time.perf_counter()
        if progress is not None:
            progress(f"{label} ({world_name}) …")  # no count of the coins: they stay secret
        world = train_world(entities, included, setting, steps=steps, delta=delta, **sizes, **train, progress=progress,
                            progress_label=f"{label} training")
        scores = membership_scores(world.module, entities, score=score)
        if progress is not None:
            progress(f"{label} ({world_name}) done in {time.perf_counter() - start:.1f} s")
        return world, scores

    each = 1.0 - (1.0 - confidence) / 2.0 if two_run else confidence  # Bonferroni over the two bounds
    main, scores = run(coins, "secret coins")
    one = one_run_audit(scores.numpy(), coins.numpy(), delta=delta, confidence=each)
    two, ins, outs, seconds = None, None, None, main.seconds
    if two_run:
        (w_in, ins), (w_out, outs) = run(torch.ones_like(coins), "all in"), run(torch.zeros_like(coins), "all out")
        two = two_run_audit(ins.numpy(), outs.numpy(), delta=delta, confidence=each)
        seconds += w_in.seconds + w_out.seconds
    return BlackBoxAudit(
        setting=setting, epsilon=main.epsilon, accounting=main.accounting, delta=delta, num_canaries=num_canaries,
        degree=degree, epochs=epochs, steps=main.steps, noise_multiplier=main.noise_multiplier, scores=scores,
        coins=coins, one_run=one, two_run=two, in_scores=ins, out_scores=outs, seconds=seconds,
        epsilon_proven=main.epsilon_proven,
    )
