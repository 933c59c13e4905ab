"""Guards found by an adversarial privacy review: non-finite tuples dropped, not spread; tiny σ refused; δ ≥ 1/n warned."""

from __future__ import annotations

import pytest
import torch

from lightning_dprel.core.clipping import apply_factors, standard_clip_factors
from lightning_dprel.methods.relational.clipping import freq_clip_factors
from lightning_dprel.grad_sample.sums import weighted_sum
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream


def _bad_grads() -> dict[str, torch.Tensor]:
    # Tuple 0 is finite (norm 5), tuple 1 holds a NaN, tuple 2 an inf, tuple 3 overflows the squared norm.
    w = torch.tensor([[3.0, 4.0], [float("nan"), 0.0], [float("inf"), 1.0], [3e38, 3e38]])
    b = torch.tensor([[0.0], [1.0], [2.0], [0.0]])
    return {"w": w, "b": b}


@pytest.mark.parametrize("clipping", ["freq", "standard"])
def test_a_non_finite_tuple_is_dropped_not_spread_over_the_noised_sum(clipping):
    # Before the fix one NaN/inf tuple made every coordinate of the update NaN: a data-dependent event of
    # unbounded sensitivity. Now such a tuple contributes 0 (within every clip threshold).
    grads = _bad_grads()
    max_freq = torch.tensor([1, 1, 2, 1])
    if clipping == "freq":
        factors = freq_clip_factors(grads, max_freq, clip_norm=1.0)
        expected0 = 0.5 / 5.0  # threshold C / (2 * max_freq) = 0.5, norm 5
    else:
        factors = standard_clip_factors(grads, clip_norm=1.0)
        expected0 = 1.0 / 5.0
    assert factors.tolist()[1:] == [0.0, 0.0, 0.0]
    assert factors[0].item() == pytest.approx(expected0)
    summed = weighted_sum(grads, factors)
    assert torch.allclose(summed["w"], expected0 * torch.tensor([3.0, 4.0]))
    assert torch.equal(summed["b"], torch.zeros(1))
    clipped = apply_factors(grads, factors)
    assert torch.isfinite(clipped["w"]).all() and torch.equal(clipped["w"][1:], torch.zeros(3, 2))

    params = {"w": torch.nn.Parameter(torch.zeros(2)), "b": torch.nn.Parameter(torch.zeros(1))}
    noise = KeyedStream.seeded(3, "noise", warn=False)
    dp = DPOptimizer(
        torch.optim.SGD(params.values(), lr=1.0), named_params=params, noise_multiplier=1.0, clip_norm=1.0,
        clipping=clipping, noise=noise,
    )
    dp.record(grads, max_freq=max_freq, expected_batch_size=2.0)
    with pytest.warns(UserWarning, match=r"3 of 4 tuples in this step had non-finite gradients and were dropped"):
        dp.step()
    draws = KeyedStream.seeded(3, "noise", warn=False).normal(3, 1.0)
    assert torch.allclose(params["w"].detach(), -(expected0 * torch.tensor([3.0, 4.0]) + draws[:2]) / 2.0)
    assert torch.allclose(params["b"].detach(), -draws[2:] / 2.0)


def test_finite_tuples_are_clipped_exactly_as_before():
    grads = {"w": torch.tensor([[0.3, 0.4], [6.0, 8.0]])}
    factors = standard_clip_factors(grads, clip_norm=1.0)
    assert factors.tolist() == pytest.approx([1.0, 0.1])
    assert torch.allclose(weighted_sum(grads, factors)["w"], torch.tensor([0.9, 1.2]))


def test_accounting_cli_names_the_mechanism_behind_a_calibrated_sigma(capsys):
    # Before the fix the `noise-multiplier` text line gave σ and ε with no accounting label, so a σ from the
    # paper's Eq. 3 (which under-states ε) read the same as one from the corrected accounting.
    from lightning_dprel.accounting.cli import main

    base = ["--nodes", "1000", "--edges", "2000", "--max-degree", "5", "--sampling-rate", "0.01",
            "--neg-per-pos", "4", "--steps", "50", "--target-epsilon", "8", "--clipping", "freq"]
    assert main(["noise-multiplier", *base, "--accounting", "paper"]) == 0
    line = capsys.readouterr().out
    assert "freq_paper" in line and "Proposition 4.1 does not hold" in line
    assert main(["noise-multiplier", *base]) == 0
    assert "freq_corrected" in capsys.readouterr().out


def test_accountant_refuses_tiny_noise_multiplier_quickly() -> None:
    """σ far below the tested range used to run for minutes; now it is refused, naming the parameter."""
    from lightning_dprel.accounting import per_step_rdp
    from lightning_dprel.core.specs import SamplingSpec

    spec = SamplingSpec(num_nodes=1000, num_edges=2000, max_degree=3, sampling_rate=0.01, neg_per_pos=2,
                        expected_batch_size=20.0, steps_per_epoch=100)
    with pytest.raises(ValueError, match=r"`noise_multiplier` must be >= 0.1, got 0.01"):
        per_step_rdp("freq_corrected", spec, 0.01)
    assert per_step_rdp("freq_corrected", spec, 0.1).shape[0] > 100


def test_callback_default_delta_stays_below_one_over_n_and_an_explicit_one_above_is_refused() -> None:
    """δ = 1/m (the paper's default) can exceed 1/n for an entity-level unit: the default is then 1/(10·n), quietly,
    and the same δ given explicitly is refused unless allowed (with a warning)."""
    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.core.specs import SamplingSpec

    few_edges = SamplingSpec(num_nodes=1000, num_edges=500, max_degree=3, sampling_rate=0.02, neg_per_pos=2,
                             expected_batch_size=10.0, steps_per_epoch=50)
    many_edges = SamplingSpec(num_nodes=100, num_edges=500, max_degree=5, sampling_rate=0.02, neg_per_pos=2,
                              expected_batch_size=10.0, steps_per_epoch=50)
    import warnings

    for spec, default in ((few_edges, 1e-4), (many_edges, 1 / 500)):
        quiet = PrivacyCallback(target_epsilon=4.0)
        quiet.mechanism = "freq_corrected"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet._resolve_delta(spec)
        assert quiet.delta == pytest.approx(default)
    with pytest.raises(ValueError, match=r"δ = 0.002 is not below 1/n = 0.001"):
        PrivacyCallback(target_epsilon=4.0, delta=0.002)._resolve_delta(few_edges)
    allowed = PrivacyCallback(target_epsilon=4.0, delta=0.002, allow_large_delta=True)
    with pytest.warns(UserWarning, match=r"δ = 0.002 is not below 1/n = 0.001"):
        allowed._resolve_delta(few_edges)
