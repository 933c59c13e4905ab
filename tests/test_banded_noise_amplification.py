"""Banded correlated noise (banded MF-DP-FTRL) under cyclic Poisson sampling, amplified (Choquette-Choo et al. 2023, §4).

What is specified: the noise is w = C⁻¹(‖c‖z) with one keyed draw per step; removing one example moves the
decorrelated releases only at its participating steps (b apart), by ≤ C each, i.e. ≤ ‖c‖·C per participation in the
C-domain; ε is DP-SGD at rate p composed ⌈T/b⌉ times (checked against dp-accounting's PLD and RDP on that event), and
b = 1 is today's DP-SGD exactly; every sampler, setting and resume it is not proven for is refused before step 1.
"""

from __future__ import annotations

import math
import warnings

import dp_accounting
import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback
from lightning_dprel.accounting import Accountant
from lightning_dprel.accounting.mechanisms import check_fit_sampling
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.correlated_noise import BandedNoise, optimal_coefficients, prefix_sum_error
from lightning_dprel.core.optim import DPOptimizer
from lightning_dprel.core.randomness import KeyedStream
from lightning_dprel.core.specs import EXAMPLE, SamplingSpec
from lightning_dprel.datamodules.poisson import PoissonSampledBatches

DELTA = 1e-5


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*(KeyedStream|DPDataLoader)\\(.*seed.*")
        warnings.filterwarnings("ignore", message=".*seeded.*")
        yield


class _Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.lin(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n=120):
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x[:, 0] > 0).long())


def _fit(loader, model=None, **callback):
    cb = PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=1.0, **callback)
    trainer = pl.Trainer(callbacks=[cb], max_steps=7, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    model = model or _Linear()
    trainer.fit(model, loader)
    return cb, model, trainer


def _cyclic(n, b, p):
    return SamplingSpec(population=math.ceil(n / b), sampling_rate=p, expected_batch_size=p * math.ceil(n / b),
                        steps_per_epoch=b, privacy_unit=EXAMPLE, num_units=n,
                        detail=_detail(b))


def _detail(b):
    from lightning_dprel.accounting.mechanisms.banded import CyclicPoisson

    return CyclicPoisson(b)


def _reference(p, sigma, k):
    """dp-accounting on the reduced event: Poisson(p) Gaussian(σ) self-composed k times (PLD and RDP)."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), k)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)
    rdp = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)
    return pld, rdp


# --------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("bands,steps", [(3, 10), (4, 12), (2, 7)])
def test_epsilon_is_dp_sgd_at_rate_p_composed_ceil_t_over_b_times(bands, steps):
    p, sigma = 0.2, 1.1
    acc = Accountant("banded_poisson_gaussian")
    acc.step(_cyclic(300, bands, p), sigma, steps)
    bounds = acc.epsilon_bounds(DELTA)
    pld, rdp = _reference(p, sigma, math.ceil(steps / bands))
    assert bounds["pld"] == pytest.approx(pld, rel=0.02)
    assert bounds["rdp"] == pytest.approx(rdp, rel=0.03)
    more = Accountant("banded_poisson_gaussian")  # one more step of a full cycle's last partition costs nothing more
    more.step(_cyclic(300, bands, p), sigma, math.ceil(steps / bands) * bands)
    assert more.get_epsilon(DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


def test_one_band_is_todays_dp_sgd_exactly():
    p, sigma, steps = 0.1, 0.9, 25
    plain = SamplingSpec(population=300, sampling_rate=p, expected_batch_size=30.0, steps_per_epoch=10,
                         privacy_unit=EXAMPLE, num_units=300)
    dpsgd, banded = Accountant("poisson_gaussian"), Accountant("banded_poisson_gaussian")
    dpsgd.step(plain, sigma, steps)
    banded.step(_cyclic(300, 1, p), sigma, steps)
    assert banded.epsilon_bounds(DELTA) == dpsgd.epsilon_bounds(DELTA)
    z = torch.randn(10)
    assert torch.equal(BandedNoise(1).correlate(z, 1.0, BandedNoise.mechanism), z)


def test_a_fit_is_charged_the_reduced_event_and_stops_on_its_budget():
    loader = DPDataLoader(_data(), batch_size=12, seed=0, partitions=3)
    cb, _, trainer = _fit(loader, noise="banded", bands=3)
    assert cb.mechanism == "banded_poisson_gaussian" and cb.steps == trainer.global_step == 7
    spec = loader.sampling_spec
    assert spec.sampling_rate == pytest.approx(12 / 40) and spec.detail.partitions == 3
    pld, rdp = _reference(spec.sampling_rate, 1.0, math.ceil(7 / 3))
    assert cb.epsilon == pytest.approx(min(pld, rdp), rel=0.02)
    saved = PrivacyLedger()  # the ledger's saved form keeps the cyclic sampling (checkpoints, privacy.json)
    saved.load_state_dict(cb.ledger.state_dict())
    assert saved.segments[0].sampling == spec and saved.epsilon(DELTA) == cb.ledger.epsilon(DELTA)


def test_the_optimal_coefficients_lower_the_prefix_sum_error_and_one_band_is_the_identity():
    for bands in (2, 3):
        c = optimal_coefficients(64, bands)
        assert c[0] == 1.0 and prefix_sum_error(c, 64) < prefix_sum_error((1.0,) + (0.0,) * (bands - 1), 64)
    # C = I: ‖A‖²_F = T(T+1)/2
    assert prefix_sum_error((1.0,), 10) == pytest.approx(55.0)


# --------------------------------------------------------------------------- the released sums
def _release_run(rows, grads, bands, coeffs, steps=9, clip=1.0):
    """Run the real DP step on the cyclic samples of ``rows``; returns (pre-scaling releases [T, d], raw draws z)."""
    lin = nn.Linear(grads.shape[1], 1, bias=False)
    dp = DPOptimizer(torch.optim.SGD(lin.parameters(), lr=0.0), named_params={"w": lin.weight}, noise_multiplier=0.5,
                     clip_norm=clip, clipping="standard", noise=KeyedStream.seeded(7, "noise", warn=False))
    dp.set_correlated_noise(BandedNoise(bands, coeffs))
    draws, released = [], []
    normal = dp.noise.normal
    dp.noise.normal = lambda *a, **k: draws.append(normal(*a, **k)) or draws[-1]
    scale = dp.scale
    dp.scale = lambda noised, b: released.append(noised["w"].reshape(-1).clone()) or scale(noised, b)
    sampler = PoissonSampledBatches(TensorDataset(torch.arange(grads.shape[0])), 2.0, None,
                                    KeyedStream.seeded(3, "rows", warn=False), partitions=bands)
    sampled = []
    for t in range(steps):
        idx = [int(i) for i in sampler.indices(t) if int(i) in rows]
        sampled.append(idx)
        dp.record({"w": grads[idx].reshape(len(idx), 1, -1)}, max_freq=None, expected_batch_size=2.0)
        dp.step()
    return torch.stack(released), torch.stack(draws), sampled


def test_removing_one_example_moves_the_decorrelated_releases_only_at_its_steps_by_at_most_c():
    n, d, bands, coeffs, clip = 12, 5, 3, (1.0, 0.4, -0.2), 1.0
    grads = 3.0 * torch.randn(n, d, generator=torch.Generator().manual_seed(1))  # every row is clipped
    unit = 4
    full, z, sampled = _release_run(set(range(n)), grads, bands, coeffs)
    without, z2, _ = _release_run(set(range(n)) - {unit}, grads, bands, coeffs)
    assert torch.equal(z, z2)  # the same seeded stream: the known noise
    T = full.shape[0]
    C = sum(torch.diag(torch.full((T - j,), c), -j) for j, c in enumerate(coeffs)).double()
    norm = math.sqrt(sum(c * c for c in coeffs))
    # the noise is w = C⁻¹(‖c‖z): C·(release − signal) = ‖c‖z, i.e. C·release = C·signal + ‖c‖z
    signal = torch.stack([grads[i].double().mul(min(1.0, clip / grads[i].norm().item())) for i in range(n)])
    sums = torch.stack([signal[idx].sum(0) if idx else torch.zeros(d, dtype=torch.float64) for idx in sampled])
    assert torch.allclose(C @ (full.double() - sums), norm * z.double(), atol=1e-4)
    # removing the unit: the difference of the decorrelated releases C·R is C·δ, δ the unit's clipped gradient at its steps
    delta = full.double() - without.double()  # noise cancels (same draws)
    steps = [t for t in range(T) if unit in sampled[t]]
    assert steps and all(t % bands == unit % bands for t in steps)  # only in its partition's steps, b apart
    others = [t for t in range(T) if t not in steps]
    assert torch.allclose(delta[others], torch.zeros_like(delta[others]), atol=1e-5)
    assert all(delta[t].norm() <= clip * (1 + 1e-5) for t in steps)
    in_c = C @ delta  # each participation moves rows s … s+b−1 of C·R by ‖c‖·|δ_s| ≤ ‖c‖·C; blocks do not overlap
    for s in steps:
        block = in_c[s:s + bands]
        assert block.norm() <= norm * clip * (1 + 1e-5)
        if s + bands <= T:  # a whole block: exactly ‖c‖ times the unit's clipped gradient
            assert float(block.norm()) == pytest.approx(norm * delta[s].norm().item(), rel=1e-5)
    assert float(in_c.norm() ** 2) == pytest.approx(sum(float(in_c[s:s + bands].norm() ** 2) for s in steps), rel=1e-6)


# --------------------------------------------------------------------------- refusals
def test_plain_poisson_shuffling_and_fixed_batches_are_refused_before_step_one():
    model = _Linear()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"DPDataLoader without partitions.*partitions=2"):
        _fit(DPDataLoader(_data(), batch_size=12, seed=0), model, noise="banded", bands=2)
    with pytest.raises(ValueError, match=r"RandomSampler \(shuffling\).*partitions=2"):
        _fit(DataLoader(_data(), batch_size=12, shuffle=True), model, noise="banded", bands=2)
    with pytest.raises(ValueError, match=r"SequentialSampler \(fixed batches\).*partitions=2"):
        _fit(DataLoader(_data(), batch_size=12), model, noise="banded", bands=2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_coupled_relational_sampling_is_refused_naming_what_to_use():
    from lightning_dprel.accounting.mechanisms.banded import check_cyclic_sampling
    from lightning_dprel.demos.boring_classes import BoringPrivateModule, quiet_trainer, tiny_relational_dm

    model = BoringPrivateModule(clipping="freq")
    with pytest.raises(ValueError, match=r"comes from RelationalDataModule.*DPDataLoader\(dataset, batch_size=B, partitions=2\)"):
        quiet_trainer([PrivacyCallback(noise="banded", bands=2)], max_steps=2).fit(model, datamodule=tiny_relational_dm())
    assert model.optimizer_steps == 0
    spec = tiny_relational_dm().sampling_spec  # an entity appears as a negative in any step: not b-min-sep
    with pytest.raises(ValueError, match=r"EdgeTuples sampling.*partitions"):
        check_cyclic_sampling(spec, 2)
    with pytest.raises(ValueError, match="unit"):
        check_fit_sampling("banded_poisson_gaussian", spec)


def test_a_module_that_owns_its_dp_optimizer_runs_banded_through_the_callback():
    from lightning_dprel.demos.boring_classes import BoringPrivateModule, quiet_trainer

    model = BoringPrivateModule(clipping="standard")
    loader = DPDataLoader(TensorDataset(torch.randn(60, 1)), batch_size=6, seed=0, partitions=2)
    cb = PrivacyCallback(delta=DELTA, noise="banded", bands=2, coefficients=(1.0, 0.25))
    quiet_trainer([cb], max_steps=5).fit(model, loader)
    assert model.optimizer_steps == cb.steps == 5 and cb.mechanism == "banded_poisson_gaussian"
    assert model._dp_optimizer.correlation.coefficients == (1.0, 0.25) and model._dp_optimizer.correlation.steps == 5
    pld, rdp = _reference(6 / 30, model.sigma, 3)
    assert cb.epsilon == pytest.approx(min(pld, rdp), rel=0.02)


def test_partitions_other_than_the_bands_are_refused():
    with pytest.raises(ValueError, match="3 partitions but the noise has 2 bands"):
        _fit(DPDataLoader(_data(), batch_size=12, seed=0, partitions=3), noise="banded", bands=2)


def test_a_second_fit_or_a_resume_of_a_banded_run_is_refused():
    loader = DPDataLoader(_data(), batch_size=12, seed=0, partitions=2)
    cb, model, trainer = _fit(loader, noise="banded", bands=2)
    with pytest.raises(ValueError, match="second fit or a resume is refused"):
        _fit(loader, model, noise="banded", bands=2)
    state = cb._layer.dp.state_dict() if cb._layer is not None else trainer.optimizers[0].state_dict()
    assert state["correlation"]["steps"] == 7 and "previous" not in str(state["correlation"])
    fresh = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_params=dict(model.named_parameters()),
                        noise_multiplier=1.0, clip_norm=1.0, clipping="standard")
    with pytest.raises(ValueError, match="Refusing to resume a banded correlated-noise run after 7 steps"):
        fresh.load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise="banded", bands=0), "bands"),
    (dict(noise="banded"), "needs `bands`"),
    (dict(noise="banded", bands=2, coefficients=(1.0, float("nan"))), "finite"),
    (dict(noise="banded", bands=2, coefficients=(2.0, 0.5)), "c_0 = 1"),
    (dict(noise="banded", bands=3, coefficients=(1.0, 0.5)), "3 values"),
    (dict(noise="correlated", bands=2), "noise"),
    (dict(bands=2), "noise='banded'"),
])
def test_bad_noise_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrivacyCallback(clip_norm=1.0, **kwargs)


def test_banded_noise_refuses_sigma_zero_a_changed_sigma_and_another_mechanism():
    noise = BandedNoise(2, (1.0, 0.3))
    with pytest.raises(ValueError, match="σ > 0"):
        noise.correlate(torch.zeros(3), 0.0, BandedNoise.mechanism)
    with pytest.raises(RuntimeError, match="accounted with 'poisson_gaussian'"):
        noise.correlate(torch.zeros(3), 1.0, "poisson_gaussian")
    noise.correlate(torch.zeros(3), 1.0, BandedNoise.mechanism)
    with pytest.raises(RuntimeError, match="changed"):
        noise.correlate(torch.zeros(3), 2.0, BandedNoise.mechanism)
    with pytest.raises(ValueError, match="coefficients"):
        BandedNoise(3)


# --------------------------------------------------------------------------- the sampler
def test_cyclic_poisson_samples_one_partition_per_step_so_a_row_is_drawn_b_apart():
    n, b, batch = 50, 4, 5.0
    loader = DPDataLoader(_data(n), batch_size=batch, seed=2, partitions=b)
    s = loader.batches
    assert s.population == 13 and s.sampling_rate == pytest.approx(5 / 13) and len(loader) == b * 3
    draws = {t: set(s.indices(t).tolist()) for t in range(40)}
    assert all(i % b == t % b for t, rows in draws.items() for i in rows)
    seen = {}
    for t, rows in draws.items():
        for i in rows:
            assert t - seen.get(i, -b) >= b
            seen[i] = t
    hits = sum(len(r) for t, r in draws.items() if t % b == 0) / 10  # partition 0 holds 13 rows, rate 5/13
    assert 2.0 < hits < 8.0
    spec = loader.sampling_spec
    assert (spec.population, spec.num_units, spec.detail.partitions, spec.privacy_unit) == (13, n, b, "example")
    assert SamplingSpec(**spec.to_dict()) == spec  # the saved form builds the record back
    one = DPDataLoader(_data(n), batch_size=batch, seed=2, partitions=1).batches
    plain = DPDataLoader(_data(n), batch_size=batch, seed=2).batches
    assert all(torch.equal(one.indices(t), plain.indices(t)) for t in range(5))  # b = 1: the same samples
    with pytest.raises(ValueError, match="P = 4"):
        DPDataLoader(_data(n), batch_size=14, partitions=b)
    with pytest.raises(ValueError, match="partitions"):
        DPDataLoader(_data(n), batch_size=1, partitions=0)


def test_a_model_that_plans_releases_refuses_the_banded_mode():
    from lightning_dprel.callbacks.correlated import noise_mode, refuse_for_releases

    refuse_for_releases(object(), noise_mode("independent", None, None))
    with pytest.raises(ValueError, match="plans releases"):
        refuse_for_releases(object(), noise_mode("banded", 2, None))


def test_a_batch_without_exactly_one_step_is_refused_in_the_banded_mode():
    from lightning_dprel.demos.boring_classes import BoringPrivateModule, quiet_trainer

    class SkipsABatch(BoringPrivateModule):
        def training_step(self, batch, batch_idx):
            if batch_idx != 1:  # batch 1 drawn, not released: later steps of its partition would come closer than b
                super().training_step(batch, batch_idx)

    model = SkipsABatch(clipping="standard")
    loader = DPDataLoader(TensorDataset(torch.randn(60, 1)), batch_size=6, seed=0, partitions=2)
    with pytest.raises(RuntimeError, match="made 0 DP optimizer steps"):
        quiet_trainer([PrivacyCallback(delta=DELTA, noise="banded", bands=2)], max_steps=5).fit(model, loader)
    assert model.optimizer_steps == 1


def test_resuming_a_banded_run_from_its_checkpoint_is_refused_before_a_step(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def trainer(steps):
        cb = PrivacyCallback(delta=DELTA, clip_norm=1.0, noise_multiplier=1.0, noise="banded", bands=2)
        ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
        return pl.Trainer(callbacks=[cb, ckpt], max_steps=steps, logger=False, enable_progress_bar=False,
                          enable_model_summary=False)

    trainer(2).fit(_Linear(), DPDataLoader(_data(), batch_size=12, seed=0, partitions=2))
    model = _Linear()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="resume"):
        trainer(4).fit(model, DPDataLoader(_data(), batch_size=12, seed=0, partitions=2),
                       ckpt_path=str(tmp_path / "last.ckpt"))
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert "previous" not in str(state["optimizer_states"])  # no noise in the checkpoint
    saved = state["state_dict"]
    assert all(torch.equal(p, saved[n]) or torch.equal(p, b) for (n, p), b in zip(model.state_dict().items(), before))


def test_banded_noise_set_on_the_optimizer_outside_the_banded_mode_is_refused_before_step_one():
    from lightning_dprel.demos.boring_classes import BoringPrivateModule, quiet_trainer

    class OwnBandedNoise(BoringPrivateModule):  # skips a drawn batch: only the banded mode's checks would catch it
        def training_step(self, batch, batch_idx):
            if batch_idx != 1:
                super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            dp = super().configure_optimizers()
            dp.set_correlated_noise(BandedNoise(2, (1.0, 0.5)))
            return dp

    model = OwnBandedNoise(clipping="standard")
    loader = DPDataLoader(TensorDataset(torch.randn(60, 1)), batch_size=6, seed=0, partitions=2)
    with pytest.raises(ValueError, match="noise='independent'"):
        quiet_trainer([PrivacyCallback(delta=DELTA)], max_steps=5).fit(model, loader)
    assert model.optimizer_steps == 0 and model.privacy_ledger.steps == 0
