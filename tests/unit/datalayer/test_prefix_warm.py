"""The region's prefix-cache hits reach the router's snapshot through the store, with their
age: a hit older than the policy's max_age.prefix_cache is dropped, and the router keeps where
each workflow last ran (docs/affinity.md)."""

from __future__ import annotations

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.region.prefix_publisher import PrefixWarmPublisher
from scheduler.state import keys, prefix_warm
from scheduler.state.memory_store import MemoryStore
from scheduler.types import Request
from tests.literals import NOW, pool, region

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


async def test_published_hits_reach_the_snapshot_and_age_out(default_policy) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    store = MemoryStore(namespace="t")
    regions = (region("north", pools=[pool("h200", "H200-141GB"), pool("a100", "A100-80GB")]), region("west"))
    refresher = SnapshotRefresher(SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy)), store, clock=clock)
    hits = prefix_warm.PrefixHits(max_keys=2)
    publisher = PrefixWarmPublisher("north", hits, store, clock=clock)
    hits.record("a100", "auto:sys", 0, clock.now)  # a miss: nothing warm
    hits.record("a100", "auto:sys", None, clock.now)
    assert not await publisher.publish_once()
    hits.record("a100", "auto:sys", 384, clock.now)
    hits.record("h200", "auto:sys", 128, clock.now - 1)
    for key in ("k1", "k2", "k3"):  # bounded: the oldest of a pool's keys goes
        hits.record("h200", key, 16, clock.now)
    assert await publisher.publish_once()
    snapshot = await refresher.refresh()
    assert {(w.place, w.cached_tokens) for w in snapshot.prefix_warm["auto:sys"]} == {("north/a100", 384)}
    assert set(snapshot.prefix_warm) == {"auto:sys", "k2", "k3"}
    clock.now += default_policy.max_age.prefix_cache + 1
    assert (await refresher.refresh()).prefix_warm == {}


async def test_a_malformed_record_is_ignored_and_a_foreign_one_refused(default_policy) -> None:  # type: ignore[no-untyped-def]
    store = MemoryStore(namespace="t")
    refresher = SnapshotRefresher(SnapshotBuilder(compile_fleet((region("north"),)),
                                                  compile_policy(default_policy)), store, clock=lambda: NOW)
    await store.set(keys.prefix_warm("north"), b"{not json")
    assert (await refresher.refresh()).prefix_warm == {}
    await store.set(keys.prefix_warm("north"), prefix_warm.encode("west", NOW, {"h100": {"k": (64, NOW)}}))
    assert (await refresher.refresh()).prefix_warm == {}
    await store.set(keys.prefix_warm("north"), prefix_warm.encode("north", NOW, {"h100": {"k": (64, NOW)}}))
    assert [w.place for w in (await refresher.refresh()).prefix_warm["k"]] == ["north/h100"]


async def test_the_router_keeps_where_each_workflow_last_ran(default_policy) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    refresher = SnapshotRefresher(SnapshotBuilder(compile_fleet((region("north"), region("west"))),
                                                  compile_policy(default_policy)),
                                  MemoryStore(namespace="t"), clock=clock)
    snapshot = await refresher.refresh()
    west = next(c for c in snapshot.candidates if c.region.name == "west")
    refresher.record_dispatch(snapshot, west, Request("r1", "llama-3.1-8b", 900, 16, workflow_id="agent-7"))
    refresher.record_dispatch(snapshot, west, Request("r2", "llama-3.1-8b", 900, 16))
    home = (await refresher.refresh()).workflows["agent-7"]
    assert (home.place, home.cached_tokens, home.source) == ("west/h100", 900, "workflow")
    clock.now += default_policy.max_age.prefix_cache + 1
    assert (await refresher.refresh()).workflows == {}
