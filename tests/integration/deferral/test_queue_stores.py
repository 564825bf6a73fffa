"""The deferral queue's atomic operations answer alike on Redis (Lua scripts) and the
in-process store (the same steps over its verbs); on Redis every key the queue writes has a
TTL within its bound, and the release loop sends Redis no SCAN or KEYS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from scheduler.deferral.queue import (
    DONE,
    HELD,
    RUNNING,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    OverCap,
    Submitted,
    sizes_key,
)
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.state.store import StateStore
from tests.faults.redis_server import PrivateRedis

pytestmark = pytest.mark.timeout(60)

REDIS_URL = "redis://127.0.0.1:6379/1"
T0 = 1_700_000_000.0
# Clock seconds per real second on Redis, whose TTLs count real time: an hour passes in a second.
SPEED = 3600.0
CLAIM_TTL_S, RESULT_TTL_S, GRACE_S = 60.0, 1800.0, 900.0


@dataclass
class Clock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


@dataclass
class Subject:
    store: StateStore
    queue: DeferralQueue
    clock: Clock
    # Let ``seconds`` of the clock pass (on Redis, also seconds / SPEED of real time).
    advance: Callable[[float], Awaitable[None]]


def queue_on(store: StateStore, clock: Clock, speed: float, **caps: int) -> DeferralQueue:
    return DeferralQueue(store, claim_ttl_s=CLAIM_TTL_S, result_ttl_s=RESULT_TTL_S, grace_s=GRACE_S,
                         max_deferral_s=86400.0, clock=clock, speed=speed, **caps)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    clock = Clock()
    if request.param == "memory":
        async def advance_clock(seconds: float) -> None:
            clock.t += seconds

        store: StateStore = MemoryStore(namespace="test", clock=clock)
        yield Subject(store, queue_on(store, clock, 1.0, max_held=3, max_bytes=6000), clock, advance_clock)
        return
    namespace = f"test-deferral-stores-{uuid.uuid4().hex[:12]}"
    redis_store = RedisStore.from_url(REDIS_URL, namespace)

    async def advance_both(seconds: float) -> None:
        clock.t += seconds
        await asyncio.sleep(seconds / SPEED)

    try:
        yield Subject(redis_store, queue_on(redis_store, clock, SPEED, max_held=3, max_bytes=6000), clock,
                      advance_both)
    finally:
        await redis_store.close()
        await delete_namespace(REDIS_URL, namespace)


def item(request_id: str, tenant: str = "acme", release_in: float = 0.0, deadline_in: float = 3600.0,
         payload: bytes = b"prompt") -> HeldRequest:
    return HeldRequest(request_id, tenant, T0, T0 + deadline_in, T0 + release_in, "window", "held",
                       payload=payload)


async def test_holds_claims_answers_and_caps_agree(subject: Subject) -> None:
    queue = subject.queue
    assert await queue.submit(item("r1"), b"ack 1") == Submitted(b"ack 1")
    assert await queue.submit(item("r1", payload=b"again"), b"ack 2") == Submitted(b"ack 1")
    assert await queue.submit(item("r1", tenant="globex"), b"theirs") == Submitted(b"theirs")
    await queue.submit(item("r2", release_in=600.0), b"ack")
    await queue.submit(item("r3", release_in=60.0), b"ack")
    full = await queue.submit(item("r4"), b"ack")
    assert isinstance(full, OverCap) and (full.cap, full.held, full.limit) == ("max_held", 3, 3)
    big = await queue.submit(item("big", tenant="globex", payload=b"x" * 6000), b"ack")
    assert isinstance(big, OverCap) and big.cap == "max_bytes" and big.held == 1
    assert await queue.due_tenants(10) == ["acme", "globex"]

    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None and (claimed.request_id, claimed.payload) == ("r1", b"prompt")
    assert await queue.status("acme", "r1") == RUNNING and await queue.claim("acme", "router-b") is None
    assert await queue.finish(claimed, b"answer")
    assert await queue.status("acme", "r1") == DONE and (await queue.usage("acme"))[0] == 2
    assert await queue.status("globex", "r1") == HELD

    await subject.advance(CLAIM_TTL_S + 1.0)  # r3 is due; a lease taken now lapses unrenewed
    lapsed = await queue.claim("acme", "router-a")
    assert lapsed is not None and lapsed.request_id == "r3"
    await subject.advance(CLAIM_TTL_S + 1.0)
    again = await queue.claim("acme", "router-b")
    assert again is not None and again.request_id == "r3" and not await queue.renew(lapsed, "router-a")
    assert await queue.cancel("acme", "r3", b"cancelled") == "running"
    assert not await queue.finish(again, b"late")
    assert await queue.answer("acme", "r3") == b"cancelled"

    await subject.advance(RESULT_TTL_S)  # the answers and the cancellation expire
    assert await queue.answer("acme", "r1") is None and await queue.answer("acme", "r3") is None
    assert await queue.submit(item("r5", release_in=3 * 3600.0, deadline_in=4 * 3600.0), b"ack") == Submitted(b"ack")
    # Only r2 and r5 are kept now: the expired answers left the counts as well.
    assert await queue.usage("acme") == (2, await kept_bytes(subject, "r2", "r5"))
    assert [i.request_id for i in await queue.held("acme")] == ["r2", "r5"]
    assert await queue.purge_tenant("globex") == 1 and await queue.tenants() == ["acme"]

    # Past r2's deadline and grace with no router: its hold lapses and a claim drops it.
    await subject.advance(3600.0 + GRACE_S)
    assert await queue.claim("acme", "router-a") is None
    assert await queue.usage("acme") == (1, await kept_bytes(subject, "r5"))


async def kept_bytes(subject: Subject, *request_ids: str) -> int:
    """What acme's ``request_ids`` keep in the store, as its sizes index has them."""
    sizes = [await subject.store.zscore(sizes_key("acme"), request_id) for request_id in request_ids]
    assert None not in sizes
    return int(sum(s for s in sizes if s is not None))


@pytest.mark.integration
async def test_every_key_the_queue_writes_on_redis_has_a_ttl_within_its_bound() -> None:
    namespace = f"test-deferral-ttl-{uuid.uuid4().hex[:12]}"
    store = RedisStore.from_url(REDIS_URL, namespace)
    clock = Clock()
    queue = queue_on(store, clock, 1.0)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        for k in range(4):
            await queue.submit(item(f"r{k}", deadline_in=3600.0 * (k + 1)), b"ack")
        await queue.submit(item("g", tenant="globex"), b"ack")
        running = await queue.claim("acme", "router-a")
        answered = await queue.claim("acme", "router-a")
        assert running is not None and answered is not None and await queue.finish(answered, b"answer")
        assert await queue.cancel("acme", "r3", b"cancelled") == "held"
        index_s = 86400.0 + GRACE_S
        bounds = {  # the longest each kind may live, s
            "deferred": 4 * 3600.0 + GRACE_S, "deferred_payload": 4 * 3600.0 + GRACE_S,
            "deferred_submission": 4 * 3600.0 + GRACE_S, "deferred_claim": CLAIM_TTL_S,
            "deferred_result": RESULT_TTL_S, "deferred_due": index_s, "deferred_kept": index_s,
            "deferred_sizes": index_s, "deferred_tenants": index_s, "deferred_bytes": index_s,
        }
        found = [key.decode() async for key in client.scan_iter(match=f"sched:{namespace}:*")]
        kinds = set()
        for key in found:
            kind = key.split(":")[2]
            kinds.add(kind)
            ttl_ms = await client.pttl(key)
            assert 0 < ttl_ms <= bounds[kind] * 1000 + 1000, (key, ttl_ms)
        assert kinds == set(bounds), kinds ^ set(bounds)  # every kind was written, and checked
    finally:
        await client.aclose()
        await store.close()
        await delete_namespace(REDIS_URL, namespace)


@pytest.mark.integration
async def test_the_release_loop_sends_redis_no_scan(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path).start()
    store = RedisStore.from_url(server.url, "noscan")
    client = aioredis.Redis.from_url(server.url)
    try:
        clock = Clock()
        queue = DeferralQueue(store, max_held=5000, clock=clock)
        for k in range(300):
            await queue.submit(item(f"r{k}", tenant=f"tenant-{k % 7}", release_in=-k), b"ack")
        await client.config_resetstat()

        async def run(held: HeldRequest) -> bytes:
            return b"answer"

        worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", max_running=16)
        assert await worker.tick() == 300
        stats = await client.info("commandstats")
        assert stats, "no command statistics: the check would prove nothing"
        assert "cmdstat_evalsha" in stats and not {"cmdstat_scan", "cmdstat_keys"} & set(stats), sorted(stats)
    finally:
        await client.aclose()
        await store.close()
        server.kill()
