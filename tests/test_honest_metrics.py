"""Issue 12: metrics that cannot flatter — NaN and ties rank pessimistically, dropped tuples are reported,
and ε reaches the loggers after every step, whatever the trainer's ``log_every_n_steps``."""

from __future__ import annotations

import math

import pytest
import torch
from test_privacy_callback import MemoryLogger, SpecDataModule, independent_eps, make_spec, module_for

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.methods.relational.ranking import target_ranks


def test_nan_and_ties_count_against_the_target():
    h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # all tied
    query, target = torch.tensor([0]), torch.tensor([1])
    assert target_ranks(h, query, target, None, score="dot", temperature=1.0).tolist() == [3]  # last of 3 candidates
    nan_target = h.clone()
    nan_target[1] = float("nan")
    assert target_ranks(nan_target, query, target, None, score="dot", temperature=1.0).tolist() == [3]
    nan_other = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [float("nan"), 0.0]])
    # node 2 scores below the target, node 3 is NaN: it counts against the target
    assert target_ranks(nan_other, query, target, None, score="dot", temperature=1.0).tolist() == [2]
    cands = torch.tensor([[1, 2, 3]])
    assert target_ranks(nan_other, query, target, cands, score="cosine", temperature=0.1).tolist() == [2]


def test_nan_embeddings_do_not_inflate_prec1():
    g = torch.Generator().manual_seed(0)
    n = 400
    h = torch.randn(n, 16, generator=g)
    query = torch.arange(0, n, 2)
    target = torch.arange(1, n, 2)
    clean = (target_ranks(h, query, target, None, score="cosine", temperature=0.1) == 1).double().mean()
    broken = h.clone()
    broken[torch.randperm(n, generator=g)[: n // 2]] = float("nan")  # half the nodes
    prec1 = (target_ranks(broken, query, target, None, score="cosine", temperature=0.1) == 1).double().mean()
    assert float(prec1) <= float(clean) + 0.01  # before: NaN targets ranked first, PREC@1 0.00 → 0.8


def test_a_step_that_drops_non_finite_tuples_says_so():
    params = {"w": torch.nn.Parameter(torch.zeros(2))}
    dp = DPOptimizer(torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0, clip_norm=1.0,
                     clipping="standard", noise=KeyedStream.seeded(0, "noise", warn=False))
    grads = {"w": torch.tensor([[0.3, 0.4], [float("nan"), 0.0], [float("inf"), 1.0]])}
    dp.record(grads, max_freq=None, expected_batch_size=3.0)
    with pytest.warns(UserWarning, match=r"2 of 3 tuples in this step had non-finite gradients and were dropped"):
        dp.step()
    assert dp.last_step_stats["dropped"] == 2.0


@pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval")  # on purpose
def test_epsilon_reaches_the_loggers_every_step_and_is_kept_as_history():
    spec, sigma, mech = make_spec(K=4, k=3, gamma=0.02), 1.1, "freq_corrected"
    callback, module, logger = PrivacyCallback(), module_for(mech, sigma), MemoryLogger()
    import pytorch_lightning as pl

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=10, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])  # log_every_n_steps=50
    trainer.fit(module, datamodule=SpecDataModule(spec))
    delta = 1.0 / spec.num_edges
    expected = [independent_eps(mech, spec, sigma, delta, t) for t in range(1, 11)]
    assert logger.values("epsilon") == pytest.approx(expected, rel=1e-9)
    assert [t for t, _ in callback.history] == list(range(1, 11))
    assert [e for _, e in callback.history] == pytest.approx(expected, rel=1e-12)
    restored = PrivacyCallback()
    restored.load_state_dict(callback.state_dict())
    assert restored.history == callback.history and all(math.isfinite(e) for _, e in restored.history)
