"""``SnapshotRefresher``: the background snapshot follows the store, ages in the open when the
store is down (routing then rests on the router's own probes), and remembers regions that were
seen and stopped."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.probes import RegionProbes
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import STATE_STORE, Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.health import region_verdict
from scheduler.region.publisher import RegionStatePublisher
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.state import codec, keys
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.types import PoolLiveState, RegionLiveState, Request, Signal

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
T0 = 1_780_000_000.0


@dataclass
class ManualClock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


def builder() -> SnapshotBuilder:
    fleet = load_fleet()
    return SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(fleet.policy("default")))


def carbon(zone: str, value: float, observed_at: float) -> Signal:
    return Signal("carbon_intensity", zone, value, "gCO2eq/kWh", observed_at, observed_at, "test")


async def publish_fleet(store: MemoryStore | RedisStore, b: SnapshotBuilder, now: float) -> None:
    for region in b.regions:
        await store.set(keys.signal("carbon_intensity", region.carbon.zone),
                        codec.encode_signal(carbon(region.carbon.zone, 100.0, now - 60)))
        state = RegionLiveState(region.name, True, now, {p.name: PoolLiveState(running=4) for p in region.pools})
        await store.set(keys.region_state(region.name), codec.encode_region_state(state), ttl_s=60)


async def test_snapshot_follows_the_store() -> None:
    clock, store, b = ManualClock(), MemoryStore(), builder()
    refresher = SnapshotRefresher(b, store, clock=clock)
    assert refresher.current().carbon == {}
    await publish_fleet(store, b, clock.t)
    snapshot = await refresher.refresh()
    assert snapshot is refresher.current()
    assert snapshot.now == T0
    assert set(snapshot.live) == {r.name for r in b.regions}
    assert {r.grid_zone for r in b.regions} <= set(snapshot.carbon)
    assert snapshot.carbon["NO"].value == 100.0
    assert snapshot.energy_routing_enabled
    assert all(p.live for p in snapshot.perf)

    await store.set(keys.FLAGS, json.dumps({"energy_routing": False, "updated_at": T0, "updated_by": "t"}).encode())
    assert not (await refresher.refresh()).energy_routing_enabled
    await store.delete(keys.FLAGS)
    assert (await refresher.refresh()).energy_routing_enabled


async def test_malformed_records_keep_the_last_good_value() -> None:
    clock, store, b = ManualClock(), MemoryStore(), builder()
    refresher = SnapshotRefresher(b, store, clock=clock)
    await publish_fleet(store, b, clock.t)
    await store.set(keys.FLAGS, b'{"energy_routing": false}')
    await refresher.refresh()
    await store.set(keys.signal("carbon_intensity", "NO"), b'{"kind": "carbon_intensity"}')
    await store.set(keys.region_state("eu-north"), b"not json")
    await store.set(keys.FLAGS, b'{"energy_routing": "maybe"}')
    snapshot = await refresher.refresh()
    assert snapshot.carbon["NO"].value == 100.0
    assert snapshot.live["eu-north"].healthy
    assert not snapshot.energy_routing_enabled


async def test_background_loop_applies_store_changes_within_a_second() -> None:
    store, b = MemoryStore(), builder()
    refresher = SnapshotRefresher(b, store, interval_s=0.2)
    await refresher.start()
    try:
        assert refresher.current().energy_routing_enabled
        await store.set(keys.FLAGS, b'{"energy_routing": false}')
        loop = asyncio.get_running_loop()
        start = loop.time()
        while refresher.current().energy_routing_enabled:
            assert loop.time() - start < 1.0, "kill switch not seen within 1 s"
            await asyncio.sleep(0.02)
    finally:
        await refresher.stop()
    assert refresher.status.refreshes >= 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
async def redis_store() -> AsyncIterator[RedisStore]:
    namespace = f"test-refresher-{uuid.uuid4().hex[:12]}"
    store = RedisStore.from_url(REDIS_URL, namespace)
    try:
        yield store
    finally:
        await store.close()
        raw = aioredis.Redis.from_url(REDIS_URL)
        found = [key async for key in raw.scan_iter(match=f"sched:{namespace}:*")]
        if found:
            await raw.delete(*found)
        await raw.aclose()


@pytest.mark.integration
async def test_redis_down_keeps_the_last_inputs_and_routes_on_the_routers_own_probes(
    redis_store: RedisStore,
) -> None:
    """A store outage is not a region outage: three hours without Redis, every input is stale,
    yet a region last known healthy whose probe answers still takes requests; one whose probe
    fails does not; and the decision says it runs without the store."""
    clock, b = ManualClock(), builder()
    async with StubRegion(StubRegionSettings(name="eu-north")) as alive:
        endpoints = {r.name: f"http://127.0.0.1:{_closed_port()}" for r in b.regions}
        endpoints["eu-north"] = alive.endpoint
        probes = RegionProbes(endpoints, clock=clock, timeout_s=1.0)
        refresher = SnapshotRefresher(b, redis_store, clock=clock, probes=probes)
        await publish_fleet(redis_store, b, clock.t)
        await refresher.refresh()
        scheduler = Scheduler.from_registry(default_scheduler_registry())
        request = Request(request_id="r1", model="llama-3.1-8b", prompt_tokens=500, max_tokens=200)
        assert scheduler.schedule(request, refresher.current()).fallbacks == ()

        down = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/1", redis_store.namespace)
        refresher.store = down
        try:
            clock.t += 3 * 3600  # three hours without Redis: past the 2 h carbon limit
            await probes.probe_all()
            snapshot = await refresher.refresh()
        finally:
            await down.close()
            await probes.stop()
    assert refresher.status.failures == 1 and refresher.status.last_error
    assert refresher.status.last_success_at == T0
    assert snapshot.now == T0 + 3 * 3600
    assert snapshot.store_outage_s == 3 * 3600
    assert snapshot.carbon["NO"].value == 100.0  # kept, not dropped ...
    assert snapshot.fresh_live("eu-north") is None  # ... but judged by its age
    assert not any(p.live for p in snapshot.perf)
    assert snapshot.age(snapshot.carbon["NO"].observed_at) > snapshot.policy.max_age.carbon
    assert snapshot.probes["eu-north"].ok and not snapshot.probes["us-east"].ok

    decision = scheduler.schedule(request, snapshot)
    print("\nafter 3 h without Redis: ranked", [c.key for c in decision.ranked_candidates],
          "fallbacks", [(f.signal, f.detail) for f in decision.fallbacks])
    assert decision.schedulable
    assert {c.region.name for c in decision.ranked_candidates} == {"eu-north"}
    assert [f.signal for f in decision.fallbacks][:1] == [STATE_STORE]
    assert "running without the state store for 10800 s" in decision.fallbacks[0].detail
    assert any(f.signal == "carbon" for f in decision.fallbacks)  # stale carbon abstains as before
    down_regions = {r.candidate.region.name for r in decision.rejected if r.plugin == "region-health"}
    assert "us-east" in down_regions and "eu-north" not in down_regions

    # Redis answers again, with the states of three hours ago: until a region publishes, its
    # probe still vouches for it (its publisher may be reconnecting, or the store may refuse
    # its writes), so the store's return is no fleet outage either.
    async with StubRegion(StubRegionSettings(name="eu-north")) as alive_again:
        probes.endpoints = {**endpoints, "eu-north": alive_again.endpoint}
        refresher.store = redis_store
        clock.t += 1
        await probes.probe_all()
        back = await refresher.refresh()
        assert refresher.status.recovered_at == clock.t and back.store_outage_s is None
        kept = scheduler.schedule(request, back)
        assert {c.region.name for c in kept.ranked_candidates} == {"eu-north"}, kept.rejected
        clock.t += back.policy.max_age.region_state + 1  # the window is over, still no state
        await probes.probe_all()
        still = scheduler.schedule(request, await refresher.refresh())
        assert {c.region.name for c in still.ranked_candidates} == {"eu-north"}, still.rejected
    # Its probe then fails: down.
    clock.t += 1
    await probes.probe_all()
    over = scheduler.schedule(request, await refresher.refresh())
    await probes.stop()
    assert not over.schedulable


async def test_region_seen_then_gone_is_down_after_a_router_restart() -> None:
    """A region published (its state and its last-seen record), stopped, and its state key
    expired; a router that starts afterwards judges it stale from the record, not "never seen,
    trusted", even inside its warm-up; a region with no record at all is trusted then."""
    clock, store, b = ManualClock(), MemoryStore(), builder()
    state = RegionLiveState("eu-north", True, clock.t, {p.name: PoolLiveState() for p in b.regions[0].pools})

    async def source() -> RegionLiveState:
        return state

    publisher = RegionStatePublisher("eu-north", source, store, ttl_s=60.0)
    await publisher.publish_once()
    assert await store.get(keys.region_seen("eu-north")) is not None
    clock.t += 600
    await store.delete(keys.region_state("eu-north"))  # as its TTL would have

    refresher = SnapshotRefresher(b, store, clock=clock)  # the restarted router
    snapshot = await refresher.refresh()
    assert "eu-north" not in snapshot.live
    assert snapshot.last_seen["eu-north"] == pytest.approx(T0, abs=0.01)
    verdict = region_verdict(snapshot, "eu-north")
    assert verdict is not None and "last seen 600.0 s ago" in verdict[0].format(*verdict[1])
    assert region_verdict(snapshot, "us-east") is None  # never seen, inside the 30 s warm-up
    clock.t += 31
    assert region_verdict(await refresher.refresh(), "us-east") is not None  # warm-up over
