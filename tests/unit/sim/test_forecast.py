"""The simulator's carbon forecast (scheduler.sim.forecast): the shipped files' next hours with a
seeded multiplicative error that grows with the lead time."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest

from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.sim.carbon_feed import CarbonReplay, ProviderOutage
from scheduler.sim.forecast import CarbonForecast

T0 = datetime(2023, 3, 1, tzinfo=UTC).timestamp()
H = 3600.0


def replay(delay_s: float = 0.0, outages: tuple[ProviderOutage, ...] = ()) -> CarbonReplay:
    return CarbonReplay.from_dir(SHIPPED_CARBON_DIR, ["GB", "DE-LU"], 2023, delay_s, outages)


def test_zero_error_is_the_files_next_hours_from_the_published_one() -> None:
    carbon = replay()
    points = CarbonForecast(carbon, sigma=0.0, horizon_h=24).points("GB", T0 + 1800.0)
    series = carbon.series["GB"]
    row = series.times.index(T0)
    assert points == tuple(zip(series.times[row:row + 24], series.values[row:row + 24], strict=True))


def test_the_error_spares_the_published_hour_and_is_never_the_truth_ahead() -> None:
    carbon = replay()
    points = CarbonForecast(carbon, sigma=0.15, seed=1).points("GB", T0 + 60.0)
    truth = CarbonForecast(carbon, sigma=0.0).points("GB", T0 + 60.0)
    assert points[0] == truth[0]
    assert [p[0] for p in points] == [p[0] for p in truth]
    assert all(p[1] != t[1] for p, t in zip(points[1:], truth[1:], strict=True))


def test_seeded_per_zone_and_issue_and_the_same_within_an_issue() -> None:
    carbon = replay()
    a = CarbonForecast(carbon, sigma=0.15, seed=7)
    b = CarbonForecast(replay(), sigma=0.15, seed=7)
    assert a.points("GB", T0 + 10.0) == b.points("GB", T0 + 3000.0)  # one issue per published hour
    assert a.points("GB", T0) != CarbonForecast(carbon, sigma=0.15, seed=8).points("GB", T0)
    row = carbon.published_row("GB", T0)
    assert not np.allclose(a.errors("GB", row), a.errors("DE-LU", row))
    assert not np.allclose(a.errors("GB", row), a.errors("GB", row + 1))  # revised each hour


def test_the_log_error_spreads_as_sigma_times_the_root_of_the_lead_in_days() -> None:
    sigma = 0.2
    forecast = CarbonForecast(replay(), sigma=sigma, seed=3, horizon_h=25)
    errors = np.array([forecast.errors("GB", row) for row in range(3000)])
    assert np.all(errors[:, 0] == 0.0)
    for lead in (1, 6, 24):
        expected = sigma * math.sqrt(lead / 24)
        assert errors[:, lead].std() == pytest.approx(expected, rel=0.06)
        assert abs(errors[:, lead].mean()) < 0.1 * expected
    # A random walk: neighbouring leads are correlated (corr(e_23, e_24) = sqrt(23 / 24)).
    assert np.corrcoef(errors[:, 23], errors[:, 24])[0, 1] == pytest.approx(math.sqrt(23 / 24), abs=0.02)


def test_delay_and_outages_decide_which_issue_is_in_force() -> None:
    late = CarbonForecast(replay(delay_s=900.0), sigma=0.1, seed=0)
    on_time = CarbonForecast(replay(), sigma=0.1, seed=0)
    assert late.points("GB", T0 + 600.0) == on_time.points("GB", T0 - 600.0)  # hour 0 not yet published
    assert late.points("GB", T0 + 1200.0) == on_time.points("GB", T0 + 1200.0)
    quiet = CarbonForecast(replay(outages=(ProviderOutage("GB", T0 + 2 * H, T0 + 8 * H),)), sigma=0.1, seed=0)
    frozen = quiet.points("GB", T0 + 2 * H + 1.0)
    # the issue of the last hour published before the outage began (hour 2 is published as it starts)
    assert quiet.points("GB", T0 + 7 * H) == frozen == on_time.points("GB", T0 + 2 * H - 1.0)
    assert quiet.points("GB", T0 + 8 * H) == on_time.points("GB", T0 + 8 * H)
    assert quiet.points("DE-LU", T0 + 7 * H) == on_time.points("DE-LU", T0 + 7 * H)


def test_before_any_publication_there_is_no_forecast() -> None:
    assert CarbonForecast(replay()).points("GB", datetime(2022, 12, 1, tzinfo=UTC).timestamp()) == ()


def test_rejects_a_negative_error() -> None:
    with pytest.raises(ValueError, match="forecast error"):
        CarbonForecast(replay(), sigma=-0.1)
