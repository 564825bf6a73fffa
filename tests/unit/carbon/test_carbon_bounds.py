"""The bound a zone's candidates are priced at while its signal is unusable: the zone's daily
maxima in the store (written by the poller that holds its lock, read by the refresher), and
the same from the carbon CSVs for one-shot tools (docs/objective.md, "Safe fallback")."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.carbon.base import KIND
from scheduler.datalayer.carbon.csv_replay import CsvReplayProvider
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.store_io import (
    DAILY_MAX_DAYS,
    DAY_S,
    FORECAST_TTL_S,
    decode_daily_max,
    merge_daily_max,
    read_signal,
    record_daily_max,
    window_max,
)
from scheduler.datalayer.carbon.zone_poller import LockTiming, ZonePoller
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, load_zone, zone_file
from scheduler.datalayer.offline import csv_carbon_bounds
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.state import codec, keys
from scheduler.state.memory_store import MemoryStore
from scheduler.types import Signal

DAY0 = 1_780_012_800.0  # a UTC midnight (2026-05-29)


def signal(value: float, observed_at: float, zone: str = "GB") -> Signal:
    return Signal("carbon_intensity", zone, value, "gCO2eq/kWh", observed_at, observed_at, "test")


def test_daily_maxima_keep_each_days_highest_and_only_the_last_weeks() -> None:
    days: list[tuple[float, float]] = []
    for hour, value in [(1, 200.0), (5, 350.0), (23, 120.0), (25, 90.0)]:
        days = merge_daily_max(days, signal(value, DAY0 + hour * 3600))
    assert days == [(DAY0, 350.0), (DAY0 + DAY_S, 90.0)]
    # A value 20 days later: the record keeps the last DAILY_MAX_DAYS days only.
    days = merge_daily_max(days, signal(400.0, DAY0 + 20 * DAY_S))
    assert days == [(DAY0 + 20 * DAY_S, 400.0)]
    assert len(merge_daily_max([(DAY0 + d * DAY_S, 1.0) for d in range(40)], signal(2.0, DAY0 + 40 * DAY_S))) \
        == DAILY_MAX_DAYS


@pytest.mark.parametrize(("now_h", "window_h", "expected"), [
    (30, 7 * 24, 350.0),  # both days in the window
    (30, 2, 90.0),  # only day 1 overlaps the last two hours
    (24 * 30, 24, None),  # nothing in the window
    (-5, 24, None),  # a day that starts after now is never counted
])
def test_window_max_takes_the_days_that_overlap_the_window(now_h: float, window_h: float, expected: float | None) -> None:
    days = [(DAY0, 350.0), (DAY0 + DAY_S, 90.0)]
    assert window_max(days, DAY0 + now_h * 3600, window_h * 3600) == expected


def test_a_malformed_record_is_no_record(caplog: pytest.LogCaptureFixture) -> None:
    assert decode_daily_max(b'{"not": "a list"}', "signal_max:x") == []
    assert decode_daily_max(b"[[1, 2, 3]]", "signal_max:x") == []
    assert "treating the daily maxima as missing" in caplog.text


async def test_the_refresher_prices_a_stale_zone_at_its_recorded_maximum() -> None:
    fleet = load_fleet()
    builder = SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default")))
    store = MemoryStore()
    gb = next(r for r in fleet.regions if r.carbon.zone == "GB")
    now = DAY0 + 10 * DAY_S
    for day, value in [(2, 900.0), (5, 410.0), (9, 380.0)]:  # day 2 is outside the 7-day window
        await record_daily_max(store, signal(value, DAY0 + day * DAY_S + 3600))
    stale = signal(150.0, now - 5 * 3600)
    await store.set(keys.signal("carbon_intensity", "GB"), codec.encode_signal(stale))
    refresher = SnapshotRefresher(builder, store, clock=lambda: now)
    snapshot = await refresher.refresh()
    assert snapshot.carbon_bounds == {gb.grid_zone: 410.0}
    assert await read_signal(store, "GB") == stale


def test_csv_bounds_are_the_rows_of_the_window_before_the_feed_stopped() -> None:
    fleet = load_fleet()
    at = datetime(2023, 6, 1, 12, tzinfo=UTC).timestamp()
    week = 7 * DAY_S
    bounds = csv_carbon_bounds(fleet.regions, at, week)
    series = load_zone(zone_file(SHIPPED_CARBON_DIR, "GB"), "GB")
    rows = [v for t, v in zip(series.times, series.values, strict=True) if at - week < t <= at]
    gb = next(r for r in fleet.regions if r.carbon.zone == "GB")
    assert bounds[gb.grid_zone] == max(rows)
    # With the feed stopped 30 days earlier, the bound is the window before that.
    stopped = csv_carbon_bounds(fleet.regions, at, week, age_s=30 * DAY_S)
    earlier = [v for t, v in zip(series.times, series.values, strict=True) if at - 30 * DAY_S - week < t <= at - 30 * DAY_S]
    assert stopped[gb.grid_zone] == max(earlier)


async def test_the_poller_records_what_it_accepts_with_a_ttl() -> None:
    written: dict[str, float | None] = {}

    class RecordingStore(MemoryStore):
        async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
            written[key] = ttl_s
            await super().set(key, value, ttl_s)

    store = RecordingStore()
    poller = ZonePoller(CsvReplayProvider(), "GB", 300.0, store, "a", Counters(),
                        lock=LockTiming(ttl_s=0.6, contend_s=0.05))
    task = asyncio.create_task(poller.run())
    key = keys.signal_daily_max(KIND, "GB")
    for _ in range(150):
        if key in written:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    latest = await read_signal(store, "GB")
    assert latest is not None
    days = decode_daily_max(await store.get(key), key)
    assert days == [(latest.observed_at // DAY_S * DAY_S, latest.value)]
    assert written[key] == DAILY_MAX_DAYS * DAY_S
    assert written[keys.forecast(KIND, "GB")] == FORECAST_TTL_S
