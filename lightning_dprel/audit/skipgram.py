"""Auditing AdvSGM (spec A2): degree-1 canary nodes, one training run, a one-run ε lower bound (Steinke et al. 2023).

Canary c is a new node id with one edge (c, host_c) to a random node of the base graph. Its secret coin (keyed
stream) decides whether the edge is in the training graph; the id exists in both worlds (unit ``node_public_ids``: the
node keeps its row without edges; at the edge level, unit ``edge``, the canary is the relation
itself). After training, the auditor scores each canary from the released W_in and W_out:

* ``"displacement"``: ‖v_c − v_c⁰‖, how far the canary's node vector left its (public) initialisation. Under the
  paper-faithful pipeline an isolated node's row never moves (spec item 1), so every moved row is an included canary.
* ``"alignment"``: ⟨v_c − v_c⁰, c_host⟩, how far it moved toward its host's context vector (the skip-gram pull).

Scores get a keyed jitter of 1e-9 (independent of the coins), so ties are guessed at random rather than against the
auditor. A lower bound above the proven ε is a violation; in paper mode it is compared with the paper's nominal ε.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import pytorch_lightning as pl
import torch
from torch_geometric.data import Data

from lightning_dprel.audit.bounds import OneRunBound, one_run_audit
from lightning_dprel.audit.canaries import check_int, secret_coins
from lightning_dprel.callbacks.privacy import PrivacyCallback
from lightning_dprel.core.checks import check_choice
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.methods.advsgm import (
    AdvSGMPaperDataModule, DPSkipGramModule, EdgeSkipGramDataModule, PaperStop, SkipGramDataModule,
)

__all__ = ["SkipGramAudit", "skipgram_audit", "SCORES"]

SCORES = ("auto", "displacement", "alignment")


@dataclass
class SkipGramAudit:
    """One audited AdvSGM run: the proven (and, in paper mode, nominal) ε beside the one-run lower bound."""

    mode: str
    score: str
    canaries: int
    included: int
    moved_in: int
    moved_out: int
    delta: float
    epsilon_proven: float
    epsilon_nominal: float | None
    one_run: OneRunBound
    level: str = "node"  #: the provable mode's unit: "node" (node_public_ids) or "edge"

    @property
    def violation(self) -> bool:
        """The audited lower bound exceeds the proven ε: a bug, never a number to hide."""
        return self.one_run.epsilon > self.epsilon_proven

    @property
    def beats_nominal(self) -> bool:
        """The lower bound exceeds the paper's nominal ε: that claim is refuted on this run."""
        return self.epsilon_nominal is not None and self.one_run.epsilon > self.epsilon_nominal

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violation": self.violation, "beats_nominal": self.beats_nominal}


def _world(base: Data, hosts: torch.Tensor, coins: torch.Tensor) -> Data:
    n0, m = int(base.num_nodes), hosts.numel()
    ids = torch.arange(n0, n0 + m)
    canary_edges = torch.stack([ids[coins], hosts[coins]])
    return Data(edge_index=torch.cat([base.edge_index, canary_edges], 1), num_nodes=n0 + m)


def skipgram_audit(
    base: Data, *, mode: str = "provable", canaries: int = 200, target_epsilon: float = 1.0, delta: float = 1e-5,
    steps: int = 200, score: str = "auto", confidence: float = 0.95, datamodule: dict | None = None,
    module: dict | None = None, coins: KeyedStream | None = None, seed: int = 0, level: str = "node",
) -> SkipGramAudit:
    """Train once on ``base`` plus ``canaries`` degree-1 canaries (secret coins) and audit the released tables.

    Args:
        base: the public part of the graph (PyG ``Data`` with ``edge_index``, ``num_nodes``).
        mode: ``"provable"`` (PrivacyCallback calibrated to ``target_epsilon``, ``steps`` steps) or ``"paper"``
            (stopped by :class:`~lightning_dprel.methods.advsgm.paper.PaperStop` at the nominal ``target_epsilon``).
        canaries: m ≥ 2 canary nodes.
        steps: the provable run's steps (paper mode: at most 750 iterations).
        score: ``"auto"`` (displacement in paper mode, alignment in provable mode), ``"displacement"``, ``"alignment"``.
        datamodule, module: extra options of the datamodule and of :class:`DPSkipGramModule`.
        coins: the coins' keyed stream (default: secret); a seeded one for tests.
        seed: the public seed of the canaries' hosts.
        level: the provable mode's unit: ``"node"`` (``node_public_ids``) or ``"edge"`` (``edge``, ``skipgram_edge``).
    """
    check_int("canaries", canaries, 2)
    check_choice("mode", mode, ("provable", "paper"))
    check_choice("level", level, ("node", "edge"))
    if level == "edge" and mode == "paper":
        raise ValueError("`level='edge'` is a provable mode's unit; the paper-faithful mode has none (provable ε = ∞).")
    check_choice("score", score, SCORES)
    score = ("displacement" if mode == "paper" else "alignment") if score == "auto" else score
    n0 = int(base.num_nodes)
    hosts = torch.randint(0, n0, (canaries,), generator=torch.Generator().manual_seed(seed))
    included = secret_coins(canaries, stream=coins)
    graph = _world(base, hosts, included)
    dm_opts, mod_opts = dict(datamodule or {}), dict(module or {})
    if mode == "paper":
        dm = AdvSGMPaperDataModule(graph, test_source=graph, **dm_opts)
        model = DPSkipGramModule(mode="paper", num_nodes=graph.num_nodes, **mod_opts)
        callbacks, max_steps = [PaperStop(target_epsilon, delta=delta)], 2 * 750
    else:
        if level == "edge":
            mod_opts.setdefault("accounting", "skipgram_edge")
        dm = (EdgeSkipGramDataModule if level == "edge" else SkipGramDataModule)(graph, test_source=graph, **dm_opts)
        model = DPSkipGramModule(num_nodes=graph.num_nodes, **mod_opts)
        callbacks, max_steps = [PrivacyCallback(target_epsilon=target_epsilon, delta=delta, calibrate=True)], steps
    init = model.node_vectors.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        log_level = logging.getLogger("pytorch_lightning").level
        logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
        try:
            pl.Trainer(max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu",
                       callbacks=callbacks).fit(model, dm)
        finally:
            logging.getLogger("pytorch_lightning").setLevel(log_level)
    ids = torch.arange(n0, n0 + canaries)
    moved = model.node_vectors[ids] - init[ids]
    raw = moved.norm(dim=1) if score == "displacement" else (moved * model.context_vectors[hosts]).sum(1)
    jitter = KeyedStream.secret("audit-jitter").uniform(canaries).to(raw.dtype) * 1e-9
    sides = "top" if score == "displacement" else "both"  # a moved row reveals inclusion; a still one reveals nothing
    bound = one_run_audit((raw + jitter).double().numpy(), included.numpy(), delta=delta, confidence=confidence, sides=sides)
    changed = moved.abs().amax(dim=1) > 0
    proven = model.privacy_ledger.epsilon(delta) if mode == "provable" else math.inf
    nominal = model.paper_claim.get("nominal_epsilon") if mode == "paper" else None
    return SkipGramAudit(
        mode=mode, score=score, canaries=canaries, included=int(included.sum()), moved_in=int((changed & included).sum()),
        moved_out=int((changed & ~included).sum()), delta=delta, epsilon_proven=float(proven), epsilon_nominal=nominal,
        one_run=bound, level=level,
    )
