"""What the registries and the attach seam accept: a taken (clipping, accounting) pair keeps its mechanism, the
library's own per-layer rules cannot be replaced, a module that implements the protocol without the library's layer
is refused, and an empty ledger has no accountant."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
from torch import nn

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.callbacks.attach import privacy_layer
from lightning_dprel.core.clipping_modes import chosen_mechanism, register_mechanism_choice
from lightning_dprel.core.ledger import PrivacyLedger
from lightning_dprel.core.privacy_layer import PrivacyLayer
from lightning_dprel.grad_sample.layers import register_layer_rule


def test_a_taken_clipping_accounting_pair_keeps_its_mechanism():
    chosen = chosen_mechanism("freq", "corrected")
    with pytest.raises(ValueError, match="already selects"):
        register_mechanism_choice("freq", "corrected", "freq_paper")
    register_mechanism_choice("freq", "corrected", chosen)  # the same choice again is fine
    assert chosen_mechanism("freq", "corrected") == chosen == "freq_corrected"


@pytest.mark.parametrize("layer", [nn.Linear, nn.Embedding, nn.LayerNorm])
def test_the_librarys_own_layer_rules_cannot_be_replaced(layer):
    with pytest.raises(ValueError, match="library's own rule"):
        register_layer_rule(layer, lambda module, x, g: None)


class _SelfDeclared(pl.LightningModule, PrivacyLayer):
    """A plain module that claims to be its own privacy layer (it could state any σ)."""

    owns_clip_norm = True


def test_a_module_implementing_the_protocol_without_the_librarys_layer_is_refused():
    with pytest.raises(TypeError, match="implements PrivacyLayer without LedgerModule"):
        privacy_layer(None, _SelfDeclared(), clip_norm=1.0, noise_multiplier=1.0)


def test_an_empty_ledger_has_no_accountant():
    ledger = PrivacyLedger()
    assert not ledger.accountable
    with pytest.raises(ValueError, match="name the `mechanism`"):
        ledger.accountant()
    callback = PrivacyCallback(target_epsilon=1.0, delta=1e-5)
    callback._ledger = ledger  # as at fit start, before the first release
    assert callback.accountant is None
    assert ledger.accountant(mechanism="freq_corrected").mechanism == "freq_corrected"
