"""PrivacyCallback (issue 6): live ε, halting before the budget, calibration, resume, refusals.

Most fits use a minimal manual-optimization module and datamodule that expose the DP facts (like
Lightning's boring classes); one fit uses the real DPRelationalModule + RelationalDataModule.
Every ε is checked against an Accountant created independently from the step count.
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers.logger import Logger
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprel.callbacks import PAPER_EQ3_WARNING, PrivacyCallback
from lightning_dprel.accounting import Accountant, noise_multiplier_for
from lightning_dprel.core.specs import NoiseSpec
from lightning_dprel.demos.boring_classes import BoringPrivateModule, SpecDataModule, make_spec

MECHS = ("freq_corrected", "freq_paper", "standard")


# ---------------------------------------------------------------------- boring private classes
class MemoryLogger(Logger):
    """Keeps every logged metric in memory."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def values(self, key):
        return [row[key] for _, row in self.rows if key in row]


def make_trainer(callback, *, logger=False, **kwargs) -> pl.Trainer:
    options = dict(
        accelerator="cpu", devices=1, max_epochs=50, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
        callbacks=[callback] + kwargs.pop("extra_callbacks", []),
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def independent_eps(mech, spec, sigma, delta, steps):
    acc = Accountant(mech)
    acc.step(spec, sigma, num_steps=steps)
    return acc.get_epsilon(delta)


def module_for(mech, sigma):
    if mech == "standard":
        return BoringPrivateModule(sigma=sigma, clipping="standard")
    return BoringPrivateModule(sigma=sigma, clipping="freq", accounting=mech.split("_")[1])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        warnings.filterwarnings("ignore", message=".*no pre-optimization state was saved.*")
        warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
        warnings.filterwarnings("ignore", message=".*callbacks used to create the checkpoint need to be provided.*")
        # ours, by design of these fits (each asserted elsewhere): δ = 1/m with fewer entities than relations, the
        # fixed seeds of real_pair() (runs are compared), validation on the test queries of a graph without val split
        warnings.filterwarnings("ignore", message=r"PrivacyCallback: δ = \S+ is not below 1/n")
        warnings.filterwarnings("ignore", message=r"(DPRelationalModule\(noise_seed|RelationalDataModule\(sampling_seed)=<int>\)")
        warnings.filterwarnings("ignore", message="RelationalDataModule has no validation graph")
        yield


def default_delta(spec):
    """The callback's default δ for the entity unit: the paper's 1/m when it is below 1/n, else 1/(10·n)."""
    return 1.0 / spec.num_edges if spec.num_edges > spec.units else 1.0 / (10 * spec.units)


# ---------------------------------------------------------------------- budget
def _random_configs(count, seed):
    rng = random.Random(seed)
    for i in range(count):
        n, m, gamma = rng.choice([500, 2000, 10000]), rng.choice([2000, 5000, 20000]), rng.choice([0.002, 0.01, 0.05])
        k = rng.randint(0, min(4, int(n // (gamma * m))))  # NEG-SAMPLE-WOR needs k·b ≤ n
        spec = make_spec(n=n, m=m, K=rng.randint(1, 5), gamma=gamma, k=k, steps_per_epoch=rng.randint(3, 9))
        yield MECHS[i % 3], spec, rng.uniform(0.6, 2.5), rng.randint(1, 20), rng.random()


# the last config stops exactly at an epoch boundary (4 epochs of 5 batches)
_EPOCH_END = ("freq_corrected", make_spec(K=5, k=4, gamma=0.01, steps_per_epoch=5), 1.0, 20, 0.5)


@pytest.mark.parametrize("mech,spec,sigma,stop_at,frac", list(_random_configs(24, seed=6)) + [_EPOCH_END])
def test_budget_stops_before_the_step_that_would_exceed(mech, spec, sigma, stop_at, frac):
    delta = default_delta(spec)
    eps_t = independent_eps(mech, spec, sigma, delta, stop_at)
    eps_next = independent_eps(mech, spec, sigma, delta, stop_at + 1)
    assert eps_next > eps_t
    target = eps_t + frac * 0.999 * (eps_next - eps_t)  # ε(stop_at) ≤ target < ε(stop_at + 1)
    callback, module, logger = PrivacyCallback(target_epsilon=target), module_for(mech, sigma), MemoryLogger()
    trainer = make_trainer(callback, logger=logger)
    paper = mech == "freq_paper"
    with pytest.warns(UserWarning, match="Proposition 4.1") if paper else contextlib.nullcontext():
        trainer.fit(module, datamodule=SpecDataModule(spec))

    assert module.optimizer_steps == callback.steps == trainer.global_step == stop_at
    assert callback.stopped_step == stop_at and trainer.should_stop
    assert callback.epsilon <= target < independent_eps(mech, spec, sigma, delta, callback.steps + 1)
    assert callback.epsilon == pytest.approx(eps_t, rel=1e-9)
    assert logger.values("epsilon")[-1] == pytest.approx(eps_t, rel=1e-6)


def test_logged_epsilon_equals_independent_accountant_per_step():
    spec, sigma, mech = make_spec(K=4, k=3, gamma=0.02), 1.1, "freq_corrected"
    callback, module, logger = PrivacyCallback(), module_for(mech, sigma), MemoryLogger()
    trainer = make_trainer(callback, logger=logger, max_steps=11)
    trainer.fit(module, datamodule=SpecDataModule(spec))

    delta = default_delta(spec)
    expected = [independent_eps(mech, spec, sigma, delta, t) for t in range(1, 12)]
    assert logger.values("epsilon") == pytest.approx(expected, rel=1e-6)
    assert logger.values("delta") == pytest.approx([delta] * 11)
    assert trainer.progress_bar_metrics["epsilon"] == pytest.approx(expected[-1], rel=1e-6)
    assert "delta" not in trainer.progress_bar_metrics  # a bar rounds δ = 2e-4 to 0.000
    assert callback.delta == delta and callback.stopped_step is None and module.optimizer_steps == 11


def test_single_step_over_budget_raises_at_fit_start():
    spec = make_spec()
    one_step = independent_eps("freq_corrected", spec, 1.0, 1e-5, 1)
    module = module_for("freq_corrected", 1.0)
    with pytest.raises(ValueError, match="below the ε of a single step"):
        make_trainer(PrivacyCallback(target_epsilon=0.5 * one_step, delta=1e-5)).fit(
            module, datamodule=SpecDataModule(spec)
        )
    assert module.optimizer_steps == 0


def test_explicit_sampling_spec_without_datamodule():
    spec, sigma = make_spec(K=2, k=1), 1.3
    callback, module = PrivacyCallback(sampling_spec=spec, delta=1e-4), module_for("standard", sigma)
    loader = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=1)
    make_trainer(callback, max_steps=5).fit(module, train_dataloaders=loader)
    assert callback.steps == 5 and callback.mechanism == "standard"
    assert callback.epsilon == pytest.approx(independent_eps("standard", spec, sigma, 1e-4, 5), rel=1e-9)


# ---------------------------------------------------------------------- calibration
@pytest.mark.parametrize("limits", [dict(max_steps=9), dict(max_epochs=2)])
def test_calibration_sets_sigma_and_spends_at_most_the_target(limits):
    spec, target = make_spec(K=2, k=2, gamma=0.02, steps_per_epoch=6), 2.0
    callback, module, logger = PrivacyCallback(target_epsilon=target, calibrate=True), module_for("standard", 0.0), MemoryLogger()
    trainer = make_trainer(callback, logger=logger, **limits)
    trainer.fit(module, datamodule=SpecDataModule(spec))

    planned = limits.get("max_steps") or limits["max_epochs"] * spec.steps_per_epoch
    delta = default_delta(spec)
    sigma = noise_multiplier_for(target, delta=delta, steps=planned, sampling=spec, mechanism="standard")
    assert module.sigma == pytest.approx(sigma) and callback.noise_multiplier == pytest.approx(sigma)
    assert logger.values("noise_multiplier") == pytest.approx([sigma])
    assert module.optimizer_steps == callback.steps == planned
    assert callback.epsilon <= target
    assert callback.epsilon == pytest.approx(independent_eps("standard", spec, sigma, delta, planned), rel=1e-9)
    assert callback.epsilon > 0.9 * target  # σ is the smallest that fits, not a loose one


# ---------------------------------------------------------------------- resume
def _resume_config():
    return make_spec(K=3, k=2, gamma=0.02, steps_per_epoch=5), 1.2


@pytest.mark.parametrize("calibrate", [False, True])
def test_resume_from_checkpoint_equals_uninterrupted(tmp_path, calibrate):
    spec, sigma = _resume_config()
    delta = default_delta(spec)
    target = 0.5 * (independent_eps("freq_corrected", spec, sigma, delta, 13)
                    + independent_eps("freq_corrected", spec, sigma, delta, 14))
    limits = dict(max_steps=17) if calibrate else {}

    def run(ckpt_path=None, save=False):
        callback = PrivacyCallback(target_epsilon=target, calibrate=calibrate)
        module = module_for("freq_corrected", 0.0 if calibrate else sigma)
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1,
                                 filename="{step}")] if save else []
        trainer = make_trainer(callback, extra_callbacks=extra, enable_checkpointing=save, **limits)
        trainer.fit(module, datamodule=SpecDataModule(spec), ckpt_path=ckpt_path)
        return callback, module, trainer

    full_cb, full_module, full_trainer = run(save=True)
    ckpt = tmp_path / "step=8.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    state = saved["callbacks"]["PrivacyCallback"]
    assert sum(seg["steps"] for seg in saved["lightning_dprel"]["ledger"]["segments"]) == 8 and state["target_epsilon"] == target
    assert state["mechanism"] == "freq_corrected" and state["delta"] == delta

    resumed_cb, resumed_module, resumed_trainer = run(ckpt_path=str(ckpt))
    assert resumed_cb.steps == full_cb.steps == resumed_trainer.global_step == full_trainer.global_step
    assert resumed_module.optimizer_steps == full_cb.steps - 8
    assert resumed_cb.epsilon == full_cb.epsilon
    assert resumed_cb.noise_multiplier == full_cb.noise_multiplier
    assert full_cb.epsilon <= target
    if not calibrate:
        assert full_cb.steps == 13 and full_cb.stopped_step == resumed_cb.stopped_step == 13


def test_resume_without_callback_state_still_counts_the_ledger(tmp_path):
    spec, sigma = _resume_config()
    module = module_for("freq_corrected", sigma)
    trainer = make_trainer(PrivacyCallback(), max_steps=3)
    trainer.fit(module, datamodule=SpecDataModule(spec))
    path = tmp_path / "no_privacy.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["callbacks"]["PrivacyCallback"]
    torch.save(checkpoint, path)
    resumed, fresh = PrivacyCallback(), module_for("freq_corrected", sigma)
    make_trainer(resumed, max_steps=6).fit(fresh, datamodule=SpecDataModule(spec), ckpt_path=str(path))
    assert fresh.optimizer_steps == 3 and resumed.steps == 6  # the 3 steps before the checkpoint are in the ledger
    assert resumed.epsilon == pytest.approx(independent_eps("freq_corrected", spec, sigma, default_delta(spec), 6), rel=1e-12)


def test_state_dict_is_plain_and_rejects_another_mechanism():
    spec, sigma = _resume_config()
    callback = PrivacyCallback()
    make_trainer(callback, max_steps=2).fit(module_for("standard", sigma), datamodule=SpecDataModule(spec))
    state = callback.state_dict()
    assert state["mechanism"] == "standard" and "steps_seen" not in state  # what was spent is the module's ledger
    assert all(isinstance(state[key], (int, float, str, type(None), dict, list)) for key in state)
    with pytest.raises(ValueError, match="mechanism='standard'"):
        PrivacyCallback(mechanism="freq_corrected").load_state_dict(state)
    with pytest.raises(ValueError, match="empty state"):
        PrivacyCallback().load_state_dict({})
    with pytest.raises(ValueError, match="missing"):
        PrivacyCallback().load_state_dict({"mechanism": "standard"})


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(target_epsilon=-1.0), ValueError, "`target_epsilon` must be > 0"),
        (dict(target_epsilon="4"), TypeError, "`target_epsilon` must be a number"),
        (dict(target_epsilon=math.inf), ValueError, "finite"),
        (dict(delta=1.5), ValueError, r"`delta` must be in \(0, 1\)"),
        (dict(mechanism="rdp"), ValueError, "`mechanism` must be one of"),
        (dict(calibrate=True), ValueError, "needs `target_epsilon`"),
        (dict(sampling_spec={"m": 3}), TypeError, "`sampling_spec` must be"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        PrivacyCallback(**kwargs)


class PlainModule(pl.LightningModule):
    """A LightningModule of the user's own: the callback attaches the DP-SGD layer, which needs C."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0].view(-1, 1)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    "callback,module,datamodule,error,match",
    [
        (dict(), PlainModule(), SpecDataModule(make_spec()), ValueError, "needs `clip_norm=`"),
        (dict(), BoringPrivateModule(), SpecDataModule(make_spec(), expose=False), ValueError, "needs a SamplingSpec"),
        (dict(sampling_spec=make_spec(K=5)), BoringPrivateModule(), SpecDataModule(make_spec()), ValueError,
         "contradicts trainer.datamodule.sampling_spec"),
        (dict(mechanism="standard"), BoringPrivateModule(clipping="freq"), SpecDataModule(make_spec()), ValueError,
         r"mechanism='standard'\) contradicts the module"),
        (dict(mechanism="freq_paper"), BoringPrivateModule(), SpecDataModule(make_spec()), ValueError,
         "contradicts the module"),
        (dict(target_epsilon=4.0), BoringPrivateModule(sigma=0.0, clipping="none"), SpecDataModule(make_spec()),
         ValueError, "non-private baseline"),
        (dict(target_epsilon=4.0), BoringPrivateModule(sigma=0.0), SpecDataModule(make_spec()), ValueError,
         "ε is infinite but target_epsilon=4.0"),
    ],
)
def test_missing_or_contradictory_facts_are_refused(callback, module, datamodule, error, match):
    with pytest.raises(error, match=match):
        make_trainer(PrivacyCallback(**callback), max_steps=3).fit(module, datamodule=datamodule)
    assert getattr(module, "optimizer_steps", 0) == 0


def test_the_callbacks_clip_norm_is_refused_for_a_module_that_clips_to_its_own_c():
    """A library module owns C: another C given to the callback is refused before any step (it was
    ignored); the module's own C, given again, is accepted."""
    module = BoringPrivateModule(clip_norm=1.0)
    with pytest.raises(ValueError, match=r"clip_norm=2\) .* BoringPrivateModule clips to its own"):
        make_trainer(PrivacyCallback(delta=1e-5, clip_norm=2.0), max_steps=3).fit(
            module, datamodule=SpecDataModule(make_spec()))
    assert module.optimizer_steps == 0 and not module.privacy_ledger.segments
    make_trainer(PrivacyCallback(delta=1e-5, clip_norm=1.0), max_steps=2).fit(
        module, datamodule=SpecDataModule(make_spec()))
    assert module.optimizer_steps == 2 and module.noise_spec.clip_norm == 1.0


@pytest.mark.parametrize(
    "trainer_kwargs,match",
    [
        (dict(min_epochs=2), r"min_epochs=2"),
        (dict(min_steps=5), r"min_steps=5"),
        (dict(overfit_batches=2), r"overfit_batches=2"),
    ],
)
def test_trainer_settings_that_override_a_stop_are_refused(trainer_kwargs, match):
    module = BoringPrivateModule()
    with pytest.raises(ValueError, match=match):
        make_trainer(PrivacyCallback(target_epsilon=4.0), **trainer_kwargs).fit(
            module, datamodule=SpecDataModule(make_spec())
        )
    assert module.optimizer_steps == 0


def test_two_privacy_callbacks_are_refused_by_their_state_key():
    assert PrivacyCallback().state_key == "PrivacyCallback"
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `PrivacyCallback`"):
        make_trainer(PrivacyCallback(), extra_callbacks=[PrivacyCallback()])


def test_resume_after_the_budget_stop_takes_no_step_unless_the_target_is_raised(tmp_path):
    spec, sigma = _resume_config()
    delta = default_delta(spec)
    target = 0.5 * (independent_eps("standard", spec, sigma, delta, 6) + independent_eps("standard", spec, sigma, delta, 7))
    first = PrivacyCallback(target_epsilon=target)
    trainer = make_trainer(first)
    trainer.fit(module_for("standard", sigma), datamodule=SpecDataModule(spec))
    assert first.steps == 6
    path = tmp_path / "spent.ckpt"
    trainer.save_checkpoint(path)

    again, module = PrivacyCallback(target_epsilon=target), module_for("standard", sigma)
    make_trainer(again).fit(module, datamodule=SpecDataModule(spec), ckpt_path=str(path))
    assert module.optimizer_steps == 0 and again.steps == 6 and again.epsilon == first.epsilon

    higher = 0.5 * (independent_eps("standard", spec, sigma, delta, 9) + independent_eps("standard", spec, sigma, delta, 10))
    raised, module = PrivacyCallback(target_epsilon=higher), module_for("standard", sigma)
    with pytest.warns(UserWarning, match="resuming with target_epsilon="):
        make_trainer(raised).fit(module, datamodule=SpecDataModule(spec), ckpt_path=str(path))
    assert module.optimizer_steps == 3 and raised.steps == 9
    assert raised.epsilon == pytest.approx(independent_eps("standard", spec, sigma, delta, 9), rel=1e-12)


class SaveBeforePrivacy(pl.Callback):
    """Saves a checkpoint in on_train_batch_end *before* PrivacyCallback has charged that step."""

    def __init__(self, path, at):
        self.path, self.at = path, at

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at:
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_before_the_callback_runs_holds_the_step(tmp_path):
    spec, sigma = _resume_config()
    delta = default_delta(spec)
    target = 0.5 * (independent_eps("standard", spec, sigma, delta, 8) + independent_eps("standard", spec, sigma, delta, 9))
    path = tmp_path / "early.ckpt"
    full = PrivacyCallback(target_epsilon=target)
    trainer = make_trainer(full)
    trainer.callbacks.insert(0, SaveBeforePrivacy(path, at=3))
    trainer.fit(module_for("standard", sigma), datamodule=SpecDataModule(spec))
    # the module charged step 3 when it took it, before any callback ran: the checkpoint's ledger has it
    assert torch.load(path, weights_only=False)["lightning_dprel"]["ledger"]["segments"][0]["steps"] == 3

    resumed, module = PrivacyCallback(target_epsilon=target), module_for("standard", sigma)
    make_trainer(resumed).fit(module, datamodule=SpecDataModule(spec), ckpt_path=str(path))
    assert resumed.steps == full.steps == 8 and module.optimizer_steps == 5
    assert resumed.epsilon == full.epsilon


class ClearStop(pl.Callback):
    """Misbehaves: cancels every stop request (runs after PrivacyCallback)."""

    def on_train_batch_end(self, trainer, *args):
        trainer.should_stop = False


def test_a_step_past_the_budget_is_an_error_not_a_silent_overrun():
    spec, sigma = make_spec(), 1.0
    delta = default_delta(spec)
    target = 0.5 * (independent_eps("freq_corrected", spec, sigma, delta, 4) + independent_eps("freq_corrected", spec, sigma, delta, 5))
    callback, module = PrivacyCallback(target_epsilon=target), module_for("freq_corrected", sigma)
    with pytest.raises(RuntimeError, match="a step ran after the callback set `trainer.should_stop`"):
        make_trainer(callback, extra_callbacks=[ClearStop()]).fit(module, datamodule=SpecDataModule(spec))
    assert module.optimizer_steps == 5


class TwoStepModule(BoringPrivateModule):
    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)
        super().training_step(batch, batch_idx)


def test_two_releases_on_one_batch_are_one_sampled_step_with_sigma_over_sqrt2_and_looked_ahead():
    """Two noised releases of one sample are one sampled Gaussian release with σ/√2, not two independent steps."""
    spec, sigma = make_spec(), 1.0
    delta, joint = default_delta(spec), sigma / math.sqrt(2.0)
    target = 0.5 * (independent_eps("freq_corrected", spec, joint, delta, 3) + independent_eps("freq_corrected", spec, joint, delta, 4))
    callback, module = PrivacyCallback(target_epsilon=target), TwoStepModule(sigma=sigma)
    make_trainer(callback).fit(module, datamodule=SpecDataModule(spec))
    assert module.optimizer_steps == 6 and callback.steps == 3  # a fourth batch would exceed
    assert callback.epsilon == pytest.approx(independent_eps("freq_corrected", spec, joint, delta, 3), rel=1e-12)
    assert callback.epsilon > independent_eps("freq_corrected", spec, sigma, delta, 6)  # what was charged before
    assert module.privacy_ledger.segments[-1].releases == 2


def test_naive_bound_is_accepted_only_where_its_sensitivity_is_claimed():
    spec = make_spec()
    callback = PrivacyCallback(mechanism="naive")
    with pytest.warns(UserWarning, match="Proposition 4.1"):
        make_trainer(callback, max_steps=3).fit(module_for("freq_paper", 2.0), datamodule=SpecDataModule(spec))
    assert callback.epsilon == pytest.approx(independent_eps("naive", spec, 2.0, default_delta(spec), 3), rel=1e-12)
    assert "naive" in callback.summary
    for mech in ("freq_corrected", "standard"):
        with pytest.raises(ValueError, match=r"mechanism='naive'\) contradicts the module"):
            make_trainer(PrivacyCallback(mechanism="naive"), max_steps=3).fit(
                module_for(mech, 2.0), datamodule=SpecDataModule(spec)
            )


class SwitchingModule(BoringPrivateModule):
    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)
        if self.optimizer_steps == 2:
            self._dp_optimizer.noise_spec = NoiseSpec(self.sigma, 1.0, clipping="standard")


def test_a_module_that_switches_clipping_mid_fit_is_refused():
    with pytest.raises(ValueError, match="already spent 2 private steps accounted with 'freq_corrected'"):
        make_trainer(PrivacyCallback(), max_steps=5).fit(SwitchingModule(), datamodule=SpecDataModule(make_spec()))


# ---------------------------------------------------------------------- reporting
def test_paper_accounting_warns_once_and_summary_names_it():
    spec = make_spec()
    callback = PrivacyCallback()
    module = module_for("freq_paper", 1.0)
    with pytest.warns(UserWarning) as record:
        make_trainer(callback, max_steps=2).fit(module, datamodule=SpecDataModule(spec))
        make_trainer(callback, max_steps=4).fit(module, datamodule=SpecDataModule(spec))
    assert sum("Proposition 4.1" in str(w.message) for w in record) == 1
    assert "does not hold as stated" in PAPER_EQ3_WARNING
    assert callback.steps == module.optimizer_steps == 6  # a second fit (new trainer) adds to the same ε
    assert "accounting: FREQ-CLIP paper Eq. 3" in callback.summary
    assert "over 6 steps" in callback.summary and f"ε = {callback.epsilon:.4f}" in callback.summary


@pytest.mark.parametrize("mech,label", [("freq_corrected", "FREQ-CLIP corrected"), ("standard", "standard (Thm C.1)")])
def test_summary_line(mech, label):
    spec = make_spec()
    delta = default_delta(spec)
    target = 0.5 * (independent_eps(mech, spec, 1.0, delta, 3) + independent_eps(mech, spec, 1.0, delta, 4))
    callback = PrivacyCallback(target_epsilon=target)
    make_trainer(callback).fit(module_for(mech, 1.0), datamodule=SpecDataModule(spec))
    assert callback.summary.startswith(f"PrivacyCallback: spent ε = {callback.epsilon:.4f} at δ = {delta:.3g}")
    assert f"over 3 steps, σ = 1, accounting: {label}" in callback.summary
    assert "stopped: step 4 would exceed it" in callback.summary


# ---------------------------------------------------------------------- our module + datamodule, plain Lightning
def real_pair(*, sigma=1.0, calibrate_sigma=None):
    from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
    from lightning_dprel.demos import random_feature_graph
    from lightning_dprel.encoders import MLPEncoder
    from lightning_dprel.methods.relational.module import DPRelationalModule

    dm = RelationalDataModule(
        random_feature_graph(120, 400, dim=8, seed=3), max_degree=3, expected_batch_size=12.0, neg_per_pos=2,
        seed=3, sampling_seed=3, max_eval_queries=16, eval_batch_size=16,  # fixed secret: runs are compared
    )
    torch.manual_seed(11)  # the encoder's initial weights
    module = DPRelationalModule(
        MLPEncoder(8, hidden_dim=16, out_dim=8), clipping="freq", noise_multiplier=sigma, noise_seed=5, lr=1e-2
    )
    return module, dm


def _real_target(stop_at, sigma=1.0):
    _, dm = real_pair()
    dm.setup("fit")
    spec = dm.sampling_spec
    delta = default_delta(spec)
    eps = [independent_eps("freq_corrected", spec, sigma, delta, t) for t in (stop_at, stop_at + 1)]
    return 0.5 * (eps[0] + eps[1]), eps[0]


def test_plain_lightning_project_with_our_module_and_datamodule():
    target, eps_expected = _real_target(7)
    module, dm = real_pair()
    callback, logger = PrivacyCallback(target_epsilon=target), MemoryLogger()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=5, callbacks=[callback], logger=logger, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    assert callback.steps == trainer.global_step == module.privacy_ledger.steps == 7
    assert callback.epsilon == pytest.approx(eps_expected, rel=1e-9) and callback.epsilon <= target
    assert logger.values("epsilon")[-1] == pytest.approx(eps_expected, rel=1e-6)
    assert "accounting: FREQ-CLIP corrected" in callback.summary


@pytest.mark.parametrize("calibrate", [False, True])
def test_real_module_resume_equals_uninterrupted(tmp_path, calibrate):
    target, _ = _real_target(7)
    limits = dict(max_steps=7) if calibrate else {}

    def run(ckpt_path=None, save=False):
        module, dm = real_pair(sigma=0.5 if calibrate else 1.0)
        callback = PrivacyCallback(target_epsilon=target, calibrate=calibrate)
        extra = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, filename="{step}")] if save else []
        trainer = make_trainer(callback, extra_callbacks=extra, enable_checkpointing=save, limit_val_batches=0, **limits)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return callback, module

    full_cb, full_module = run(save=True)
    resumed_cb, resumed_module = run(ckpt_path=str(tmp_path / "step=3.ckpt"))
    assert resumed_cb.steps == full_cb.steps == resumed_module.privacy_ledger.steps == 7
    assert resumed_cb.epsilon == full_cb.epsilon <= target
    assert resumed_module.noise_spec == full_module.noise_spec
    if calibrate:
        assert full_module.noise_spec.noise_multiplier != 0.5 and full_cb.epsilon > 0.9 * target
    for (name, a), (_, b) in zip(full_module.state_dict().items(), resumed_module.state_dict().items()):
        assert torch.equal(a, b), f"resumed parameter {name} differs from the uninterrupted run"
