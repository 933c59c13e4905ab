"""δ must sit well below 1/n: n·δ ≥ 1 is refused unless the user opts in (``allow_large_delta=True``), a δ just under
1/n (KarateClub's default 1/m = 0.027 against 1/n = 0.029) warns, and the defaults (1/m for entities when it is below
1/n, else 1/(10·n)) are never refused."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from lightning_dprel import DPDataLoader, PrivacyCallback
from lightning_dprel.core.checks import resolve_delta
from lightning_dprel.core.specs import privacy_unit

pytestmark = [pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
              pytest.mark.filterwarnings("ignore:.*DPDataLoader\\(seed.*")]


def test_karate_club_default_delta_warns():
    n, m = 34, 37  # a KarateClub-sized graph: δ = 1/m = 0.027 is below 1/n = 0.029, but not by a margin
    with pytest.warns(UserWarning, match=r"δ = 0.027 is not well below 1/n = 0.0294 \(n = 34 entities\)"):
        got = resolve_delta(None, privacy_unit("entity"), n, population=m, warn=True)
        assert got == pytest.approx(1 / m)


def test_at_or_above_one_over_n_is_refused_unless_allowed_and_a_tenth_of_it_is_quiet():
    with pytest.raises(ValueError, match=r"δ = 0.05 is not below 1/n = 0.0294 .* allow_large_delta=True"):
        resolve_delta(0.05, privacy_unit("entity"), 34, warn=True)
    with pytest.warns(UserWarning, match=r"δ = 0.05 is not below 1/n"):
        assert resolve_delta(0.05, privacy_unit("entity"), 34, warn=True, allow_large=True) == 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert resolve_delta(None, privacy_unit("labelled_node"), 34, warn=True) == pytest.approx(1 / 340)
        resolve_delta(1e-5, privacy_unit("entity"), 34, population=37, warn=True)


def test_the_entity_default_is_a_tenth_of_one_over_n_when_one_over_m_is_not_below_it():
    entity = privacy_unit("entity")
    assert resolve_delta(None, entity, 120, population=112, warn=False) == pytest.approx(1 / 1200)
    assert resolve_delta(None, entity, 120, population=400, warn=False) == pytest.approx(1 / 400)


class _MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(cb):
    x = torch.randn(100, 4, generator=torch.Generator().manual_seed(0))
    pl.Trainer(max_steps=2, callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(_MLP(), DPDataLoader(TensorDataset(x, (x[:, 0] > 0).long()), 10, seed=0))


def test_privacy_callback_refuses_delta_one_half_before_any_step_and_takes_the_opt_in():
    cb = PrivacyCallback(delta=0.5, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"δ = 0.5 is not below 1/n = 0.01 \(n = 100 examples\)"):
        _fit(cb)
    assert cb.steps == 0
    allowed = PrivacyCallback(delta=0.5, clip_norm=1.0, noise_multiplier=1.0, allow_large_delta=True)
    with pytest.warns(UserWarning, match=r"δ = 0.5 is not below 1/n"):
        _fit(allowed)
    assert allowed.steps == 2 and allowed.delta == 0.5
