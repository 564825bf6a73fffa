"""CSV replay: the shipped Electricity Maps files served as a live feed, at real time or faster."""

from __future__ import annotations

import itertools
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


# --- leap years: the same calendar date and hour replays, never a day off -------------------

def at(year: int, month: int, day: int, hour: int, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def dated_file(directory, zone: str, year: int) -> None:
    """One row per hour of ``year``; the value encodes the row's date: month x 100 + day +
    hour / 100 (10:00 on 1 March -> 301.10)."""
    lines = ["Datetime (UTC),Country,Zone name,Zone id,Carbon Intensity gCO₂eq/kWh (direct),"
             "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
             "Data Estimated,Data Estimation Method"]
    t = at(year, 1, 1, 0)
    while datetime.fromtimestamp(t, tz=UTC).year == year:
        d = datetime.fromtimestamp(t, tz=UTC)
        value = d.month * 100 + d.day + d.hour / 100
        lines.append(f"{d:%Y-%m-%d %H:%M:%S},X,X,{zone},{value:.2f},{value:.2f},0,0,test,false,")
        t += 3600.0
    (directory / f"{zone}_{year}_hourly.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    ("data_year", "now", "value", "observed_at"),
    [
        # 2024 (leap) data in 2026: 1 March is 1 March, not 29 February.
        (2024, at(2026, 3, 1, 10, 20), 301.10, at(2026, 3, 1, 10)),
        (2024, at(2026, 12, 31, 23, 30), 1231.23, at(2026, 12, 31, 23)),
        (2024, at(2026, 2, 28, 23, 59), 228.23, at(2026, 2, 28, 23)),
        # 2023 data in 2024 (leap): 29 February replays 28 February, 1 March is 1 March.
        (2023, at(2024, 2, 28, 12, 5), 228.12, at(2024, 2, 28, 12)),
        (2023, at(2024, 2, 29, 12, 5), 228.12, at(2024, 2, 29, 12)),
        (2023, at(2024, 3, 1, 0, 30), 301.00, at(2024, 3, 1, 0)),
        (2023, at(2024, 12, 31, 23, 0), 1231.23, at(2024, 12, 31, 23)),
    ],
    ids=["2024-in-2026-mar-1", "2024-in-2026-dec-31", "2024-in-2026-feb-28", "2023-in-2024-feb-28",
         "2023-in-2024-feb-29", "2023-in-2024-mar-1", "2023-in-2024-dec-31"],
)
async def test_replay_keeps_the_calendar_date_across_leap_years(tmp_path, data_year, now, value, observed_at):
    dated_file(tmp_path, "XX", data_year)
    (latest,) = await CsvReplayProvider(directory=tmp_path, clock=Clock(now)).latest("XX")
    assert (latest.value, latest.observed_at) == (pytest.approx(value), observed_at)
    offline = load_zone(zone_file(tmp_path, "XX"), "XX").replay(now)  # the offline reader agrees
    assert (offline.value, offline.observed_at) == (latest.value, latest.observed_at)


async def test_forecast_over_29_february_from_a_year_without_one(tmp_path):
    dated_file(tmp_path, "XX", 2023)
    forecast = await CsvReplayProvider(directory=tmp_path, clock=Clock(at(2024, 2, 28, 22, 10))).forecast("XX")
    assert [s.observed_at for s in forecast] == [at(2024, 2, 28, 23) + 3600.0 * h for h in range(24)]
    # 28 February 23:00, then 29 February replays 28 February's hours again.
    assert [s.value for s in forecast[:3]] == pytest.approx([228.23, 228.00, 228.01])
    assert forecast[-1].value == pytest.approx(228.22)


async def test_forecast_into_a_year_without_29_february_skips_it(tmp_path):
    dated_file(tmp_path, "XX", 2024)
    forecast = await CsvReplayProvider(directory=tmp_path, clock=Clock(at(2025, 2, 28, 23, 10))).forecast("XX")
    assert forecast[0].observed_at == at(2025, 3, 1, 0) and forecast[0].value == pytest.approx(301.00)
    assert all(s.observed_at - r.observed_at == 3600.0 for r, s in itertools.pairwise(forecast))
