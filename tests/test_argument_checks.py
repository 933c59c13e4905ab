"""The library's argument rules (``core/checks.py``), one home each: every check refuses a bool
where a number is meant, refuses the wrong type with an error that is both a ``TypeError`` and a
``ValueError``, refuses the boundary its interval leaves open, accepts the one it closes, and names
the argument and what was expected."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from lightning_dprel.core.checks import (
    ArgumentTypeError,
    check_bool,
    check_choice,
    check_delta,
    check_int,
    check_probability,
    non_negative,
    positive_finite,
)

NUMBER_CHECKS = [
    lambda v: check_int("n", v, 1), lambda v: positive_finite("sigma", v),
    lambda v: non_negative("margin", v),
    lambda v: check_probability("rate", v, zero=True, one=True),
    check_delta,
]


@pytest.mark.parametrize("check", NUMBER_CHECKS)
@pytest.mark.parametrize("value", [True, False, "1", None, [1], np.bool_(True)])
def test_a_number_check_refuses_bools_and_other_types_as_both_type_and_value_errors(check, value):
    with pytest.raises(ArgumentTypeError, match="must be") as err:
        check(value)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)


def test_check_int_bounds_are_inclusive_and_it_names_the_argument_and_the_bound():
    assert check_int("k", 1, 1) == 1 and check_int("k", 5, 1, maximum=5) == 5
    assert type(check_int("k", np.int64(3), 0)) is int
    with pytest.raises(ValueError, match=r"^`k` must be an int >= 1, got 0\.$"):
        check_int("k", 0, 1)
    with pytest.raises(ValueError, match=r"`k` must be an int in \[1, 5\], got 6\."):
        check_int("k", 6, 1, maximum=5)
    with pytest.raises(TypeError, match=r"`k` must be an int >= 1, got float \(2\.0\)\. Use None"):
        check_int("k", 2.0, 1, " Use None.")


def test_check_int_optional_passes_none_and_says_so():
    assert check_int("fanout", None, 1, optional=True) is None
    with pytest.raises(ValueError, match=r"`fanout` must be None or an int >= 1, got 0"):
        check_int("fanout", 0, 1, optional=True)
    with pytest.raises(ArgumentTypeError):
        check_int("fanout", None, 1)


def test_a_label_after_the_name_stays_outside_the_backticks():
    with pytest.raises(ValueError, match=r"`max_degree` \(K\) must be an int >= 1, got 0"):
        check_int("max_degree (K)", 0, 1)


@pytest.mark.parametrize("value", [0, 0.0, -1.0, math.inf, -math.inf, math.nan])
def test_positive_finite_refuses_zero_negatives_infinity_and_nan(value):
    with pytest.raises(ValueError, match=r"`sigma` must be > 0 and finite.*; e\.g\. 1\.0"):
        positive_finite("sigma", value, "e.g. 1.0")


def test_positive_finite_accepts_the_smallest_positive_number():
    assert positive_finite("sigma", 5e-324) == 5e-324
    assert positive_finite("sigma", np.float32(2)) == 2.0


def test_non_negative_accepts_zero_and_infinity_and_refuses_below_zero_and_nan():
    assert non_negative("eps", 0) == 0.0 and non_negative("eps", math.inf) == math.inf
    for bad in (-1e-12, math.nan):
        with pytest.raises(ValueError, match="`eps` must be >= 0"):
            non_negative("eps", bad)


@pytest.mark.parametrize(
    ("zero", "one", "interval"),
    [(False, False, "(0, 1)"), (True, False, "[0, 1)"),
     (False, True, "(0, 1]"), (True, True, "[0, 1]")],
)
def test_check_probability_closes_each_end_only_when_asked(zero, one, interval):
    check = lambda v: check_probability("q", v, zero=zero, one=one)  # noqa: E731
    assert check(0.5) == 0.5
    for end, closed in ((0, zero), (1, one)):
        if closed:
            assert check(end) == float(end)
        else:
            with pytest.raises(ValueError, match=rf"`q` must be in {re.escape(interval)}"):
                check(end)
    for bad in (-1e-9, 1 + 1e-9, math.nan, math.inf):
        with pytest.raises(ValueError, match="`q` must be in"):
            check(bad)


def test_check_delta_is_open_at_both_ends():
    assert check_delta(1e-5) == 1e-5
    for bad in (0, 1, 1.5, -1e-5, math.nan):
        with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\)"):
            check_delta(bad)


def test_check_choice_names_the_options_and_refuses_unlisted_values():
    assert check_choice("mode", "paper", ("provable", "paper")) == "paper"
    assert check_choice("setting", "a", {"a": 1, "b": 2}) == "a"  # a mapping's keys are its options
    expected = r"`mode` must be one of \('provable', 'paper'\), got 'fast'\. Try it"
    with pytest.raises(ValueError, match=expected):
        check_choice("mode", "fast", ("provable", "paper"), " Try it.")
    for bad in (None, ["paper"], {"paper"}):  # unhashable: refused as a value, not by ``in``
        with pytest.raises(ValueError, match="must be one of"):
            check_choice("mode", bad, {"provable": 0, "paper": 1})


def test_check_choice_refuses_a_bool_equal_to_a_listed_number_takes_a_listed_bool():
    for bad in (True, False):
        with pytest.raises(ValueError, match=r"`level` must be one of \(0, 1\)"):
            check_choice("level", bad, (0, 1))
    assert check_choice("flag", True, (True, "auto")) is True


def test_check_bool_takes_bools_only():
    assert check_bool("x", True) is True and check_bool("x", np.bool_(False)) is False
    for bad in (1, 0, "True", None, 1.0):
        with pytest.raises(TypeError, match=r"`x` must be a bool, got"):
            check_bool("x", bad)
