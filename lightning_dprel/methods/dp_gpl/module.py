"""DP-GPL (Alg. 2): frozen Φ pre-trained on G_pub, N teacher prompts on disjoint private groups, Confident-GNMax votes on
public queries (each query charged to the ledger), and the released student prompt tuned on the answered queries only.

Modes (the spec's "provable variant" is the default): ``mode="provable"`` charges every query α/(2σ₁²) + α/σ₂², which
holds for ``view="public"`` (one node reaches one teacher); with ``answer_budget`` = A (fixed beforehand) answering stops
after A answers and the ledger charges Q threshold releases and A vote releases (a filter: Feldman & Zrnic 2021). ``mode="paper"`` also computes the published data-dependent
ε (PATE 2018 analysis), which is itself a function of the private votes: it is kept apart and warned about, never
released as the run's ε. ``threshold=None`` answers every vote query by GNMax (no threshold release; with the
datamodule's ``query_groups`` the teachers vote once per group of queries). ``view="full"`` (the datamodule's
paper-faithful view) voids the bound: ε = ∞. ``sigma_threshold = sigma_vote = 0`` is the noise-free ensemble (clean
argmax on every query, ε = ∞).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from lightning_dprel.accounting.analysis.pate import rho_for_releases
from lightning_dprel.core.checks import (
    check_choice, check_delta, check_int, check_probability, positive_finite, resolve_delta,
)
from lightning_dprel.core.events import GaussianRelease
from lightning_dprel.core.ledger_module import LedgerModule
from lightning_dprel.core.specs import privacy_unit
from lightning_dprel.methods.dp_gpl.aggregation import Answers, confident_gnmax, gnmax, pate_releases, vote_histogram
from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule
from lightning_dprel.methods.dp_gpl.pretrain import GraphEncoder, pretrain
from lightning_dprel.methods.dp_gpl.query_groups import group_votes
from lightning_dprel.methods.dp_gpl.tuning import PromptedModel, TuningConfig, train_teachers_and_vote

__all__ = ["DPGPLModule", "DP_GPL_PAPER_WARNING"]

DP_GPL_PAPER_WARNING = (
    "DP-GPL paper mode: the data-dependent ε (PATE 2018 analysis, as published) is a function of the private vote "
    "histograms; releasing or stopping on it leaks. It is reported under `published_claim` only; the run's ε is the "
    "data-independent bound."
)


class DPGPLModule(LedgerModule):
    """The student of DP-GPL; its fit first trains the teachers and answers the queries (once per model).

    It sits on the ledger layer: every answered query is a charged release (:meth:`planned_releases` tells the
    :class:`~lightning_dprel.callbacks.PrivacyCallback` what a fit will release, so that the callback calibrates σ to its
    target and refuses a fit over the budget before the first release).

    Args:
        hidden_dim, conv, pretraining, pretrain_epochs, pretrain_lr: Φ and its public pre-training.
        prompt, num_basis, teacher_epochs, teacher_lr, lr: prompt kind; teachers' tuning; the student's Adam lr.
        threshold: T as a fraction of the N teachers (Confident-GNMax answers iff noisy max count ≥ T·N); None: GNMax,
            every vote query answered and only its vote release charged (σ₁ unused).
        sigma_threshold, sigma_vote: σ₁, σ₂ (both 0: the noise-free ensemble); ignored when ``target_epsilon`` is set.
        target_epsilon: calibrate σ so that Q queries cost exactly this ε at ``delta`` (data-independent): σ₁ = σ₂ by
            default; with ``answer_budget`` = A, σ₁ = ``sigma_ratio``·σ₂ and ρ = Q/(2σ₁²) + A/σ₂².
        answer_budget: A, fixed before the run: queries are taken in order and answering stops after A answers, so only
            A vote releases are charged (a filter, Feldman & Zrnic 2021); None charges a vote on every query.
        mode: ``"provable"`` or ``"paper"`` (adds the published data-dependent ε, warned, under ``published_claim``).
        teacher_chunk: teachers tuned together in one batch.
        noise_seed: None (secret keyed noise); an int makes the votes' noise reproducible (voids the guarantee).
        allow_untracked: answer without a PrivacyCallback (the releases are still charged to the ledger).
    """

    report_metrics = (("test_acc", "accuracy"),)
    report_title = "Node classification by the released student prompt on"
    report_rows = ("untuned prompt", "student")

    def __init__(self, *, hidden_dim: int = 128, conv: str = "gcn", pretraining: str = "dgi", pretrain_epochs: int = 100,
                 pretrain_lr: float = 1e-3, prompt: str = "gpf_plus", num_basis: int = 5, teacher_epochs: int = 100,
                 teacher_lr: float = 0.05, lr: float = 0.01, threshold: float | None = 0.3, sigma_threshold: float = 40.0,
                 sigma_vote: float = 40.0, target_epsilon: float | None = None, delta: float = 1e-5, mode: str = "provable",
                 answer_budget: int | None = None, sigma_ratio: float = 1.0, teacher_chunk: int = 25, seed: int = 0,
                 noise_seed: int | None = None, allow_untracked: bool = False) -> None:
        super().__init__()
        check_choice("mode", mode, ("provable", "paper"))
        if threshold is not None:
            check_probability("threshold (a fraction of the teachers)", threshold, one=True)
        if threshold is None and (answer_budget is not None or mode == "paper"):
            raise ValueError("`threshold=None` (GNMax, every query answered) takes no `answer_budget`, and the paper's "
                             "data-dependent analysis is of Confident-GNMax: give a threshold.")
        if (sigma_threshold == 0) != (sigma_vote == 0) or sigma_threshold < 0 or sigma_vote < 0:
            raise ValueError("`sigma_threshold` and `sigma_vote` must both be > 0 (private) or both 0 (noise-free).")
        if target_epsilon is not None:
            positive_finite("target_epsilon", target_epsilon)
        check_delta(delta)
        check_int("answer_budget", answer_budget, 1, optional=True)
        positive_finite("sigma_ratio (σ₁/σ₂)", sigma_ratio)
        self.save_hyperparameters()
        if mode == "paper":
            warnings.warn(DP_GPL_PAPER_WARNING, UserWarning, stacklevel=2)
        self._setup_ledger(noise_seed=noise_seed, stream="dp-gpl/votes")
        self.public_data = {"graph": "Φ pre-trained on G_pub (public nodes by a public hash of their ids, edges among them, "
                                     "no labels); queries, student, validation and test on G_pub; private labels reach the "
                                     "student only through the answered noisy votes"}
        self._calibration: tuple[float, float] | None = None  # (ε, δ) the privacy callback calibrated σ for
        self._rho: tuple | None = None  # (settings, ρ) of the last calibration (a search over PLD compositions)
        self.student: PromptedModel | None = None
        self.answers: Answers | None = None
        self.paper_claim: dict[str, Any] = {}
        self.view = "public"
        self.dims: dict[str, int] | None = None
        self.query_ids: torch.Tensor | None = None  # stable ids of the queries the answers belong to
        self.query_groups: int | None = None  # the datamodule's: answers are per group of queries
        self.val_acc, self.test_acc = MulticlassAccuracy(2), MulticlassAccuracy(2)  # resized in setup

    # --- Φ and the student ------------------------------------------------------------------------------
    def _build(self, num_features: int, num_classes: int, hops: int) -> None:
        hp = self.hparams
        self.dims = {"num_features": int(num_features), "num_classes": int(num_classes), "hops": int(hops)}
        self.encoder = GraphEncoder(num_features, hp.hidden_dim, num_layers=hops, conv=hp.conv)
        self.tuning = TuningConfig(hp.prompt, hp.teacher_epochs, hp.teacher_lr, hp.num_basis)
        torch.manual_seed(hp.seed)
        self.student = PromptedModel(self.encoder, num_classes, self.tuning)
        self.val_acc, self.test_acc = MulticlassAccuracy(num_classes, average="micro"), MulticlassAccuracy(num_classes, average="micro")

    def setup(self, stage: str | None = None) -> None:
        if self.student is not None:
            return
        dm = self.trainer.datamodule
        if not isinstance(dm, PromptDataModule):
            raise TypeError(f"DPGPLModule needs a PromptDataModule, got {type(dm).__name__}.")
        dm.setup(stage)
        hp = self.hparams
        self._build(dm.num_features, dm.num_classes, dm.hops)
        pretrain(self.encoder, *dm.public_graph(), method=hp.pretraining, epochs=hp.pretrain_epochs, lr=hp.pretrain_lr, seed=hp.seed)
        self.view = dm.view
        resolve_delta(hp.delta, privacy_unit(dm.privacy_unit), dm.num_private_units, warn=True, who=f"{type(self).__name__}: ")

    # --- checkpoints and export: the student, Φ (public), the released answers and the ledger -------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)  # the ledger (never the paper mode's data-dependent ε: it is private)
        answers = None if self.answers is None else {"answered": self.answers.answered, "labels": self.answers.labels}
        if answers is not None:
            answers["queries"] = self.query_ids
        checkpoint["lightning_dprel"].update(answers=answers, dims=self.dims, view=self.view, query_groups=self.query_groups,
                                             calibration=self._calibration)  # the (ε, δ) the votes' σ was solved for

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["lightning_dprel"]
        self._build(**state["dims"])
        super().on_load_checkpoint(checkpoint)
        if state["answers"] is not None:
            self.answers = Answers(state["answers"]["answered"], state["answers"]["labels"])
            self.query_ids = state["answers"].get("queries")
        self.view, self.query_groups = state["view"], state.get("query_groups")
        self._calibration = tuple(state["calibration"]) if state.get("calibration") else None

    def released_weights(self) -> dict[str, torch.Tensor]:
        """The student prompt and head with Φ; no teacher, vote or key leaves the run."""
        if self.student is None or self.answers is None:
            raise RuntimeError("Nothing to export: fit the module first (its student is what DP-GPL releases).")
        return dict(self.student.state_dict())

    def export_meta(self) -> dict[str, Any]:
        return {**super().export_meta(), **(self.dims or {})}

    def configure_optimizers(self):
        return torch.optim.Adam(self.student.trainable(), lr=self.hparams.lr)

    # --- the private part: teachers, votes, Confident-GNMax, the ledger ---------------------------------
    @property
    def sigmas(self) -> tuple[float | None, float]:
        """(σ₁, σ₂); σ₁ is None without a threshold."""
        hp = self.hparams
        target, delta = self._calibration or (hp.target_epsilon, hp.delta)
        if target is None:
            return (None if hp.threshold is None else float(hp.sigma_threshold)), float(hp.sigma_vote)
        queries = self.answers.answered.numel() if self.answers is not None else self.trainer.datamodule.num_vote_queries
        slots = queries if hp.answer_budget is None else min(hp.answer_budget, queries)
        r = 1.0 if slots == queries else float(hp.sigma_ratio)
        key = (target, delta, queries, slots, r, hp.threshold is None)
        if self._rho is None or self._rho[0] != key:  # ρ = Q/(2σ₁²) + A/σ₂² (vote sensitivity √2), on the tight bound
            self._rho = (key, rho_for_releases(target, delta, lambda rho: self._releases_at(rho, queries, slots, r)))
        return self._sigmas_at(self._rho[1], queries, slots, r)

    def _sigmas_at(self, rho: float, queries: int, slots: int, r: float) -> tuple[float | None, float]:
        if self.hparams.threshold is None:  # only vote releases
            return None, math.sqrt(queries / rho)
        s2 = math.sqrt((queries / (2.0 * r * r) + slots) / rho)
        return r * s2, s2

    def _releases_at(self, rho: float, queries: int, slots: int, r: float) -> list[tuple[float, int]]:
        s1, s2 = self._sigmas_at(rho, queries, slots, r)
        return [(e.noise_multiplier, e.count) for e in pate_releases(sigma_threshold=s1, sigma_vote=s2, queries=queries,
                                                                     answer_slots=slots if s1 is not None else None)]

    @property
    def is_private(self) -> bool:
        return self.sigmas[1] > 0 and self.view != "full"

    @property
    def declared_delta(self) -> float:
        return float(self.hparams.delta)

    def planned_releases(self) -> list[GaussianRelease]:
        """The releases the next fit charges: none once the queries are answered, else every query's (Alg. 2, step 4)."""
        if self.answers is not None:
            return []
        if not self.is_private:
            raise ValueError(f"{type(self).__name__}: noise-free votes or the full-graph view have no finite ε; no privacy "
                             "callback can track them (remove it, and read the run as a non-private reference).")
        s1, s2 = self.sigmas
        return list(pate_releases(sigma_threshold=s1, sigma_vote=s2, queries=self.trainer.datamodule.num_vote_queries,
                                  answer_slots=self.hparams.answer_budget))

    def calibrate_releases(self, target_epsilon: float, delta: float) -> None:
        """σ so that the queries spend exactly ``target_epsilon`` at ``delta`` (data-independent, :func:`rho_for_epsilon`)."""
        if self.answers is None:  # a hair below the target, so that rounding never puts ε above it
            self._calibration = (float(target_epsilon) * (1.0 - 1e-9), float(delta))

    def vote(self, dm: PromptDataModule) -> torch.Tensor:
        """Votes [N, Q] of N teachers, each tuned on its own group only (Alg. 2, steps 2-3)."""
        examples, labels, teacher = dm.teacher_examples()
        return train_teachers_and_vote(self.encoder, dm.data.x, examples, labels, teacher, dm.query_examples(),
                                       num_teachers=dm.num_teachers, num_classes=dm.num_classes, cfg=self.tuning,
                                       chunk=int(self.hparams.teacher_chunk), seed=int(self.hparams.seed))

    def on_fit_start(self) -> None:
        super().on_fit_start()  # refuses an untracked private fit before any release
        dm = self.trainer.datamodule
        self.charge_data_releases(dm)  # releases already made on this data (the privacy callback charged them first)
        if self.answers is None:  # the queries are answered once per model: a second fit never re-queries
            votes = self.vote(dm)
            if dm.query_groups is not None:
                votes = group_votes(votes, dm.query_group, dm.num_vote_queries, dm.num_classes)
            counts = vote_histogram(votes, dm.num_classes)
            s1, s2 = self.sigmas
            if s2 == 0:
                q = counts.shape[0]
                self.answers = Answers(torch.ones(q, dtype=torch.bool), counts.argmax(1))
            elif s1 is None:
                self.answers = gnmax(counts, sigma_vote=s2, stream=self.noise_source)
                for event in pate_releases(sigma_threshold=None, sigma_vote=s2, queries=counts.shape[0]):
                    self.charge(event)
            else:
                T = self.hparams.threshold * dm.num_teachers
                budget = self.hparams.answer_budget
                self.answers = confident_gnmax(counts, threshold=T, sigma_threshold=s1, sigma_vote=s2, stream=self.noise_source,
                                               max_answers=budget)
                for event in pate_releases(sigma_threshold=s1, sigma_vote=s2, queries=counts.shape[0], answer_slots=budget):
                    self.charge(event)
                if self.hparams.mode == "paper":
                    self._paper_claim(counts, T, s1, s2)
        ids = dm.data.node_id[dm.queries]
        if self.query_ids is None:
            self.query_ids, self.query_groups = ids, dm.query_groups
        elif not torch.equal(self.query_ids, ids) or self.query_groups != dm.query_groups:
            raise ValueError("This model's released answers belong to other queries than this datamodule's; a second fit "
                             "must use the same PromptDataModule settings (its queries are answered once per model).")
        dm.set_answers(self.answers.answered, self.answers.labels)

    def _paper_claim(self, counts: torch.Tensor, T: float, s1: float, s2: float) -> None:
        from lightning_dprel.accounting.analysis.pate import epsilon_from_rdp, pate_data_dependent_rdp
        from lightning_dprel.accounting.orders import DEFAULT_ORDERS

        rdp = pate_data_dependent_rdp(counts.numpy(), T, s1, s2, DEFAULT_ORDERS, answered=self.answers.answered.numpy())
        eps = epsilon_from_rdp(rdp, DEFAULT_ORDERS, self.report_delta())
        self.paper_claim = {"data_dependent_epsilon": float(eps), "warning": DP_GPL_PAPER_WARNING}

    def report_delta(self, delta: float | None = None) -> float:
        return float(super().report_delta(delta) or self.hparams.delta)

    def epsilon(self, delta: float | None = None) -> float:
        """The provable ε of the released student: the ledger's, ∞ without noise or with ``view="full"``."""
        if self.answers is None or self.view == "full" or not self.privacy_ledger.segments:
            return math.inf
        return super().epsilon(delta)

    # --- the student (public queries and released labels only: post-processing) ------------------------
    def training_step(self, batch, batch_idx: int):
        examples, labels = batch
        if examples.size == 0:
            return None
        loss = F.cross_entropy(self.student(self.trainer.datamodule.data.x, examples), labels)
        self.log("train_loss", loss, batch_size=examples.size, prog_bar=True)
        return loss

    def _accuracy(self, batch, metric, name: str) -> None:
        examples, labels = batch
        metric.update(self.student(self.trainer.datamodule.data.x, examples).argmax(-1), labels)
        self.log(name, metric, on_epoch=True, batch_size=examples.size)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._accuracy(batch, self.val_acc, "val_acc")

    def test_step(self, batch, batch_idx: int) -> None:
        self._accuracy(batch, self.test_acc, "test_acc")

    def privacy_details(self) -> dict[str, Any]:
        """privacy.json's PATE fields: what was released (answered labels), σ₁, σ₂, T and the view."""
        s1, s2 = self.sigmas
        return {"mechanism": f"{self._mechanism}, data-independent", "privacy_unit": str(privacy_unit(PromptDataModule.privacy_unit)),
                "query_groups": self.query_groups,
                "queries": int(self.answers.answered.numel()) if self.answers is not None else 0,
                "answered": self.answers.num_answered if self.answers is not None else 0,
                "sigma_threshold": s1, "sigma_vote": s2, "threshold": self.hparams.threshold, "view": self.view,
                "answer_budget": self.hparams.answer_budget,
                **({"published_claim": "computed in paper mode and kept in memory only (module.paper_claim): the "
                                       "data-dependent ε is a function of the private votes and is not released"}
                   if self.paper_claim else {})}

    def privacy_claims(self) -> dict[str, Any]:
        return {}  # the paper mode's data-dependent ε is private (module.paper_claim); privacy_details says so

    def privacy_summary(self, *, target: float | None = None) -> dict[str, Any] | None:
        """The CLI's privacy line: ε of the answered queries (or why none holds)."""
        if self.answers is None:
            return None
        r, eps = self.privacy_report(), self.epsilon()
        if math.isinf(eps):
            why = "full-graph view: one node reaches many teachers" if self.view == "full" else "noise-free votes"
            return {"text": f"epsilon = inf ({why}); {r['answered']} of {r['queries']} queries answered"}
        gate = "" if r["sigma_threshold"] is None else f"sigma_threshold = {r['sigma_threshold']:.4g}, "
        return {"text": f"epsilon = {eps:.4f} (delta = {r['delta']:.3g}, unit: labelled node), {r['queries']} "
                        f"{'queries' if self.query_groups is None else 'query groups'} ({r['answered']} answered), {gate}"
                        f"sigma_vote = {r['sigma_vote']:.4g}, accounting: {self._mechanism}, data-independent"}

    @property
    def _mechanism(self) -> str:
        return "GNMax" if self.hparams.threshold is None else "Confident-GNMax"
