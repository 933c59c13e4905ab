"""The paper-faithful run's stop rule: AdvSGM's Theorem 7 accounting decides when training stops (Algorithm 3 l. 9–11).

That ε does not hold (provable ε = ∞, spec items 1–9): the callback only reproduces *when* the published pipeline
stops, and labels the run with the nominal ε next to the provable one.
"""

from __future__ import annotations

from typing import Any

from pytorch_lightning import Callback

from lightning_dprel.core.checks import check_choice, positive_finite
from lightning_dprel.methods.advsgm.accounting import STOP_RULES, advsgm_paper_curve, advsgm_paper_stop_iteration

__all__ = ["PaperStop"]


class PaperStop(Callback):
    """Stop a ``mode="paper"`` :class:`~lightning_dprel.methods.advsgm.module.DPSkipGramModule` where the paper would.

    Args:
        target_epsilon: the nominal ε the paper's run aims at.
        delta: δ of the paper (1e-5).
        rule: ``"theorem7"`` (Theorem 7 composed correctly) or ``"code_product"`` (the authors' script).
        max_iterations: n_epoch·n_D (750 in the paper).
    """

    def __init__(self, target_epsilon: float, *, delta: float = 1e-5, rule: str = "theorem7", max_iterations: int = 750) -> None:
        check_choice("rule", rule, STOP_RULES)
        positive_finite("target_epsilon", target_epsilon)
        self.target_epsilon, self.delta, self.rule, self.max_iterations = float(target_epsilon), float(delta), rule, int(max_iterations)
        self.stop_at: int | None = None
        self.iterations = 0
        self._curve: Any = None  # Theorem 7's ε(T), its per-iteration RDP computed once per fit

    def _sizes(self, trainer: Any, module: Any) -> dict[str, Any]:
        spec = trainer.datamodule.sampling_spec
        tuples, b = spec.detail, int(round(spec.expected_batch_size))
        return {"num_nodes": tuples.num_nodes, "num_edges": spec.population, "batch_size": b,
                "k": tuples.neg_per_pos, "sigma": float(module.hparams.paper_sigma),
                "delta": self.delta}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if pl_module.hparams.get("mode") != "paper":
            raise ValueError("PaperStop stops the paper-faithful mode only (DPSkipGramModule(mode='paper')); use PrivacyCallback otherwise.")
        sizes = self._sizes(trainer, pl_module)
        self.stop_at = advsgm_paper_stop_iteration(self.target_epsilon, max_iterations=self.max_iterations, rule=self.rule, **sizes)
        self._curve = advsgm_paper_curve(**sizes)
        if self.stop_at < 1:
            raise ValueError(f"The paper's accounting allows no iteration at ε = {self.target_epsilon}; raise target_epsilon.")
        self._label(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.iterations += 1
        self._label(trainer, pl_module)
        if self.iterations >= self.stop_at:
            trainer.should_stop = True

    def _label(self, trainer: Any, module: Any) -> None:
        nominal = self._curve(self.iterations) if self.iterations else 0.0
        module.paper_claim = {"nominal_epsilon": nominal, "target_epsilon": self.target_epsilon, "stop_rule": self.rule,
                              "iterations": self.iterations, "stop_at": self.stop_at, "delta": self.delta}

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = int(state_dict.get("iterations", 0))
