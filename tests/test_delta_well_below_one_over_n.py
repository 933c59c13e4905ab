"""δ must sit well below 1/n: a δ just under 1/n (KarateClub's default 1/m = 0.027 against 1/n = 0.029) warns; the
default for non-entity units, 1/(10·n), does not."""

from __future__ import annotations

import warnings

import pytest

from lightning_dprel.core.checks import resolve_delta
from lightning_dprel.core.specs import privacy_unit


def test_karate_club_default_delta_warns():
    n, m = 34, 37  # a KarateClub-sized graph: δ = 1/m = 0.027 is below 1/n = 0.029, but not by a margin
    with pytest.warns(UserWarning, match=r"δ = 0.027 is not well below 1/n = 0.0294 \(n = 34 entities\)"):
        assert resolve_delta(None, privacy_unit("entity"), n, num_edges=m, warn=True) == pytest.approx(1 / m)


def test_above_one_over_n_says_not_below_and_a_tenth_of_it_is_quiet():
    with pytest.warns(UserWarning, match=r"δ = 0.05 is not below 1/n"):
        resolve_delta(0.05, privacy_unit("entity"), 34, warn=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert resolve_delta(None, privacy_unit("labelled_node"), 34, warn=True) == pytest.approx(1 / 340)
        resolve_delta(1e-5, privacy_unit("entity"), 34, num_edges=37, warn=True)
