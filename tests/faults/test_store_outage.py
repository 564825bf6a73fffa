"""A store outage is not a region outage.

A live router (real gRPC on port 0) over three stub regions (real HTTP servers) that publish
their live state to a private ``redis-server``; the test kills that Redis and keeps asking the
router to Route for more than 60 s. The router must keep answering on the regions' last known
state plus its own probes, say so in every decision (the ``state-store`` fallback) and in
``GetStatus``, and stop routing to a region that dies during the outage (its probe fails).

A second scenario restarts the router after a region stopped publishing and its state key
expired: the region's last-seen record (no TTL) makes it stale, so it is not routed to, even
inside the router's warm-up for never-seen regions.

Run alone, with the figures: ``.venv/bin/python -m pytest tests/faults/test_store_outage.py
-p no:cacheprovider -s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from scheduler.client import AsyncSchedulerClient
from scheduler.client.errors import SchedulerRpcError
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import STATE_STORE
from scheduler.region.publisher import RegionStatePublisher
from scheduler.server.app import RunningRouter, build_deps, start_router
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.state.redis_store import RedisStore
from scheduler.tasks import stop_task
from scheduler.types import PoolLiveState, RegionLiveState
from tests.faults.redis_server import PrivateRedis

pytestmark = pytest.mark.integration

REGIONS = ("eu-north", "eu-central", "us-east")
OUTAGE_S = 65.0  # Route keeps answering at least this long after Redis is killed
STOP_REGION_AT_S = 20.0  # into the outage, the region the router first chose dies


@dataclass
class Stack:
    stubs: dict[str, StubRegion]
    configs: tuple[RegionConfig, ...]
    publishers: dict[str, asyncio.Task[None]]
    region_store: RedisStore


def state_source(config: RegionConfig):  # type: ignore[no-untyped-def]
    async def source() -> RegionLiveState:
        return RegionLiveState(config.name, True, time.time(), {p.name: PoolLiveState() for p in config.pools})

    return source


@contextlib.asynccontextmanager
async def stack_on(redis_url: str, namespace: str, ttl_s: float = 60.0) -> AsyncIterator[Stack]:
    """Three stub regions, each publishing its live state (and last-seen record) every 0.5 s."""
    shipped = {r.name: r for r in load_fleet().regions}
    stubs = {name: await StubRegion(StubRegionSettings(name=name)).start() for name in REGIONS}
    configs = tuple(shipped[n].model_copy(update={"endpoint": stubs[n].endpoint}) for n in REGIONS)
    store = RedisStore.from_url(redis_url, namespace)
    publishers = {
        c.name: asyncio.create_task(RegionStatePublisher(c.name, state_source(c), store, interval_s=0.5,
                                                         ttl_s=ttl_s).run())
        for c in configs
    }
    try:
        yield Stack(stubs, configs, publishers, store)
    finally:
        for task in publishers.values():
            await stop_task(task)
        for stub in stubs.values():
            await stub.stop()
        await store.close()


async def router_on(redis_url: str, namespace: str, configs: Sequence[RegionConfig]) -> RunningRouter:
    store = RedisStore.from_url(redis_url, namespace)
    deps = build_deps(SnapshotBuilder(compile_fleet(tuple(configs)),
                                      compile_policy(load_fleet().policy("default"))), store, "redis",
                      rate_limit_rps=1000.0)
    return await start_router("127.0.0.1:0", deps)


async def until_all_live(router: RunningRouter, regions: Sequence[str], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(router.deps.refresher.current().fresh_live(r) is not None for r in regions):
        assert time.monotonic() < deadline, "the regions' live state never reached the router"
        await asyncio.sleep(0.1)


@dataclass
class Answer:
    at_s: float  # seconds after Redis was killed
    code: str  # OK or the client error's class
    ranked: tuple[str, ...] = ()  # regions, best first
    store_fallback: bool = False


@pytest.mark.timeout(150)
async def test_router_keeps_routing_through_a_store_outage(own_redis: PrivateRedis) -> None:
    namespace = f"test-store-outage-{uuid.uuid4().hex[:8]}"
    async with stack_on(own_redis.url, namespace) as stack:
        router = await router_on(own_redis.url, namespace, stack.configs)
        try:
            await until_all_live(router, REGIONS)
            async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
                before = await client.route("hi", model="llama-3.1-8b", max_tokens=8, jurisdictions=["EU"])
                assert before.ranked and STATE_STORE not in {f.signal for f in before.fallbacks}
                assert (await client.status()).state_reachable
                victim = before.ranked[0].region
                survivor = next(r for r in ("eu-north", "eu-central") if r != victim)

                own_redis.kill()
                killed = time.monotonic()
                answers: list[Answer] = []
                stopped_at: float | None = None
                while (now := time.monotonic() - killed) < OUTAGE_S:
                    if stopped_at is None and now >= STOP_REGION_AT_S:
                        await stack.stubs[victim].stop()
                        stopped_at = time.monotonic() - killed
                    try:
                        decision = await client.route("hi", model="llama-3.1-8b", max_tokens=8,
                                                      jurisdictions=["EU"], timeout_s=10)
                    except SchedulerRpcError as exc:
                        answers.append(Answer(now, type(exc).__name__))
                    else:
                        answers.append(Answer(now, "OK", tuple(c.region for c in decision.ranked),
                                              STATE_STORE in {f.signal for f in decision.fallbacks}))
                        last_decision = decision
                    await asyncio.sleep(0.5)
                status = await client.status()
                generation = client.generate("hi", model="llama-3.1-8b", max_tokens=4, jurisdictions=["EU"],
                                             timeout_s=20)
                text = await generation.text()
        finally:
            await router.stop(grace_s=0.5)

    assert stopped_at is not None
    codes: dict[str, int] = {}
    for answer in answers:
        codes[answer.code] = codes.get(answer.code, 0) + 1
    with_victim = [a.at_s for a in answers if victim in a.ranked]
    gone_after_s = next((a.at_s - stopped_at for a in answers if a.at_s >= stopped_at and victim not in a.ranked),
                        None)
    store_detail = next(f.detail for f in last_decision.fallbacks if f.signal == STATE_STORE)
    print(f"\nstore outage: {len(answers)} Route calls over {answers[-1].at_s:.1f} s after Redis was killed; "
          f"codes {codes}; with the state-store fallback: {sum(a.store_fallback for a in answers)}")
    print(f"first chosen {victim!r}, stopped {stopped_at:.1f} s into the outage; last ranked with it at "
          f"{max(with_victim):.1f} s; gone from the ranking {gone_after_s:.1f} s after its stop")
    print(f"GetStatus: state_reachable={status.state_reachable} healthy_regions={status.healthy_regions} "
          f"last_state_error={status.last_state_error!r}")
    print(f"last decision's fallback: {store_detail!r}; Generate during the outage: {text!r} "
          f"from {generation.receipt.region if generation.receipt else None}")

    # Route kept answering, the whole time, on the regions it could still reach.
    assert codes == {"OK": len(answers)}, codes
    assert answers[-1].at_s >= 60.0
    assert all(survivor in a.ranked for a in answers), "a region whose probe answers was dropped"
    # Every answer once the router noticed says it runs without the store.
    noticed = next(a.at_s for a in answers if a.store_fallback)
    assert all(a.store_fallback for a in answers if a.at_s >= noticed)
    assert "running without the state store for" in store_detail and "probes" in store_detail
    assert not status.state_reachable and status.last_state_error
    # The region that died during the outage is no longer routed to (its probe fails) ...
    assert gone_after_s is not None
    assert not any(victim in a.ranked for a in answers if a.at_s >= stopped_at + 15.0)
    # ... and a real stream still goes through, to the survivor.
    assert text and generation.receipt is not None and generation.receipt.region == survivor


@pytest.mark.timeout(60)
async def test_restarted_router_does_not_route_to_a_region_whose_state_expired(own_redis: PrivateRedis) -> None:
    namespace = f"test-seen-{uuid.uuid4().hex[:8]}"
    async with stack_on(own_redis.url, namespace, ttl_s=2.0) as stack:
        first = await router_on(own_redis.url, namespace, stack.configs)
        try:
            await until_all_live(first, REGIONS)
        finally:
            await first.stop(grace_s=0.5)
        # eu-north stops publishing (its gateway is gone) while no router runs; its state key expires.
        await stop_task(stack.publishers["eu-north"])
        await stack.stubs["eu-north"].stop()
        stopped = time.monotonic()
        deadline = time.monotonic() + 20
        while await stack.region_store.get("region:eu-north:state") is not None:
            assert time.monotonic() < deadline, "the state key did not expire"
            await asyncio.sleep(0.2)
        # (A short TTL so the test need not wait a minute; wait past max_age.region_state too,
        # as the production TTL of 60 s would.)
        await asyncio.sleep(max(0.0, stopped + 6.0 - time.monotonic()))
        restarted = await router_on(own_redis.url, namespace, stack.configs)
        try:
            await until_all_live(restarted, ("eu-central", "us-east"))
            snapshot = restarted.deps.refresher.current()
            assert "eu-north" not in snapshot.live and "eu-north" in snapshot.last_seen
            async with AsyncSchedulerClient(f"127.0.0.1:{restarted.port}") as client:
                decision = await client.route("hi", model="llama-3.1-8b", max_tokens=8, jurisdictions=["EU"])
        finally:
            await restarted.stop(grace_s=0.5)
    ranked = [c.region for c in decision.ranked]
    why = [r.reason for r in decision.rejected if r.region == "eu-north"]
    print(f"\nrestarted router, {snapshot.now - snapshot.live_since:.1f} s after its start (inside its "
          f"warm-up): ranked {ranked}; eu-north rejected: {why[:1]}")
    assert ranked and "eu-north" not in ranked
    assert any("last seen" in reason for reason in why), why
