"""Issue 15: the empirical privacy audit — lower-bound maths against hand cases, secret balanced coins, canary
graphs, the measured FREQ-CLIP shift, lower bound ≤ proven ε, and a mechanism that drops its noise is flagged."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from lightning_dprel.accounting.profiles import freq_corrected_profile
from lightning_dprel.audit.bounds import (
    clopper_pearson,
    one_run_audit,
    one_run_epsilon,
    one_run_p_value,
    two_run_audit,
)
from lightning_dprel.audit.canaries import canary_graph, secret_coins
from lightning_dprel.audit.cli import main as audit_main
from lightning_dprel.audit.runner import audit_setting
from lightning_dprel.audit.whitebox import WhiteBoxSetting, canary_scores
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream

# audit_setting(seed=...) reproduces an audit and warns once that its seed is public (the warning: the coins test below)
pytestmark = pytest.mark.filterwarnings("ignore:KeyedStream\\('audit', seed=\\d+\\). a public seed")


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# --- lower-bound maths --------------------------------------------------------------------------------------------
def test_one_run_p_value_matches_hand_computed_cases():
    q = 1.0 / (1.0 + math.exp(-1.0))
    # δ = 0: P[Bin(r, q) >= v]; all 10 guesses right -> q^10.
    assert one_run_p_value(100, 10, 10, 1.0, 0.0) == pytest.approx(q**10, rel=1e-12)
    # r = v = 2, δ > 0: β = q², α = max(P[Bin>=1] − β, (P[Bin>=0] − β)/2) = max(2q(1−q), (1−q²)/2).
    beta, alpha = q * q, max(2 * q * (1 - q), (1 - q * q) / 2)
    assert one_run_p_value(50, 2, 2, 1.0, 1e-3) == pytest.approx(beta + 2 * 50 * 1e-3 * alpha, rel=1e-12)
    assert one_run_p_value(10**6, 2, 2, 1.0, 0.5) == 1.0  # capped at 1
    assert one_run_p_value(10, 4, 0, 2.0, 0.0) == pytest.approx(1.0)


@pytest.mark.slow
def test_one_run_p_value_equals_the_papers_running_pmf_sum_form():
    # Steinke et al.'s Algorithm: α = max_i (Σ_{j=1..i} P[Bin = v − j]) / i, written here as a loop over pmf terms.
    rng = np.random.default_rng(0)
    for _ in range(40):
        m = int(rng.integers(10, 5000))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        eps, delta = float(rng.uniform(0, 6)), float(rng.choice([0.0, 1e-6, 1e-4]))
        q = math.exp(eps) / (1 + math.exp(eps))
        beta = sum(stats.binom.pmf(j, r, q) for j in range(v, r + 1))
        alpha, running = 0.0, 0.0
        for i in range(1, v + 1):
            running += stats.binom.pmf(v - i, r, q)
            alpha = max(alpha, running / i)
        expected = min(1.0, beta + alpha * delta * 2 * m)
        assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-7, abs=1e-12)


def test_one_run_epsilon_is_the_logit_of_the_binomial_tail_when_all_guesses_are_right():
    # q^10 = 0.05  ->  ε = logit(0.05^(1/10)) = 1.05187...
    assert one_run_epsilon(100, 10, 10, delta=0.0, significance=0.05) == pytest.approx(_logit(0.05**0.1), abs=1e-5)
    assert one_run_epsilon(100, 10, 10, delta=0.0, significance=0.05) == pytest.approx(1.051873, abs=1e-5)
    # half right is what a coin does: no bound.
    assert one_run_epsilon(100, 10, 5, delta=0.0, significance=0.05) == 0.0
    # δ only weakens the bound.
    assert one_run_epsilon(1000, 100, 95, delta=1e-4, significance=0.05) < one_run_epsilon(1000, 100, 95, delta=0.0, significance=0.05)


def test_one_run_audit_guesses_extremes_corrects_for_the_guess_counts_and_counts_ties_against_itself():
    coins = np.array([True, False] * 50)
    scores = coins.astype(float)  # perfect separation
    bound = one_run_audit(scores, coins, delta=0.0, confidence=0.95, guess_counts=(10, 20))
    assert (bound.guesses, bound.correct) == (20, 20)
    assert bound.epsilon == pytest.approx(_logit((0.05 / 2) ** (1 / 20)), abs=1e-5)  # Bonferroni over 2 counts
    ties = one_run_audit(np.zeros(100), coins, delta=0.0)
    assert ties.epsilon == 0.0 and ties.correct == 0  # all tied: every guess is counted wrong
    flipped = one_run_audit(-scores, coins, delta=0.0)
    assert flipped.epsilon == 0.0


def test_clopper_pearson_matches_scipys_exact_interval():
    for k, n in ((0, 20), (3, 20), (20, 20), (417, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        assert float(clopper_pearson(k, n, 0.05, "lower")) == pytest.approx(ci.low, abs=1e-9)
        assert float(clopper_pearson(k, n, 0.05, "upper")) == pytest.approx(ci.high, abs=1e-9)


def test_two_run_audit_on_perfectly_separated_scores_is_the_clopper_pearson_closed_form():
    n = 50
    bound = two_run_audit(np.ones(n), np.zeros(n), delta=0.0, confidence=0.95)
    a = (0.05 / (2 * (2 * n + 2))) ** (1 / n)  # CP lower for n/n is a, upper for 0/n is 1 − a
    assert bound.thresholds_tried == 3
    assert bound.epsilon == pytest.approx(math.log(a / (1 - a)), rel=1e-9)
    assert (bound.tpr, bound.fpr) == (1.0, 0.0)
    same = two_run_audit(np.arange(50.0), np.arange(50.0), delta=1e-5)
    assert same.epsilon == 0.0
    with_delta = two_run_audit(np.ones(n), np.zeros(n), delta=0.2, confidence=0.95)
    assert with_delta.epsilon == pytest.approx(math.log((a - 0.2) / (1 - a)), rel=1e-9)


def test_bounds_refuse_bad_input_with_messages():
    with pytest.raises(ValueError, match="one entry per canary"):
        one_run_audit([1.0, 2.0, 3.0], [True, False], delta=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        one_run_audit([1.0, float("nan")], [True, False], delta=0.0)
    with pytest.raises(ValueError, match="confidence"):
        one_run_audit([1.0, 2.0], [True, False], delta=0.0, confidence=1.0)
    with pytest.raises(ValueError, match="booleans"):
        one_run_audit([1.0, 2.0], [2, 0], delta=0.0)
    with pytest.raises(ValueError, match="guess_counts"):
        one_run_audit([1.0, 2.0], [True, False], delta=0.0, guess_counts=(5,))
    with pytest.raises(ValueError, match="at least one"):
        two_run_audit([], [1.0], delta=0.0)
    with pytest.raises(ValueError, match="delta"):
        two_run_audit([1.0], [0.0], delta=1.5)


# --- coins -------------------------------------------------------------------------------------------------------
def test_coins_are_balanced_independent_and_not_reproducible_from_torchs_seed():
    m = 40_000
    torch.manual_seed(0)
    a = secret_coins(m)
    torch.manual_seed(0)
    b = secret_coins(m)
    assert a.dtype == torch.bool and a.shape == (m,)
    assert not torch.equal(a, b)  # keyed from the OS, not from torch's seed
    for c in (a, b):
        assert abs(c.double().mean().item() - 0.5) < 4.5 * 0.5 / math.sqrt(m)  # fair (4.5 standard errors)
        x = c.double() * 2 - 1
        assert abs((x[1:] * x[:-1]).mean().item()) < 4.5 / math.sqrt(m)  # no lag-1 correlation
    agree = (a == b).double().mean().item()
    assert abs(agree - 0.5) < 4.5 * 0.5 / math.sqrt(m)  # two secret draws are independent of each other


def test_seeded_coins_reproduce_and_warn_and_foreign_generators_are_refused():
    with pytest.warns(UserWarning, match="privacy guarantee is void"):
        s1 = KeyedStream.seeded(3, "audit-coins")
    s2 = KeyedStream.seeded(3, "audit-coins", warn=False)
    assert torch.equal(secret_coins(100, stream=s1), secret_coins(100, stream=s2))
    with pytest.raises(TypeError, match="KeyedStream"):
        secret_coins(10, stream=torch.Generator())
    with pytest.raises(ValueError, match="int >= 1"):
        secret_coins(0)


# --- canary graphs and the mechanism -------------------------------------------------------------------------------
def test_an_excluded_canary_leaves_with_its_node_and_edges_and_nothing_else():
    g = canary_graph("freq_adversarial", 3, 2, extra_nodes=4)
    assert g.num_nodes == 3 + 6 + 6 + 4 and g.edges.shape == (12, 2)
    included = torch.tensor([True, False, True])
    edge_idx, nodes = g.world(included)
    kept = g.edges[edge_idx]
    assert not (kept == 1).any()  # canary 1's node is in no edge
    assert 1 not in nodes.tolist() and {0, 2} <= set(nodes.tolist()) and nodes.numel() == g.num_nodes - 1
    assert edge_idx.numel() == 12 - 2  # only canary 1's two own edges left; partner edges stay
    with pytest.raises(ValueError, match="design"):
        canary_graph("loud", 3, 2)
    with pytest.raises(ValueError, match="num_canaries"):
        canary_graph("dirac", 1, 2)
    with pytest.raises(ValueError, match="magnitude"):
        WhiteBoxSetting("x", magnitude=0.5)


@pytest.mark.parametrize("design,clipping,expected", [
    ("freq_adversarial", "freq", 0.5 + 10 / 4),  # the corrected profile Δ_freq(K, 0), not Eq. 3's C
    ("dirac", "freq", 0.5),
    ("freq_adversarial", "standard", 10.0),  # Δ_std(K, 0) = K·C
])
def test_the_noiseless_shift_of_a_canary_is_the_sensitivity_the_accounting_uses(design, clipping, expected):
    g = canary_graph(design, 6, 10)
    setting = WhiteBoxSetting("s", clipping=clipping, noise_multiplier=0.0, steps=3)
    streams = {"sampling": KeyedStream.seeded(0, "s", warn=False)}
    ins = canary_scores(g, torch.ones(6, dtype=torch.bool), setting, **streams)
    outs = canary_scores(g, torch.zeros(6, dtype=torch.bool), setting, sampling=KeyedStream.seeded(0, "s", warn=False))
    per_step = (ins - outs) / 3
    assert torch.allclose(per_step, torch.full((6,), expected, dtype=torch.float64), atol=1e-9)
    if design == "freq_adversarial" and clipping == "freq":
        assert per_step[0].item() == pytest.approx(float(freq_corrected_profile(10, 0)[10, 0]))
        assert per_step[0].item() > 1.0  # Proposition 4.1's Δ ≤ C fails, measured through the real step


def test_private_settings_are_audited_below_their_proven_epsilon_and_non_private_training_above_2():
    g = canary_graph("freq_adversarial", 1500, 10)
    for setting in (
        WhiteBoxSetting("freq", clipping="freq", noise_multiplier=4.0, steps=4),
        WhiteBoxSetting("standard", clipping="standard", noise_multiplier=12.0, steps=4),
    ):
        rec = audit_setting(g, setting, delta=1e-5, seed=11)
        assert 0.0 < rec.epsilon_lower <= rec.epsilon_proven and not rec.violation and not rec.no_noise
    none = audit_setting(g, WhiteBoxSetting("none", clipping="none", noise_multiplier=0.0), delta=1e-5, seed=11)
    assert none.no_noise and none.epsilon_proven == math.inf
    assert none.one_run.epsilon >= 2.0 and none.two_run.epsilon >= 2.0


def test_a_mechanism_that_drops_its_noise_is_flagged(monkeypatch):
    g = canary_graph("dirac", 600, 5)
    setting = WhiteBoxSetting("broken", clipping="freq", noise_multiplier=4.0, steps=4)
    honest = audit_setting(g, setting, delta=1e-5, seed=5)
    assert not honest.violation
    monkeypatch.setattr(DPOptimizer, "draw_noise", lambda self, device=None: None)  # the bug: noise never added
    broken = audit_setting(g, setting, delta=1e-5, seed=5)
    assert broken.epsilon_proven == honest.epsilon_proven  # the accountant still claims σ = 4
    assert broken.violation and broken.epsilon_lower > broken.epsilon_proven


def test_audit_command_prints_the_table_writes_json_and_exits_3_on_a_violation(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "audit.yaml"
    out = tmp_path / "audit.json"
    cfg.write_text(
        "design: freq_adversarial\nnum_canaries: 800\ndegree: 10\ndelta: 1.0e-5\nseed: 2\n"
        f"output: {out}\nsettings:\n"
        "  - {name: corrected, clipping: freq, accounting: corrected, noise_multiplier: 20.0, steps: 2}\n"
        "  - {name: paper, clipping: freq, accounting: paper, noise_multiplier: 20.0, steps: 2}\n"
        "  - {name: non-private, clipping: none, noise_multiplier: 0.0}\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert audit_main(["--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert "one-run lb" in text and "NO NOISE" in text and "JSON record" in text
    record = json.loads(out.read_text())
    audits = {a["setting"]["name"]: a for a in record["audits"]}
    assert audits["paper"]["epsilon_claimed"] < audits["paper"]["epsilon_proven"] == audits["corrected"]["epsilon_proven"]
    assert audits["non-private"]["epsilon_proven"] == "inf" and audits["non-private"]["no_noise"] is True
    assert all(not a["violation"] for a in record["audits"])
    monkeypatch.setattr(DPOptimizer, "draw_noise", lambda self, device=None: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert audit_main(["--config", str(cfg)]) == 3
    assert "VIOLATION" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("settings: []\n")
    with pytest.raises(SystemExit, match="non-empty list"):
        audit_main(["--config", str(bad)])


@pytest.mark.slow
def test_adversarial_canaries_refute_the_papers_eq3_epsilon_and_dirac_canaries_do_not():
    setting = WhiteBoxSetting("freq", clipping="freq", accounting="paper", noise_multiplier=4.0, steps=4)
    adversarial = audit_setting(canary_graph("freq_adversarial", 20_000, 10), setting, delta=1e-5, seed=21)
    assert adversarial.epsilon_claimed == adversarial.epsilon_paper_eq3 < adversarial.epsilon_proven
    assert adversarial.claim_refuted and adversarial.exceeds_paper  # Eq. 3 (Δ ≡ C) is broken empirically, at 95 %
    assert adversarial.two_run.epsilon > 1.2 * adversarial.epsilon_paper_eq3
    assert not adversarial.violation  # the corrected accounting holds
    control = WhiteBoxSetting("freq", clipping="freq", accounting="paper", noise_multiplier=3.0, steps=4)
    dirac = audit_setting(canary_graph("dirac", 20_000, 10), control, delta=1e-5, seed=21)
    assert not dirac.exceeds_paper and not dirac.violation


def test_every_shipped_audit_config_builds_its_settings():
    from pathlib import Path

    import yaml

    from lightning_dprel.audit.cli import _load

    configs = sorted((Path(__file__).parent.parent / "configs").glob("audit*.yaml"))
    assert configs
    for path in configs:
        cfg = _load(str(path))
        assert cfg["seed"] is None  # shipped audits draw coins, batches and noise from the OS
        assert [WhiteBoxSetting(**raw) for raw in cfg["settings"]]
        assert yaml.safe_load(path.read_text()) == cfg


def test_the_bounds_exceed_the_true_epsilon_of_a_known_mechanism_rarely():
    """Coverage by simulation: randomized response is exactly ε-DP; a 95 % lower bound may exceed ε in ≤ ~5 % of runs."""
    rng = np.random.default_rng(7)
    eps, m, trials = 1.0, 400, 150
    keep = math.exp(eps) / (1 + math.exp(eps))
    over_one = over_two = 0
    for _ in range(trials):
        coins = rng.random(m) < 0.5
        released = np.where(rng.random(m) < keep, coins, ~coins)  # each canary's bit, flipped w.p. 1/(1+e^ε)
        scores = released + 0.1 * rng.random(m)  # independent tie-break: post-processing
        over_one += one_run_audit(scores, coins, delta=0.0, confidence=0.95).epsilon > eps
        ins = (rng.random(m) < keep).astype(float)  # two runs: all in, all out (binary scores: ties)
        outs = (rng.random(m) >= keep).astype(float)
        over_two += two_run_audit(ins, outs, delta=0.0, confidence=0.95).epsilon > eps
    assert over_one <= 0.08 * trials and over_two <= 0.08 * trials
    # and the bounds are not vacuous: at ε = 1 and m = 400 they usually certify something
    coins = rng.random(m) < 0.5
    released = np.where(rng.random(m) < keep, coins, ~coins)
    assert one_run_audit(released + 0.1 * rng.random(m), coins, delta=0.0).epsilon > 0.0


def test_settings_and_configs_that_would_mislabel_a_run_are_refused_before_any_training(tmp_path):
    with pytest.raises(ValueError, match="noise_multiplier=0"):
        WhiteBoxSetting("x", clipping="none", noise_multiplier=4.0)  # would print σ = 4 next to a noiseless run
    with pytest.raises(ValueError, match="clipping='freq'"):
        WhiteBoxSetting("x", clipping="standard", accounting="paper")
    with pytest.raises(ValueError, match="noise_multiplier"):
        WhiteBoxSetting("x", noise_multiplier=-1.0)
    cfg = tmp_path / "a.yaml"
    for body, match in (
        ("settings:\n  - {name: a, noise_multiplier: 4.0}\n  - {name: b, steps: 0}\n", "bad setting"),
        ("seed: -3\nsettings:\n  - {name: a}\n", "seed"),
        ("confidence: 1.5\nsettings:\n  - {name: a}\n", "confidence"),
        ("settings:\n  - {name: a}\nfoo: 1\n", "unknown keys"),
    ):
        cfg.write_text(body)
        with pytest.raises(SystemExit, match=match):
            audit_main(["--config", str(cfg)])
