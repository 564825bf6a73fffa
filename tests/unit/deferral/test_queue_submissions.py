"""The deferral queue's submissions (a retried id gets the first answer, another tenant's id
is not taken over) and the worker's concurrent runs, whose claims are renewed while they run
and given back when the loop stops."""

from __future__ import annotations

import asyncio
import time

from scheduler.deferral.queue import (
    HELD,
    RUNNING,
    DeferralQueue,
    DeferralWorker,
    HeldRequest,
    Submission,
    held_key,
)
from scheduler.state.memory_store import MemoryStore


def item(request_id: str, tenant: str = "acme", release_in: float = 0.0, payload: bytes = b"first") -> HeldRequest:
    now = time.time()
    return HeldRequest(request_id, tenant, now, now + 3600.0, now + release_in, "window", "held", payload=payload)


def queue_on(store: MemoryStore, claim_ttl_s: float = 60.0) -> DeferralQueue:
    return DeferralQueue(store, claim_ttl_s=claim_ttl_s)


async def test_a_retry_gets_the_first_submission_and_its_hold() -> None:
    queue = queue_on(MemoryStore(clock=time.time))
    first = await queue.submit(item("r1", release_in=7200.0), b"ack 1")
    assert first == Submission("acme", b"ack 1")
    again = await queue.submit(item("r1", release_in=0.0, payload=b"second"), b"ack 2")
    assert again == first
    held = await queue.get("r1")
    assert held is not None and held.payload == b"first" and held.release_at > time.time() + 3600


async def test_another_tenants_id_is_not_taken_over() -> None:
    queue = queue_on(MemoryStore(clock=time.time))
    await queue.submit(item("r1"), b"acme's")
    theirs = await queue.submit(item("r1", tenant="globex", payload=b"globex's"), b"globex's ack")
    assert theirs == Submission("acme", b"acme's")  # the caller refuses it
    held = await queue.get("r1")
    assert held is not None and held.tenant == "acme" and held.payload == b"first"


async def test_a_retry_holds_what_a_crash_left_unheld_but_never_reruns_an_answered_one() -> None:
    store = MemoryStore(clock=time.time)
    queue = queue_on(store)
    await queue.submit(item("cut"), b"ack")
    await store.delete(held_key("cut"))  # the crash: recorded, not held
    assert await queue.submit(item("cut", payload=b"retry"), b"ack 2") == Submission("acme", b"ack")
    held = await queue.get("cut")
    assert held is not None and held.payload == b"retry"

    await queue.submit(item("done"), b"ack")
    await queue.finish("done", b"answer")
    assert await queue.submit(item("done"), b"ack 2") == Submission("acme", b"ack")
    assert await queue.get("done") is None and await queue.answer("done") == b"answer"


async def test_a_claim_is_renewed_only_by_its_owner() -> None:
    queue = queue_on(MemoryStore(clock=time.time))
    await queue.hold(item("r1"))
    assert await queue.claim("r1", "router-a")
    assert await queue.renew("r1", "router-a")
    assert not await queue.renew("r1", "router-b")
    await queue.unclaim("r1")
    assert not await queue.renew("r1", "router-a")


async def test_runs_go_concurrently_keep_their_claims_past_the_ttl_and_give_them_back_at_stop() -> None:
    store = MemoryStore(clock=time.time)
    queue = queue_on(store, claim_ttl_s=0.3)
    started: list[str] = []
    release = asyncio.Event()

    async def run(held: HeldRequest) -> bytes:
        started.append(held.request_id)
        await release.wait()
        return b"answer " + held.request_id.encode()

    worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", interval_s=0.02, max_running=3)
    for k in range(4):
        await queue.hold(item(f"r{k}"))
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run_forever(stop))
    await asyncio.sleep(0.9)  # three claim TTLs
    assert sorted(started) == ["r0", "r1", "r2"] and worker.running == 3  # the fourth waits for a slot
    assert [await queue.status(f"r{k}") for k in range(4)] == [RUNNING, RUNNING, RUNNING, HELD]
    release.set()
    for _ in range(100):
        if await queue.answer("r3") is not None:
            break
        await asyncio.sleep(0.02)
    assert [await queue.answer(f"r{k}") for k in range(4)] == [f"answer r{k}".encode() for k in range(4)]

    release.clear()
    await queue.hold(item("r9"))
    for _ in range(100):
        if "r9" in started:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await loop
    assert worker.running == 0 and await queue.status("r9") == HELD  # its claim given back
