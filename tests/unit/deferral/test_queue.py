"""The durable deferral queue (scheduler.deferral.queue) on the in-process store, with a
manual clock for the TTLs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler.deferral.queue import (
    DONE,
    HELD,
    OPERATOR,
    RUNNING,
    UNKNOWN,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    held_key,
)
from scheduler.state.memory_store import MemoryStore

T0 = 1_700_000_000.0


@dataclass
class Clock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


def item(request_id: str, release_in: float, deadline_in: float = 6 * 3600.0, tenant: str = "acme") -> HeldRequest:
    return HeldRequest(
        request_id=request_id, tenant=tenant, enqueued_at=T0, deadline=T0 + deadline_in, release_at=T0 + release_in,
        reason="window", detail="held for the forecast's lowest window", region="eu-north", forecast_value=21.0,
        now_value=30.0, payload=b"\x00serialized request\xff",
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(namespace="test", clock=clock)


@pytest.fixture
def queue(store: MemoryStore, clock: Clock) -> DeferralQueue:
    return DeferralQueue(store, claim_ttl_s=60.0, result_ttl_s=3600.0, keep_after_deadline_s=86400.0, clock=clock)


async def test_held_requests_round_trip_and_a_retried_hold_keeps_the_first(queue: DeferralQueue) -> None:
    first = item("r1", release_in=3600.0)
    assert await queue.hold(first) is True
    assert await queue.hold(item("r1", release_in=10.0)) is False
    assert await queue.get("r1") == first
    assert await queue.hold(item("r0", release_in=60.0)) is True
    assert [i.request_id for i in await queue.held()] == ["r0", "r1"]  # by release time


async def test_another_queue_on_the_same_store_sees_them(queue: DeferralQueue, store: MemoryStore,
                                                         clock: Clock) -> None:
    # A restarted router builds a new queue over the same store: nothing is lost.
    for n in range(5):
        await queue.hold(item(f"r{n}", release_in=60.0 * n))
    again = DeferralQueue(store, clock=clock)
    assert [i.request_id for i in await again.held()] == [f"r{n}" for n in range(5)]


async def test_only_due_requests_are_released(queue: DeferralQueue, clock: Clock) -> None:
    await queue.hold(item("soon", release_in=60.0))
    await queue.hold(item("later", release_in=7200.0))
    assert await queue.due() == []
    clock.t += 61.0
    assert [i.request_id for i in await queue.due()] == ["soon"]


async def test_one_router_claims_a_release_until_its_claim_lapses(queue: DeferralQueue, clock: Clock) -> None:
    await queue.hold(item("r1", release_in=0.0))
    assert await queue.status("r1") == HELD
    assert await queue.claim("r1", "router-a") is True
    assert await queue.claim("r1", "router-b") is False
    assert await queue.status("r1") == RUNNING
    clock.t += 61.0  # router-a died mid-run: its claim lapses, the request is still held
    assert await queue.status("r1") == HELD
    assert await queue.claim("r1", "router-b") is True


async def test_finish_stores_the_answer_then_drops_the_request(queue: DeferralQueue, clock: Clock) -> None:
    await queue.hold(item("r1", release_in=0.0))
    await queue.claim("r1", "router-a")
    await queue.finish("r1", b"answer")
    assert await queue.answer("r1") == b"answer"
    assert await queue.status("r1") == DONE
    assert await queue.get("r1") is None and await queue.held() == []
    clock.t += 3601.0
    assert await queue.answer("r1") is None
    assert await queue.status("r1") == UNKNOWN


async def test_release_now_moves_the_release_and_says_why(queue: DeferralQueue, clock: Clock) -> None:
    await queue.hold(item("r1", release_in=7200.0))
    clock.t += 10.0
    moved = await queue.release_now("r1")
    assert moved is not None and moved.release_at == T0 + 10.0 and moved.reason == OPERATOR
    assert "released early" in moved.detail and "lowest window" in moved.detail
    assert [i.request_id for i in await queue.due()] == ["r1"]
    assert await queue.release_now("nobody") is None


async def test_a_held_request_outlives_its_deadline_by_the_keep_time_only(queue: DeferralQueue, store: MemoryStore,
                                                                          clock: Clock) -> None:
    await queue.hold(item("r1", release_in=60.0, deadline_in=3600.0))
    clock.t += 3600.0 + 86400.0 - 1.0
    assert await store.get(held_key("r1")) is not None
    clock.t += 2.0
    assert await store.get(held_key("r1")) is None


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
    await queue.hold(item("ok", release_in=0.0))
    await queue.hold(item("flaky", release_in=0.0))
    await queue.hold(item("broken", release_in=0.0, deadline_in=120.0))
    await queue.hold(item("later", release_in=3600.0))
    assert await worker.tick() == 1
    assert await queue.answer("ok") == b"answer ok"
    assert await queue.status("flaky") == HELD and await queue.status("broken") == HELD  # claims given back
    assert await worker.tick() == 1
    assert await queue.answer("flaky") == b"answer flaky"
    clock.t += 121.0  # past broken's deadline
    assert await worker.tick() == 1
    assert await queue.answer("broken") == b"failed broken: region unreachable"
    assert [i.request_id for i in await queue.held()] == ["later"]
    assert "later" not in ran
