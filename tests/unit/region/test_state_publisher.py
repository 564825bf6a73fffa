"""``RegionStatePublisher`` on the in-memory store."""

from __future__ import annotations

import asyncio

from scheduler.region.publisher import RegionStatePublisher
from scheduler.state import codec, keys
from scheduler.state.memory_store import MemoryStore
from scheduler.types import PoolLiveState, RegionLiveState


def state(observed_at: float, healthy: bool = True) -> RegionLiveState:
    pool = PoolLiveState(queue_depth=2, running=3, kv_cache_usage=0.25, prefix_cache_hit_rate=0.5)
    return RegionLiveState(region="eu-north", healthy=healthy, observed_at=observed_at, pools={"h100-chat": pool})


async def test_publishes_the_source_value_under_the_region_key() -> None:
    store = MemoryStore(namespace="t")

    async def source() -> RegionLiveState:
        return state(123.0)

    publisher = RegionStatePublisher(region="eu-north", source=source, store=store)
    assert await publisher.publish_once() == state(123.0)
    raw = await store.get(keys.region_state("eu-north"))
    assert raw is not None and codec.decode_region_state(raw) == state(123.0)
    assert publisher.published == 1


async def test_a_source_without_an_answer_publishes_nothing() -> None:
    store = MemoryStore(namespace="t")

    async def source() -> RegionLiveState | None:
        return None

    publisher = RegionStatePublisher(region="eu-north", source=source, store=store)
    assert await publisher.publish_once() is None
    assert await store.get(keys.region_state("eu-north")) is None


async def test_state_expires_after_its_ttl() -> None:
    now = [0.0]
    store = MemoryStore(namespace="t", clock=lambda: now[0])

    async def source() -> RegionLiveState:
        return state(1.0)

    await RegionStatePublisher(region="eu-north", source=source, store=store, ttl_s=60.0).publish_once()
    now[0] = 59.0
    assert await store.get(keys.region_state("eu-north")) is not None
    now[0] = 61.0
    assert await store.get(keys.region_state("eu-north")) is None


async def test_run_keeps_publishing_through_source_failures() -> None:
    store = MemoryStore(namespace="t")
    calls = [0]

    async def flaky() -> RegionLiveState:
        calls[0] += 1
        if calls[0] % 2:
            raise RuntimeError("engine hiccup")
        return state(float(calls[0]))

    publisher = RegionStatePublisher(region="eu-north", source=flaky, store=store, interval_s=0.01)
    task = asyncio.create_task(publisher.run())
    while publisher.published < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    raw = await store.get(keys.region_state("eu-north"))
    assert raw is not None and codec.decode_region_state(raw).observed_at % 2 == 0
    assert calls[0] >= 6
