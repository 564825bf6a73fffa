"""The durable deferral queue (scheduler.deferral.queue) on the in-process store, with a
manual clock for the TTLs: holds, claims, answers, retention, tenant-scoped ids, the caps,
cancellation and the operators' purge. The same operations on Redis:
tests/integration/deferral/test_queue_stores.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from scheduler.deferral.queue import (
    CANCELLED_TTL_S,
    DONE,
    HELD,
    KEY_OVERHEAD_BYTES,
    OPERATOR,
    RUNNING,
    UNKNOWN,
    Cancelled,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    OverCap,
    Submitted,
    held_key,
    payload_key,
    submission_key,
)
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import Atomic, AtomicArg

T0 = 1_700_000_000.0


@dataclass
class Clock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


def item(request_id: str, release_in: float, deadline_in: float = 6 * 3600.0, tenant: str = "acme",
         payload: bytes = b"\x00serialized request\xff") -> HeldRequest:
    return HeldRequest(
        request_id=request_id, tenant=tenant, enqueued_at=T0, deadline=T0 + deadline_in, release_at=T0 + release_in,
        reason="window", detail="held for the forecast's lowest window", region="eu-north", forecast_value=21.0,
        now_value=30.0, payload=payload,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(namespace="test", clock=clock)


@pytest.fixture
def queue(store: MemoryStore, clock: Clock) -> DeferralQueue:
    return DeferralQueue(store, claim_ttl_s=60.0, result_ttl_s=3600.0, grace_s=600.0, clock=clock)


async def test_held_requests_round_trip_and_a_retried_submission_keeps_the_first(queue: DeferralQueue) -> None:
    first = item("r1", release_in=3600.0)
    assert await queue.submit(first, b"ack 1") == Submitted(b"ack 1")
    assert await queue.submit(item("r1", release_in=10.0, payload=b"second"), b"ack 2") == Submitted(b"ack 1")
    assert await queue.get("acme", "r1") == replace(first, payload=b"")  # a record carries no payload
    assert await queue.fetch("acme", "r1") == first
    await queue.submit(item("r0", release_in=60.0), b"ack 0")
    assert [i.request_id for i in await queue.held()] == ["r0", "r1"]  # by release time


async def test_another_queue_on_the_same_store_sees_them(queue: DeferralQueue, store: MemoryStore,
                                                         clock: Clock) -> None:
    # A restarted router builds a new queue over the same store: nothing is lost.
    for n in range(5):
        await queue.submit(item(f"r{n}", release_in=60.0 * n), b"ack")
    again = DeferralQueue(store, clock=clock)
    assert [i.request_id for i in await again.held()] == [f"r{n}" for n in range(5)]


async def test_a_request_id_is_the_tenants_own(queue: DeferralQueue) -> None:
    await queue.submit(item("report", release_in=0.0, payload=b"acme's"), b"acme ack")
    # globex's "report" is another request: held beside it, answered apart, revealing nothing.
    assert await queue.submit(item("report", release_in=0.0, tenant="globex", payload=b"globex's"),
                              b"globex ack") == Submitted(b"globex ack")
    mine, theirs = await queue.fetch("acme", "report"), await queue.fetch("globex", "report")
    assert mine is not None and theirs is not None
    assert (mine.payload, theirs.payload) == (b"acme's", b"globex's")
    claimed = await queue.claim("globex", "router-a")
    assert claimed is not None and claimed.tenant == "globex"
    await queue.finish(claimed, b"globex answer")
    assert await queue.answer("globex", "report") == b"globex answer"
    assert await queue.answer("acme", "report") is None and await queue.status("acme", "report") == HELD
    assert await queue.submission("acme", "report") == b"acme ack"
    # A tenant whose name would collide with another's key, were it not quoted.
    await queue.submit(item("x", release_in=0.0, tenant="a:b"), b"ack")
    assert await queue.get("a", "b:x") is None and await queue.get("a:b", "x") is not None


async def test_only_due_requests_are_claimed(queue: DeferralQueue, clock: Clock) -> None:
    await queue.submit(item("soon", release_in=60.0), b"ack")
    await queue.submit(item("later", release_in=7200.0), b"ack")
    assert await queue.due_tenants(10) == [] and await queue.claim("acme", "router-a") is None
    clock.t += 61.0
    assert await queue.due_tenants(10) == ["acme"]
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None and claimed.request_id == "soon" and claimed.payload
    assert await queue.claim("acme", "router-a") is None  # "later" is not due


async def test_one_router_claims_a_release_until_its_lease_lapses(queue: DeferralQueue, clock: Clock) -> None:
    await queue.submit(item("r1", release_in=0.0), b"ack")
    assert await queue.status("acme", "r1") == HELD
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None
    assert await queue.claim("acme", "router-b") is None
    assert await queue.status("acme", "r1") == RUNNING
    clock.t += 30.0
    assert await queue.renew(claimed, "router-a") and not await queue.renew(claimed, "router-b")
    clock.t += 59.0  # renewed 59 s ago: still router-a's
    assert await queue.claim("acme", "router-b") is None
    clock.t += 2.0  # router-a died mid-run: its lease lapses, the request is still held
    assert await queue.status("acme", "r1") == HELD
    again = await queue.claim("acme", "router-b")
    assert again is not None and again.request_id == "r1"


async def test_finish_stores_the_answer_then_it_expires(queue: DeferralQueue, clock: Clock) -> None:
    await queue.submit(item("r1", release_in=0.0), b"ack")
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None
    assert await queue.finish(claimed, b"answer")
    assert await queue.answer("acme", "r1") == b"answer" and await queue.status("acme", "r1") == DONE
    assert await queue.get("acme", "r1") is None and await queue.held() == []
    assert await queue.fetch("acme", "r1") is None  # the payload went with it
    assert await queue.submit(item("r1", release_in=0.0), b"ack 2") == Submitted(b"ack")  # still answered
    clock.t += 3601.0
    assert await queue.answer("acme", "r1") is None and await queue.status("acme", "r1") == UNKNOWN
    assert await queue.submission("acme", "r1") is None  # the id is free again


async def test_release_now_moves_the_release_and_says_why(queue: DeferralQueue, clock: Clock) -> None:
    await queue.submit(item("r1", release_in=7200.0), b"ack")
    clock.t += 10.0
    moved = await queue.release_now("acme", "r1")
    assert moved is not None and moved.release_at == T0 + 10.0 and moved.reason == OPERATOR
    assert "released early" in moved.detail and "lowest window" in moved.detail
    assert [i.request_id for i in await queue.due()] == ["r1"]
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None and claimed.reason == OPERATOR
    assert await queue.release_now("acme", "nobody") is None


async def test_a_held_prompt_outlives_its_deadline_by_the_grace_only(queue: DeferralQueue, store: MemoryStore,
                                                                     clock: Clock) -> None:
    await queue.submit(item("r1", release_in=60.0, deadline_in=3600.0), b"ack")
    clock.t += 3600.0 + 600.0 - 1.0
    assert await store.get(payload_key("acme", "r1")) is not None
    clock.t += 2.0
    for key in (payload_key("acme", "r1"), held_key("acme", "r1"), submission_key("acme", "r1")):
        assert await store.get(key) is None, key
    # The lapsed hold leaves the indexes at the next claim: nothing held, nothing counted.
    assert await queue.claim("acme", "router-a") is None
    assert await queue.usage("acme") == (0, 0) and await queue.tenants() == []


async def test_the_caps_refuse_and_store_nothing(store: MemoryStore, clock: Clock) -> None:
    queue = DeferralQueue(store, max_held=2, max_bytes=4000, result_ttl_s=60.0, clock=clock)
    assert isinstance(await queue.submit(item("a", release_in=0.0), b"ack"), Submitted)
    assert isinstance(await queue.submit(item("b", release_in=0.0), b"ack"), Submitted)
    refused = await queue.submit(item("c", release_in=0.0), b"ack")
    assert isinstance(refused, OverCap) and refused.cap == "max_held" and refused.held == 2
    assert await queue.get("acme", "c") is None and await queue.submission("acme", "c") is None
    assert isinstance(await queue.submit(item("c", release_in=0.0, tenant="globex"), b"ack"), Submitted)

    held, used = await queue.usage("acme")
    assert held == 2 and used > 2 * 3 * KEY_OVERHEAD_BYTES
    big = await queue.submit(item("big", release_in=0.0, tenant="globex", payload=b"x" * 4000), b"ack")
    assert isinstance(big, OverCap) and big.cap == "max_bytes" and big.needs_bytes > 4000
    # An answer still counts (it is kept), until it expires: then the room is back.
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None and await queue.finish(claimed, b"answer")
    assert (await queue.usage("acme"))[0] == 1
    clock.t += 61.0
    assert isinstance(await queue.submit(item("d", release_in=0.0), b"ack"), Submitted)
    assert await queue.usage("acme") == (2, used)  # the expired answer left the count with it


async def test_cancel_drops_the_request_and_keeps_only_its_cancellation(queue: DeferralQueue, store: MemoryStore,
                                                                          clock: Clock) -> None:
    # Claimed in release order (ties by id): "1-answered" first, then "2-running".
    for name in ("1-answered", "2-running", "3-held"):
        await queue.submit(item(name, release_in=0.0), b"ack " + name.encode())
    answered = await queue.claim("acme", "router-a")
    running = await queue.claim("acme", "router-a")
    assert answered is not None and running is not None and await queue.finish(answered, b"answer")
    assert await queue.cancel("acme", "3-held", b"cancelled") == "held"
    assert await queue.cancel("acme", "2-running", b"cancelled") == "running"
    assert await queue.cancel("acme", "1-answered", b"cancelled") == "answered"
    assert await queue.cancel("acme", "nobody", b"cancelled") is None
    for request_id in ("1-answered", "2-running", "3-held"):
        assert await queue.answer("acme", request_id) == b"cancelled"
        assert await store.get(payload_key("acme", request_id)) is None
        assert await queue.get("acme", request_id) is None
    assert not await queue.finish(running, b"late answer")  # the run's answer is not kept
    assert await queue.answer("acme", "2-running") == b"cancelled"
    assert await queue.held() == [] and await queue.claim("acme", "router-a") is None
    # A late retry of a cancelled submission gets the cancellation, and holds nothing.
    assert await queue.submit(item("3-held", release_in=0.0), b"ack 2") == Cancelled(b"cancelled")
    assert await queue.held() == [] and await queue.submission("acme", "3-held") is None
    assert await queue.usage("acme") == (0, 3 * (len(b"cancelled") + KEY_OVERHEAD_BYTES))
    clock.t += CANCELLED_TTL_S + 1.0  # then the id is free again
    assert await queue.answer("acme", "3-held") is None
    assert await queue.submit(item("3-held", release_in=0.0), b"ack 3") == Submitted(b"ack 3")


async def test_purge_a_tenant_and_what_expired(queue: DeferralQueue, store: MemoryStore, clock: Clock) -> None:
    for n in range(3):
        await queue.submit(item(f"a{n}", release_in=0.0), b"ack")
        await queue.submit(item(f"g{n}", release_in=0.0, tenant="globex", deadline_in=100.0), b"ack")
    claimed = await queue.claim("acme", "router-a")
    assert claimed is not None and await queue.finish(claimed, b"answer")
    assert await queue.purge_tenant("acme") == 3
    assert await queue.usage("acme") == (0, 0) and await queue.tenants() == ["globex"]
    assert [key for key in await store.keys("deferred") if "acme" in key] == []  # (the test may list keys)
    clock.t += 101.0  # globex's are past their deadline (held: no router ran)
    await queue.submit(item("fresh", release_in=3600.0, tenant="globex", deadline_in=7200.0), b"ack")
    assert await queue.purge_expired() == 3
    assert [i.request_id for i in await queue.held("globex")] == ["fresh"]


async def test_the_worker_answers_due_requests_retries_failures_and_gives_up_after_the_deadline(
    queue: DeferralQueue, clock: Clock,
) -> None:
    ran: list[str] = []
    failing = {"flaky": 1, "broken": 99}

    async def run(held: HeldRequest) -> bytes:
        ran.append(held.request_id)
        if failing.get(held.request_id, 0) > 0:
            failing[held.request_id] -= 1
            raise ConnectionError("region unreachable")
        return f"answer {held.request_id}".encode()

    def give_up(held: HeldRequest, error: BaseException) -> bytes:
        return f"failed {held.request_id}: {error}".encode()

    worker = DeferralWorker(queue, run, "router-a", give_up)
    await queue.submit(item("ok", release_in=0.0), b"ack")
    await queue.submit(item("flaky", release_in=0.0), b"ack")
    await queue.submit(item("broken", release_in=0.0, deadline_in=120.0), b"ack")
    await queue.submit(item("later", release_in=3600.0), b"ack")
    assert await worker.tick() == 1
    assert await queue.answer("acme", "ok") == b"answer ok"
    # Claims given back, due again at the next pass (a second on).
    assert await queue.status("acme", "flaky") == HELD and await queue.status("acme", "broken") == HELD
    assert await worker.tick() == 0
    clock.t += 1.0
    assert await worker.tick() == 1
    assert await queue.answer("acme", "flaky") == b"answer flaky"
    clock.t += 120.0  # past broken's deadline
    assert await worker.tick() == 1
    assert await queue.answer("acme", "broken") == b"failed broken: region unreachable"
    assert [i.request_id for i in await queue.held()] == ["later"]
    assert "later" not in ran


class PayloadCountingStore(MemoryStore):
    """Counts the bytes of the atomic operations' arguments (what would travel to Redis)."""

    sent: int = 0

    async def run_atomic(self, op: Atomic, keys_: Sequence[str], args: Sequence[AtomicArg]) -> Any:
        self.sent += sum(len(a) for a in args if isinstance(a, bytes))
        return await super().run_atomic(op, keys_, args)


async def test_a_tenant_past_its_caps_is_refused_before_its_payload_travels(clock: Clock) -> None:
    store = PayloadCountingStore(clock=clock)
    queue = DeferralQueue(store, max_bytes=300_000, clock=clock)
    assert isinstance(await queue.submit(item("a", release_in=0.0, payload=b"x" * 200_000), b"ack"), Submitted)
    before = store.sent
    for k in range(10):
        refused = await queue.submit(item(f"flood-{k}", release_in=0.0, payload=b"x" * 200_000), b"ack")
        assert isinstance(refused, OverCap) and refused.cap == "max_bytes"
    assert store.sent - before < 1000  # ten 200 kB payloads refused, none sent
