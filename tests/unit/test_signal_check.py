"""The one usability check for signals: finite, within physical bounds, not from the future
beyond the clock-skew tolerance, not older than the limit; and the carbon scorer abstains with
that reason, so a NaN never reaches a cost."""

from __future__ import annotations

import math

import pytest

from scheduler.signal_check import CLOCK_SKEW_S, signal_problem
from scheduler.types import Signal

NOW = 1_800_000_000.0


def carbon(value: float, observed_at: float = NOW - 60) -> Signal:
    return Signal("carbon_intensity", "DE", value, "gCO2e/kWh", observed_at, NOW - 1, "electricitymaps")


@pytest.mark.parametrize("value", [0.0, 1.0, 450.0, 2000.0])
def test_a_fresh_value_within_bounds_is_usable(value: float) -> None:
    assert signal_problem(carbon(value), NOW, 3600) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 2000.5, 1e9])
def test_values_outside_physics_are_invalid(value: float) -> None:
    problem = signal_problem(carbon(value), NOW, 3600)
    assert problem is not None and problem.kind == "invalid"
    assert "DE from electricitymaps" in problem.reason


def test_the_future_beyond_the_skew_tolerance_is_refused_and_within_it_accepted() -> None:
    assert signal_problem(carbon(300, NOW + CLOCK_SKEW_S - 1), NOW, 3600) is None
    problem = signal_problem(carbon(300, NOW + 3600), NOW, 3600)
    assert problem is not None and problem.kind == "future" and problem.age_s == -3600


def test_older_than_the_limit_is_stale_with_its_age() -> None:
    problem = signal_problem(carbon(300, NOW - 7201), NOW, 7200)
    assert problem is not None and problem.kind == "stale" and problem.age_s == 7201
    assert signal_problem(carbon(300, NOW - 7200), NOW, 7200) is None


def test_a_nan_observed_at_is_invalid_not_fresh() -> None:
    problem = signal_problem(carbon(300, math.nan), NOW, 3600)
    assert problem is not None and problem.kind == "invalid"
