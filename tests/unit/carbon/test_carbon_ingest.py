"""Validation at ingest and the router's per-zone usability gauges: a fetched value that
``scheduler.signal_check`` calls unusable is never stored (the last good one stays and ages),
is counted, and is logged once per run; the router's metrics say per zone whether its signal is
usable now and why not. Runs the real CSV replay provider on the embedded ``MemoryStore``."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from unittest.mock import MagicMock

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.csv_replay import CsvReplayProvider
from scheduler.datalayer.carbon.metrics import Counters, signal_gauges
from scheduler.datalayer.carbon.store_io import read_forecast, read_signal
from scheduler.datalayer.carbon.zone_poller import RETRY_FAILED_S, ZonePoller
from scheduler.server.app import router_gauges
from scheduler.signal_check import CLOCK_SKEW_S
from scheduler.state.memory_store import MemoryStore
from scheduler.types import FleetSnapshot, Signal

H0 = datetime(2026, 5, 1, 10, tzinfo=UTC).timestamp()
HEADER = ("Datetime (UTC),Country,Zone name,Zone id,Carbon Intensity gCO₂eq/kWh (direct),"
          "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
          "Data Estimated,Data Estimation Method")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def csv_file(directory, values: list[str]) -> None:
    """Hourly rows from H0 with the given LCA values (as written in the file)."""
    lines = [HEADER]
    for h, raw in enumerate(values):
        stamp = datetime.fromtimestamp(H0 + 3600 * h, tz=UTC)
        lines.append(f"{stamp:%Y-%m-%d %H:%M:%S},X,X,XX,{raw},{raw},0,0,test,false,")
    (directory / "XX_2026_hourly.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


async def test_unusable_values_are_not_stored_counted_and_logged_once(tmp_path, caplog):
    csv_file(tmp_path, ["300", "nan", "-5", "2500", "310", "320"])
    clock, store, counters = Clock(H0 + 600), MemoryStore(), Counters()
    provider = CsvReplayProvider(directory=tmp_path, clock=clock)
    poller = ZonePoller(provider, "XX", 300.0, store, "a", counters, clock=clock)
    poller.held = True

    assert await poller.poll_once()
    good = await read_signal(store, "XX")
    assert good is not None and good.value == 300.0
    # The forecast's unusable points (NaN, negative, beyond 2000 g/kWh) are dropped and counted.
    assert [s.value for s in await read_forecast(store, "XX")] == [310.0, 320.0]
    assert counters.value(metrics.REJECTED, zone="XX", part="forecast", reason="invalid") == 3

    with caplog.at_level(logging.WARNING):
        for hour in (1, 1, 2, 3):  # NaN (twice), negative, beyond the bounds
            clock.t = H0 + 3600 * hour + 600
            assert not await poller.poll_once()
            assert poller.next_poll_in_s(False) == RETRY_FAILED_S  # the main signal failed: retry soon
            assert await read_signal(store, "XX") == good  # the last good one stays, and ages
    assert counters.value(metrics.REJECTED, zone="XX", part="latest", reason="invalid") == 4
    rejections = [r.getMessage() for r in caplog.records if "latest carbon_intensity rejected" in r.getMessage()]
    assert len(rejections) == 1 and "not a finite number" in rejections[0], rejections
    assert "the last good one stays and ages" in rejections[0]

    clock.t = H0 + 4 * 3600 + 600
    assert await poller.poll_once()
    stored = await read_signal(store, "XX")
    assert stored is not None and (stored.value, stored.observed_at) == (310.0, H0 + 4 * 3600)


async def test_a_value_dated_in_the_future_is_rejected(tmp_path, caplog):
    csv_file(tmp_path, ["300", "310"])
    # The provider's clock runs an hour ahead of the poller's: its value is dated in the future.
    store, counters = MemoryStore(), Counters()
    provider = CsvReplayProvider(directory=tmp_path, clock=Clock(H0 + 3600 + 60))
    poller = ZonePoller(provider, "XX", 300.0, store, "a", counters, clock=Clock(H0 + 3600 - CLOCK_SKEW_S - 1))
    poller.held = True
    with caplog.at_level(logging.WARNING):
        assert not await poller.poll_once()
    assert await read_signal(store, "XX") is None
    assert counters.value(metrics.REJECTED, zone="XX", part="latest", reason="future") == 1
    assert "in the future" in caplog.text
    # Within the clock-skew tolerance it is accepted.
    poller.clock = Clock(H0 + 3600 - CLOCK_SKEW_S + 1)
    assert await poller.poll_once()


def signal(zone: str, value: float, observed_at: float) -> Signal:
    return Signal("carbon_intensity", zone, value, "gCO2eq/kWh", observed_at, observed_at, "test")


def test_router_gauges_say_per_zone_whether_the_signal_is_usable_and_why_not():
    fleet = load_fleet()
    policy = fleet.policy("default")
    regions = tuple(r for r in fleet.regions if r.grid_zone in ("JP-TK", "SG", "DE-LU", "NO", "GB"))
    now = H0
    carbon = {
        "JP-TK": signal("JP-TK", 450.0, now - 600),  # fresh
        "SG": signal("SG", 400.0, now - policy.max_age.carbon - 1),  # stale
        "DE-LU": signal("DE-LU", 300.0, now + 3600),  # dated in the future
        "NO": signal("NO", math.nan, now - 600),  # not a number
        # GB: missing
    }
    snapshot = FleetSnapshot(now=now, policy=compile_policy(policy), fleet=compile_fleet(regions), perf=(), carbon=carbon)
    # The router's other dependencies play no part here: a mock stands in for them.
    deps = MagicMock(active_streams=0, gauges=[])
    deps.refresher.current.return_value = snapshot
    samples = router_gauges(deps)
    usable = {labels["zone"]: v for name, labels, v in samples if name == metrics.SIGNAL_USABLE}
    problems = {labels["zone"]: labels["problem"] for name, labels, v in samples
                if name == metrics.SIGNAL_PROBLEM and v == 1.0}
    assert usable == {"JP-TK": 1.0, "SG": 0.0, "DE-LU": 0.0, "NO": 0.0, "GB": 0.0}
    assert problems == {"SG": "stale", "DE-LU": "future", "NO": "invalid", "GB": "missing"}
    assert all(s in samples for s in signal_gauges(snapshot))


@pytest.mark.parametrize("max_age_s", [600.0, 599.0])
def test_usable_gauge_uses_the_policys_max_age(max_age_s):
    fleet = load_fleet()
    base = fleet.policy("default")
    policy = base.model_copy(update={"max_age": base.max_age.model_copy(update={"carbon": max_age_s})})
    region = next(r for r in fleet.regions if r.grid_zone == "GB")
    snapshot = FleetSnapshot(now=H0, policy=compile_policy(policy), fleet=compile_fleet((region,)), perf=(),
                             carbon={"GB": signal("GB", 200.0, H0 - 600.0)})
    assert (metrics.SIGNAL_USABLE, {"zone": "GB"}, float(max_age_s >= 600.0)) in signal_gauges(snapshot)
