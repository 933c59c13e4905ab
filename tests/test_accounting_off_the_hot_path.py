"""Accounting off the hot path: the fast PLD paths give dp-accounting's numbers, a fit's ε curve is computed once and
read per step, a changed plan is recomputed, AdvSGM's Theorem 7 is read from a curve, the CLI stays light."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from scipy import special
from scipy.stats import binom

from lightning_dprel.accounting import Accountant, pld
from lightning_dprel.accounting.accountant import _grid_count
from lightning_dprel.accounting.mechanisms import PLD_CURVES
from lightning_dprel.core.specs import SamplingSpec

DELTA = 1e-5


def _same_pmfs(ours, theirs) -> None:
    assert ours._symmetric == theirs._symmetric
    for a, b in ((ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)):
        assert type(a) is type(b)
        a, b = (a, b) if hasattr(a, "_probs") else (a.to_dense_pmf(), b.to_dense_pmf())
        assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
        assert np.array_equal(a._probs, b._probs)


@pytest.mark.parametrize("q, sigma", [(1.0, 2.0), (0.3, 0.5), (0.05, 0.88), (0.01, 1.0), (1e-3, 0.7)])
def test_the_gaussian_pld_is_dp_accountings_bit_for_bit(q, sigma):
    width = pld.discretization_for(q)
    ours = pld.poisson_gaussian_pld(q, sigma, width)
    _same_pmfs(ours, dp_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=width))


@pytest.mark.parametrize("k, gamma, sigma", [(5, 0.01, 1.5), (3, 0.1, 0.9), (2, 0.3, 2.0)])
def test_the_mixture_pld_is_dp_accountings_bit_for_bit(k, gamma, sigma):
    probs = [float(w) for w in binom.pmf(range(k + 1), k, gamma)]
    probs[-1] = max(probs[-1], 1.0 - sum(probs[:-1]))
    sens = [float(i) for i in range(k + 1)]
    ours = pld.mixture_gaussian_pld(sigma, sens, probs, 1e-2)
    _same_pmfs(ours, dp_pld.from_mixture_gaussian_mechanism(sigma, sens, probs, value_discretization_interval=1e-2))


@pytest.mark.parametrize("count", [2, 7, 41, 500])
def test_self_composition_is_dp_accountings_bit_for_bit(count):
    for one in (pld.poisson_gaussian_pld(0.05, 0.88, 1e-3), pld.replace_one_pld(0.05, 1.0, 1e-3), pld.gaussian_pld(3.0)):
        _same_pmfs(pld.self_composed(one, count), one.self_compose(count))


def test_the_moments_of_the_truncation_bounds_are_scipys_logsumexp():
    pmf = pld.poisson_gaussian_pld(0.05, 0.88, 1e-3)._pmf_add
    orders, log_mgfs = pld._log_mgfs(pmf)
    n = len(pmf._probs)
    assert log_mgfs == [special.logsumexp(np.arange(n) * o, b=pmf._probs) for o in orders]


def test_pld_epsilon_is_dp_accountings_to_1e_12():
    for one in (pld.poisson_gaussian_pld(0.05, 0.88, 1e-3), pld.poisson_gaussian_pld(1e-3, 0.6, 1e-4), pld.gaussian_pld(0.3)):
        for count in (1, 3, 40, 300):
            composed = pld.self_composed(one, count)
            for delta in (1e-3, 1e-5, 1e-8, 1e-12):
                theirs = composed.get_epsilon_for_delta(delta)
                assert pld.pld_epsilon(composed, delta) == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def _spec(q: float = 0.05) -> SamplingSpec:
    return SamplingSpec(population=2000, contribution_bound=1, sampling_rate=q, expected_batch_size=2000 * q,
                        steps_per_epoch=20, privacy_unit="example")


def _exact(steps: list[tuple[float, int]]) -> float:
    """ε of these (σ, steps) runs from a fresh accountant, with no shared curve."""
    PLD_CURVES.clear()
    acc = Accountant("poisson_gaussian")
    for sigma, n in steps:
        acc.step(_spec(), sigma, n)
    return acc.get_epsilon(DELTA)


def test_a_planned_fit_reads_its_epsilon_curve_without_composing(monkeypatch):
    PLD_CURVES.clear()
    planner = Accountant("poisson_gaussian")
    planner.plan(DELTA, _spec(), 0.9, 40)
    calls = []
    real = pld.self_composed
    monkeypatch.setattr("lightning_dprel.accounting.accountant.self_composed", lambda *a: calls.append(a) or real(*a))
    fit, live = Accountant("poisson_gaussian"), []
    for _ in range(40):
        fit.step(_spec(), 0.9)
        live.append(fit.live_epsilon(DELTA))
    assert calls == []  # every step read the curve computed at the plan
    monkeypatch.undo()
    for t in (1, 7, 10, 40):
        exact = _exact([(0.9, t)])
        assert exact <= live[t - 1] and (t > 10 or live[t - 1] == exact)  # exact on 1…10, then the next grid count's


@pytest.mark.parametrize("q, sigma", [(0.05, 0.9), (1.0, 1.0)])  # PLD below RDP; RDP below the grid's PLD at some steps
def test_live_epsilon_read_every_step_equals_one_read_at_that_step(q, sigma):
    """Per-step reads skip the RDP conversion only where RDP already exceeded the PLD earlier in the grid interval, and
    repeat the interval's answer without reading the curve; with a budget, near it, they answer as a fresh read does."""
    PLD_CURVES.clear()
    every, rdp_won = Accountant("poisson_gaussian"), 0
    budget = _exact([(sigma, 45)])  # the grid's PLD passes it before step 45: exact ε from there, then above it
    for t in range(1, 61):
        every.step(_spec(q), sigma)
        once = Accountant("poisson_gaussian")
        once.step(_spec(q), sigma, t)
        rdp = once.get_epsilon_and_order(DELTA)[0]
        assert every.live_epsilon(DELTA) == once.live_epsilon(DELTA) == min(rdp, once._pld_at(DELTA, _grid_count(t)))
        assert every.live_epsilon(DELTA, target=budget) == once.live_epsilon(DELTA, target=budget)
        assert every.live_epsilon(DELTA) == once.live_epsilon(DELTA)  # a read with a budget leaves the next one alone
        rdp_won += rdp < once._pld_at(DELTA, _grid_count(t))
    assert (rdp_won > 0) == (q == 1.0)  # at q = 1 both branches of the min are read


def _fit_the_mlp_project(steps: int, after: object):
    """The MLP project made private (σ = 0.9, no target) for ``steps`` steps, ``after`` the privacy callback; its callback."""
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import TensorDataset

    from lightning_dprel import DPDataLoader, PrivacyCallback
    from projects import tabular_classifier_private as private

    x = torch.randn(400, 6, generator=torch.Generator().manual_seed(0))
    cb = PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=0.9)
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[cb, after])
    with pytest.warns(UserWarning, match="seed"):
        trainer.fit(private.MLPClassifier(6, 2), train_dataloaders=DPDataLoader(
            TensorDataset(x, (x[:, 0] > 0).long()), batch_size=20.0, seed=0))
    return cb


@pytest.mark.filterwarnings("ignore:You defined a `validation_step`")
def test_a_fit_without_a_target_plans_its_epsilon_curve_at_fit_start(monkeypatch):
    import pytorch_lightning as pl

    PLD_CURVES.clear()
    calls, marks = [], {}
    real = pld.self_composed
    monkeypatch.setattr("lightning_dprel.accounting.accountant.self_composed", lambda *a: calls.append(a) or real(*a))

    class Count(pl.Callback):  # after the privacy callback's hooks
        def on_train_start(self, trainer, pl_module):
            marks["start"] = len(calls)

        def on_train_batch_end(self, trainer, pl_module, *args):
            marks["last"] = len(calls)

    cb = _fit_the_mlp_project(40, Count())
    assert marks["start"] > 0 and marks["last"] == marks["start"]  # planned at fit start; no step composed a PLD
    assert len(cb.history) == 40 and all(live >= _exact_at(cb._sampling, 0.9, t) * (1 - 1e-9) for t, live in cb.history)


def _exact_at(spec: SamplingSpec, sigma: float, t: int) -> float:
    acc = Accountant("poisson_gaussian")
    acc.step(spec, sigma, t)
    return acc.get_epsilon(DELTA)


def test_a_changed_plan_is_recomputed_exactly():
    PLD_CURVES.clear()
    acc = Accountant("poisson_gaussian")
    acc.plan(DELTA, _spec(), 0.9, 20)
    acc.step(_spec(), 0.9, 20)
    acc.step(_spec(), 1.3, 15)  # another σ: a run the plan did not cover
    assert acc.get_epsilon(DELTA) == _exact([(0.9, 20), (1.3, 15)])
    acc.step(_spec(), 1.3, 30)  # beyond any plan
    assert acc.get_epsilon(DELTA) == _exact([(0.9, 20), (1.3, 45)])


def test_the_accounting_cli_loads_neither_torch_nor_dp_accounting_for_an_rdp_bound():
    code = ("import sys, io, contextlib\nfrom lightning_dprel.accounting.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['epsilon', '--nodes', '2708', '--edges', '5000', '--max-degree', '5', '--sampling-rate', '0.01', "
            "'--neg-per-pos', '1', '--noise-multiplier', '1.0', '--steps', '1000', '--clipping', 'freq'])\n"
            "print(sorted(m for m in ('torch', 'dp_accounting', 'pytorch_lightning', 'scipy.stats') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_advsgm_theorem_7_is_read_from_a_curve_computed_once(monkeypatch):
    from lightning_dprel.methods.advsgm import accounting as advsgm

    sizes = dict(num_nodes=200, num_edges=900, batch_size=16, k=2, sigma=5.0, delta=1e-5)
    expected = {t: advsgm.advsgm_paper_epsilon(t, **sizes) for t in (1, 17, 100)}
    calls = []
    real = advsgm._advsgm_paper
    monkeypatch.setattr(advsgm, "_advsgm_paper", lambda *a: calls.append(a) or real(*a))
    curve = advsgm.advsgm_paper_curve(**sizes)
    assert {t: curve(t) for t in (1, 17, 100)} == expected and len(calls) == 1


def test_the_bar_shows_the_live_epsilon_of_every_step_and_lightning_logs_it_only_when_it_changes(monkeypatch):
    """``self.log`` costs more than the live ε itself; the bar (and ``callback_metrics``) keep a value until it is logged
    again, so ε is handed to Lightning only when it changes, and after every step the bar shows that step's ε."""
    import pytorch_lightning as pl

    logged, shown = [], []
    real = pl.LightningModule.log
    monkeypatch.setattr(pl.LightningModule, "log", lambda self, name, value, *a, **k: (
        logged.append(value) if name == "epsilon" else None, real(self, name, value, *a, **k))[1])

    class Bar(pl.Callback):  # after the privacy callback's hooks
        def on_train_batch_end(self, trainer, pl_module, *args):
            shown.append((float(trainer.progress_bar_metrics["epsilon"]), float(trainer.callback_metrics["epsilon"])))

    cb = _fit_the_mlp_project(60, Bar())
    live = [e for _, e in cb.history]
    assert len(live) == 60 and [b for b, _ in shown] == pytest.approx(live, rel=1e-6)
    assert [c for _, c in shown] == pytest.approx(live, rel=1e-6)  # over 3 epochs: Lightning's epoch resets keep it
    changes = 1 + sum(a != b for a, b in zip(live, live[1:]))
    assert len(logged) == changes < 60  # one self.log per new value, none for a repeated one


def test_the_halting_check_read_every_step_equals_a_fresh_search_at_that_step(monkeypatch):
    """After the first search, each step's ``steps_within`` is a lookup (no argument checks, no search): at every step,
    over a shrinking horizon and past the budget, it answers what a fresh accountant holding the same steps answers."""
    spec, sigma, target = _spec(0.05), 0.9, 2.0
    acc = Accountant("poisson_gaussian")
    acc.step(spec, sigma)
    planned = 60
    answers = [acc.steps_within(target, DELTA, spec, sigma, max_steps=planned - 1)]
    from lightning_dprel.accounting import accountant as module

    checks, real = [], module.check_noise_multiplier
    monkeypatch.setattr(module, "check_noise_multiplier", lambda s: checks.append(s) or real(s))
    for t in range(2, planned + 1):
        acc.step(spec, sigma)
        before = len(checks)
        answers.append(acc.steps_within(target, DELTA, spec, sigma, max_steps=planned - t + 1))
        fresh = Accountant("poisson_gaussian")
        fresh.step(spec, sigma, t)
        assert answers[-1] == fresh.steps_within(target, DELTA, spec, sigma, max_steps=planned - t + 1), t
        assert len(checks) == before + 2  # the fresh accountant's step and search: acc's lookup checked nothing
    assert answers[0] > 0 and answers[-1] == 0 and sorted(answers, reverse=True) == answers


def test_a_sampling_spec_hashes_once_and_a_pickle_hashes_anew_in_another_process(tmp_path):
    """Accountants hash the spec every step, so its hash is kept; a pickle (DDP spawn, a copy) carries none, since
    another process hashes strings differently."""
    import pickle

    spec = _spec()
    assert hash(spec) == hash(spec) and "_hash" in spec.__dict__
    assert "_hash" not in pickle.loads(pickle.dumps(spec)).__dict__
    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(spec))
    code = ("import pickle, sys; sys.path.insert(0, 'tests'); from test_accounting_off_the_hot_path import _spec; "
            f"s = pickle.loads(open({str(tmp_path / 'spec.pkl')!r}, 'rb').read()); "
            "print(s == _spec() and hash(s) == hash(_spec()) and len({s, _spec()}) == 1)")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        assert out == "True"
