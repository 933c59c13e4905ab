"""Public negatives (Theorem C.1, no negative-slot term): removal moves the real step by ≤ C·i.

A public node set (ids, texts) removes Theorem C.1's j term, so the mechanism is the mixture
Σ_i Bin(K, γ)(i) N(i, σ²) vs N(0, σ²): its σ and ε match dp-accounting's mixture PLD at the
relational job's sampling (configs/relational.yaml: σ at ε = 10 falls from 7.13 to 5.09). Refused
where the node set is not declared public, and for FREQ-CLIP.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import binom

from lightning_dprel.accounting.calibration import epsilon_for, noise_multiplier_for
from lightning_dprel.accounting.registry import check_module_mechanism, check_unit, get_mechanism
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.datasets.generators import random_feature_graph
from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.public_vocabulary import PublicVocabularyDataModule
from lightning_dprel.datamodules.edge_tuples.spec import EdgeTuples
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder
from lightning_dprel.methods.relational import DPRelationalModule

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: configs/relational.yaml's private graph: HPO Phenotypic abnormality minus the cardiovascular and
#: nervous-system subtrees, n terms, m relations after capping to K = 5 (setup: "11,575 remain").
N, M, K, B, STEPS, DELTA = 14_228, 11_575, 5, 1024, 500, 1e-5


def _job(unit: str) -> SamplingSpec:
    return SamplingSpec(
        population=M,
        sampling_rate=B / M,
        expected_batch_size=float(B),
        steps_per_epoch=12,
        contribution_bound=K,
        privacy_unit=unit,
        detail=EdgeTuples(num_nodes=N, neg_per_pos=1),
    )


def _dp_accounting_epsilon(
    sigma: float,
    interval: float = 1e-4,
    *,
    bound: int = K,
    rate: float = B / M,
    steps: int = STEPS,
    delta: float = DELTA,
) -> float:
    """dp-accounting's PLD of Σ_i Bin(K, γ)(i) N(i, σ²) vs N(0, σ²), composed ``steps`` times."""
    from dp_accounting import dp_event
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    weights = binom.pmf(np.arange(bound + 1), bound, rate)
    acc = PLDAccountant(value_discretization_interval=interval)
    acc.compose(
        dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(bound + 1)), list(weights)), steps
    )
    return float(acc.get_epsilon(delta))


def test_sigma_at_epsilon_10_falls_from_theorem_c1_to_the_mixture():
    standard = noise_multiplier_for(
        10.0, delta=DELTA, steps=STEPS, sampling=_job("entity"), mechanism="standard"
    )
    public = noise_multiplier_for(
        10.0,
        delta=DELTA,
        steps=STEPS,
        sampling=_job("node_public_ids"),
        mechanism="public_negatives",
    )
    assert standard == pytest.approx(7.135, abs=0.01)  # docs/relational.md's run: σ = 7.135
    assert public == pytest.approx(5.09, abs=0.01)


@pytest.mark.parametrize("target", [4.0, 10.0])
def test_sigma_and_epsilon_match_dp_accounting_mixture_pld(target):
    """σ within 1 % of dp-accounting's (its ε ≤ target at σ, > target at 0.99·σ); ε within 2·10⁻³.

    Our 10⁻³ grid rounds pessimistically, so our ε is never below its 10⁻⁴ grid's.
    """
    spec = _job("node_public_ids")
    sigma = noise_multiplier_for(
        target, delta=DELTA, steps=STEPS, sampling=spec, mechanism="public_negatives"
    )
    reference = _dp_accounting_epsilon(sigma)
    ours, bound = epsilon_for(
        delta=DELTA,
        steps=STEPS,
        sampling=spec,
        noise_multiplier=sigma,
        mechanism="public_negatives",
    )
    assert bound == "pld"
    assert reference <= ours <= reference + 2e-3
    assert ours <= target
    assert _dp_accounting_epsilon(0.99 * sigma, interval=1e-3) > target


def test_the_mechanism_is_proven_for_public_ids_only_and_for_standard_clipping_only():
    mech = get_mechanism("public_negatives")
    assert (
        mech.unit.name == "node_public_ids"
        and mech.clipping == ("standard",)
        and mech.pld is not None
    )
    assert check_unit("public_negatives", "node_public_ids") is mech
    with pytest.raises(
        ValueError,
        match=r"(?s)'public_negatives' is proven for the unit 'node_public_ids'.*'entity'",
    ):
        check_unit("public_negatives", "entity")
    with pytest.raises(
        ValueError, match=r"(?s)'standard' is proven for the unit 'entity'.*'node_public_ids'"
    ):
        check_unit("standard", "node_public_ids")
    with pytest.raises(ValueError, match=r"'public_negatives' does not bound clipping='freq'"):
        check_module_mechanism("public_negatives", "freq")


def _data_kwargs() -> dict:
    return dict(expected_batch_size=6, neg_per_pos=2, max_degree=3, sampling_seed=1)


def _module(accounting: str | None = "public_negatives", **kwargs) -> DPRelationalModule:
    return DPRelationalModule(
        MLPEncoder(16, hidden_dim=8, out_dim=8),
        clipping="standard",
        accounting=accounting,
        noise_seed=0,
        **kwargs,
    )


def test_public_negatives_on_a_private_node_set_are_refused_before_the_first_step():
    dm = RelationalDataModule(random_feature_graph(300, 900, dim=16, seed=0), **_data_kwargs())
    module = _module(noise_multiplier=1.0)
    with pytest.raises(
        ValueError,
        match=r"(?s)Privacy unit mismatch.*'public_negatives'.*'node_public_ids'.*'entity'",
    ):
        quiet_trainer([PrivacyCallback()], max_steps=3).fit(module, datamodule=dm)
    assert module.privacy_ledger.steps == 0


def test_a_public_node_set_refuses_the_entity_mechanisms():
    dm = PublicVocabularyDataModule(
        random_feature_graph(300, 900, dim=16, seed=0), **_data_kwargs()
    )
    module = _module(accounting=None, noise_multiplier=1.0)
    with pytest.raises(
        ValueError, match=r"(?s)Privacy unit mismatch.*'standard'.*'entity'.*'node_public_ids'"
    ):
        quiet_trainer([PrivacyCallback()], max_steps=3).fit(module, datamodule=dm)
    assert module.privacy_ledger.steps == 0


@pytest.mark.slow
def test_a_fit_with_public_negatives_is_charged_to_its_mechanism_at_less_noise():
    dm = PublicVocabularyDataModule(
        random_feature_graph(300, 900, dim=16, seed=0), **_data_kwargs()
    )
    callback = PrivacyCallback(target_epsilon=4.0, delta=1e-4, calibrate=True)
    module = _module()
    quiet_trainer([callback], max_steps=3).fit(module, datamodule=dm)
    spec = dm.sampling_spec
    assert spec.privacy_unit == "node_public_ids" and module.privacy_ledger.steps == 3
    assert module.noise_spec.mechanism == "public_negatives" and callback.epsilon <= 4.0
    standard = noise_multiplier_for(
        4.0,
        delta=1e-4,
        steps=3,
        sampling=replace(spec, privacy_unit="entity"),
        mechanism="standard",
    )
    assert module.noise_spec.noise_multiplier < standard


def _released_sum(module: DPRelationalModule, batch) -> torch.Tensor:
    """The clipped sum Σ_i f_i g_i the real DP optimizer step applies (σ = 0, SGD, b = 1), ÷ lr."""
    dp = module.build_dp_optimizer(dict(module.encoder.named_parameters()))
    result = module.per_tuple(batch)
    dp.record(result.grads, max_freq=batch.max_freq, expected_batch_size=1.0)
    before = {n: p.detach().clone() for n, p in module.encoder.named_parameters()}
    dp.step()
    delta = torch.cat(
        [(before[n] - p.detach()).flatten() for n, p in module.encoder.named_parameters()]
    )
    with torch.no_grad():
        for n, p in module.encoder.named_parameters():
            p.copy_(before[n])
    return delta.double() / module.hparams.lr


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_removing_a_node_moves_the_released_sum_by_at_most_c_times_its_tuples(mode):
    """Every node of a real batch, tiny C: removing u's relations moves the sum by ≤ C·i.

    It is C at i = 1: every tuple is clipped (lr = 1/C keeps the float32 update at unit scale).
    The other tuples keep their negatives, u's public features included, so a node that only fills
    negative slots moves nothing; were the node set private, filling its slots with another node
    would move the sum (the 2j term of Theorem C.1).
    """
    torch.manual_seed(0)
    dm = PublicVocabularyDataModule(
        random_feature_graph(120, 400, dim=16, seed=3),
        expected_batch_size=16,
        neg_per_pos=2,
        max_degree=4,
        sampling_seed=5,
    )
    dm.setup("fit")
    pos, neg, anchor = dm.draw_global(0)
    assert pos.shape[0] > 8
    clip = 1e-4
    module = _module(
        clip_norm=clip,
        noise_multiplier=0.0,
        optimizer="sgd",
        lr=1 / clip,
        per_tuple_mode=mode,
        allow_untracked=True,
    )
    full = _released_sum(module, dm.make_batch(pos, neg, anchor, step=0))
    ratios, slot_only, replaced = {}, [], []
    fresh = next(v for v in range(120) if not (pos == v).any() and not (neg == v).any())
    for u in torch.unique(torch.cat([pos.flatten(), neg.flatten()])).tolist():
        keep = ~(pos == u).any(1)
        i = int((~keep).sum())
        moved = float(
            (
                full
                - _released_sum(module, dm.make_batch(pos[keep], neg[keep], anchor[keep], step=0))
            ).norm()
        )
        if i:
            ratios[u] = (i, moved / (clip * i))
            continue
        slot_only.append(moved)
        swapped = torch.where(neg == u, torch.full_like(neg, fresh), neg)
        replaced.append(
            float(
                (full - _released_sum(module, dm.make_batch(pos, swapped, anchor, step=0))).norm()
            )
        )
    assert ratios and max(r for _, r in ratios.values()) <= 1 + 1e-5
    ones = [r for i, r in ratios.values() if i == 1]
    assert len(ones) >= 5 and min(ones) == pytest.approx(1.0, rel=1e-4)  # Δ = C·i is attained
    assert slot_only and max(slot_only) == 0.0
    assert max(replaced) > 0.5 * clip  # the negative-slot term a private node set would pay
