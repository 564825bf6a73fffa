"""The zone poller and ``CarbonPollers`` on the embedded ``MemoryStore`` with the CSV replay
provider (the real embedded defaults); the Redis and multi-process cases are in
tests/integration/carbon."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import replace

import pytest

from scheduler.config.loader import load_fleet
from scheduler.config.schema import CarbonSource
from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
from scheduler.datalayer.carbon.csv_replay import CsvReplayProvider
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.store_io import read_carbon, read_forecast, read_signal, write_signal
from scheduler.datalayer.carbon.zone_poller import LockTiming, ZonePoller
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.state.memory_store import MemoryStore

FAST = LockTiming(ttl_s=0.6, contend_s=0.05)


async def wait_for(condition, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def poller(store, provider=None, owner="a", counters=None, interval_s=300.0) -> ZonePoller:
    return ZonePoller(provider or CsvReplayProvider(), "GB", interval_s, store, owner,
                      counters or Counters(), lock=FAST)


async def test_the_holder_polls_and_writes_latest_and_forecast():
    store, counters = MemoryStore(), Counters()
    p = poller(store, counters=counters)
    task = asyncio.create_task(p.run())
    await wait_for(lambda: counters.value(metrics.WRITES, kind="forecast") == 1)
    signal = await read_signal(store, "GB")
    forecast = await read_forecast(store, "GB")
    assert p.held and signal is not None and signal.source == "csv:GB_2023_hourly.csv"
    assert len(forecast) == 24 and all(s.is_forecast for s in forecast)
    assert counters.value(metrics.POLLS, provider="csv", zone="GB") == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not p.held and await store.get("lock:carbon:csv:GB") is None  # released on the way out


async def test_only_one_of_two_pollers_polls_and_stopping_hands_over():
    store, first_counts, second_counts = MemoryStore(), Counters(), Counters()
    first = poller(store, owner="router-1", counters=first_counts)
    second = poller(store, owner="router-2", counters=second_counts)
    t1 = asyncio.create_task(first.run())
    await wait_for(lambda: first.held)
    t2 = asyncio.create_task(second.run())
    await asyncio.sleep(0.4)
    assert first.held and not second.held
    assert first_counts.value(metrics.POLLS) == 1 and second_counts.value(metrics.POLLS) == 0
    t1.cancel()
    await asyncio.gather(t1, return_exceptions=True)
    await wait_for(lambda: second.held, timeout_s=1.0)
    # The new holder sees the signal fetched moments ago and does not poll it again now.
    await asyncio.sleep(0.2)
    assert second_counts.value(metrics.POLLS) == 0
    t2.cancel()
    await asyncio.gather(t2, return_exceptions=True)


async def test_a_failed_poll_keeps_the_old_signal_and_says_why(tmp_path, caplog):
    shutil.copy(SHIPPED_CARBON_DIR / "GB_2023_hourly.csv", tmp_path)
    store, counters = MemoryStore(), Counters()
    good = poller(store, CsvReplayProvider(directory=tmp_path), counters=counters)
    good.held = True
    assert await good.poll_once()
    before = await read_signal(store, "GB")

    broken = poller(store, CsvReplayProvider(directory=tmp_path / "gone"), counters=counters)
    broken.held = True
    with caplog.at_level(logging.WARNING):
        assert not await broken.poll_once()
    after = await read_signal(store, "GB")
    assert after == before  # same value, same observed_at: it ages in the open
    assert counters.value(metrics.FAILURES, provider="csv", zone="GB", reason="unknown_zone") == 2
    assert "unknown_zone" in caplog.text and "the stored signal stays as observed at" in caplog.text


async def test_an_answer_older_than_the_stored_signal_is_not_written(caplog):
    store = MemoryStore()
    p = poller(store)
    p.held = True
    (current,) = await p.provider.latest("GB")  # type: ignore[attr-defined]
    newer = replace(current, observed_at=current.observed_at + 7200.0, value=1.0)
    await write_signal(store, newer)
    with caplog.at_level(logging.WARNING):
        await p.poll_once()
    assert await read_signal(store, "GB") == newer
    assert "older than the stored" in caplog.text


async def test_a_poller_that_lost_the_lock_does_not_write():
    store = MemoryStore()
    p = poller(store)
    p.held = False
    assert not await p.poll_once()
    assert await read_signal(store, "GB") is None


def regions_with(*sources):
    regions = load_fleet().regions
    return [r.model_copy(update={"carbon": src}) for r, src in zip(regions, sources, strict=False)]


async def test_from_regions_makes_one_poller_per_provider_and_zone_at_the_shortest_interval():
    regions = regions_with(
        CarbonSource(provider="csv", zone="GB", poll_interval_s=600.0),
        CarbonSource(provider="csv", zone="GB", poll_interval_s=120.0),
        CarbonSource(provider="csv", zone="DE-LU", poll_interval_s=300.0),
        CarbonSource(provider="ukci", zone="GB", poll_interval_s=900.0),
    )
    pollers = CarbonPollers.from_regions(regions, MemoryStore(), lock=FAST)
    assert sorted((p.lock_name, p.interval_s) for p in pollers.pollers) == [
        ("carbon:csv:DE-LU", 300.0), ("carbon:csv:GB", 120.0), ("carbon:ukci:GB", 900.0)]
    assert {p.provider.name for p in pollers.pollers} == {"csv", "ukci"}
    await pollers.stop()


async def test_pollers_start_stop_and_the_snapshot_reader():
    fleet = load_fleet()
    regions = fleet.regions[:3]
    store = MemoryStore()
    pollers = CarbonPollers.from_regions(regions, store, lock=FAST)
    await pollers.start()
    await wait_for(lambda: pollers.counters.value(metrics.WRITES, kind="carbon_intensity") == len(regions))
    assert sorted(pollers.holding()) == sorted(f"carbon:csv:{r.carbon.zone}" for r in regions)
    carbon = await read_carbon(store, regions)
    assert set(carbon) == {r.grid_zone for r in regions}
    await pollers.stop()
    assert pollers.holding() == []


@pytest.mark.parametrize("name", ["carbon_provider_failures_total"])
def test_counters(name):
    c = Counters()
    c.inc(name, {"provider": "ukci", "zone": "GB", "reason": "timeout"})
    c.inc(name, {"provider": "ukci", "zone": "GB", "reason": "timeout"})
    c.inc(name, {"provider": "ukci", "zone": "GB", "reason": "auth"})
    assert c.value(name, reason="timeout") == 2 and c.value(name) == 3 and c.value(name, zone="DE") == 0
    assert f'{name}{{provider="ukci",reason="auth",zone="GB"}} 1' in c.exposition()
