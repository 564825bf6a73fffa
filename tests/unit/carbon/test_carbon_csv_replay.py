"""CSV replay: the shipped Electricity Maps files served as a live feed, at real time or faster."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.datalayer.carbon.csv_replay import CsvReplayProvider
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, load_zone, zone_file

T0 = datetime(2026, 3, 3, 10, 20, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def test_real_time_matches_the_series_replay():
    clock = Clock(T0)
    provider = CsvReplayProvider(clock=clock)
    (latest,) = await provider.latest("DE-LU")
    expected = load_zone(zone_file(SHIPPED_CARBON_DIR, "DE-LU"), "DE-LU").replay(T0)
    assert (latest.value, latest.observed_at) == (expected.value, expected.observed_at)
    assert latest.observed_at == datetime(2026, 3, 3, 10, 0, tzinfo=UTC).timestamp()
    assert T0 - latest.observed_at == 20 * 60  # true age: the hour started 20 minutes ago


async def test_forecast_is_the_next_24_hours():
    provider = CsvReplayProvider(clock=Clock(T0))
    fetched = await provider.fetch("GB")
    assert fetched.failures == () and len(fetched.forecast) == 24
    assert [s.observed_at - fetched.latest[0].observed_at for s in fetched.forecast[:2]] == [3600.0, 7200.0]
    assert all(s.is_forecast and "next hours" in s.source for s in fetched.forecast)


async def test_accelerated_replay_moves_an_hour_per_wall_minute():
    clock = Clock(T0)
    provider = CsvReplayProvider(clock=clock, speed=60.0)
    (first,) = await provider.latest("GB")
    clock.t += 60.0  # one wall minute = one data hour
    (second,) = await provider.latest("GB")
    series = load_zone(zone_file(SHIPPED_CARBON_DIR, "GB"), "GB")
    assert second.value == series.replay(T0 + 3600.0).value
    assert 0.0 <= clock.t - second.observed_at <= 60.0  # ages scale with the speed too
    assert second.observed_at - first.observed_at == pytest.approx(60.0)
    assert "x60" in second.source


async def test_unknown_zone_is_a_failure():
    fetched = await CsvReplayProvider(clock=Clock(T0)).fetch("XX-NOWHERE")
    assert fetched.latest == () and {f.reason for f in fetched.failures} == {"unknown_zone"}


def test_speed_must_be_positive():
    with pytest.raises(ValueError, match="speed"):
        CsvReplayProvider(speed=0.0)
