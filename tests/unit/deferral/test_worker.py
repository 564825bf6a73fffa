"""The release loop (scheduler.deferral.queue.DeferralWorker) on the in-process store: runs go
concurrently and keep their claims, tenants are served round-robin (a tenant's backlog does
not delay another's request by more than one round), each release passes the gate (the
router's rate limit and stream cap), and a pass reads neither the keyspace nor more payloads
than it starts."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from scheduler.deferral.queue import HELD, RUNNING, DeferralQueue, DeferralWorker, HeldRequest
from scheduler.state.memory_store import MemoryStore

pytestmark = pytest.mark.timeout(60)


def item(request_id: str, tenant: str = "acme", release_in: float = 0.0) -> HeldRequest:
    now = time.time()
    return HeldRequest(request_id, tenant, now, now + 3600.0, now + release_in, "window", "held",
                       payload=f"payload of {tenant}/{request_id}".encode())


async def test_runs_go_concurrently_keep_their_claims_past_the_ttl_and_give_them_back_at_stop() -> None:
    store = MemoryStore(clock=time.time)
    queue = DeferralQueue(store, claim_ttl_s=0.3)
    started: list[str] = []
    release = asyncio.Event()

    async def run(held: HeldRequest) -> bytes:
        started.append(held.request_id)
        await release.wait()
        return b"answer " + held.request_id.encode()

    worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", interval_s=0.02, max_running=3)
    for k in range(4):
        await queue.submit(item(f"r{k}"), b"ack")
    stop = asyncio.Event()
    loop = asyncio.create_task(worker.run_forever(stop))
    await asyncio.sleep(0.9)  # three claim TTLs
    assert sorted(started) == ["r0", "r1", "r2"] and worker.running == 3  # the fourth waits for a slot
    assert [await queue.status("acme", f"r{k}") for k in range(4)] == [RUNNING, RUNNING, RUNNING, HELD]
    release.set()
    for _ in range(100):
        if await queue.answer("acme", "r3") is not None:
            break
        await asyncio.sleep(0.02)
    assert [await queue.answer("acme", f"r{k}") for k in range(4)] == [f"answer r{k}".encode() for k in range(4)]

    release.clear()
    await queue.submit(item("r9"), b"ack")
    for _ in range(100):
        if "r9" in started:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await loop
    assert worker.running == 0 and await queue.status("acme", "r9") == HELD  # its claim given back


def fleet_backlog(store: MemoryStore) -> DeferralQueue:
    return DeferralQueue(store, max_held=5000)


async def hold_backlog(queue: DeferralQueue) -> None:
    """Tenant "bulk": 1,000 requests due for an hour; tenant "small": one, due just now."""
    for k in range(1000):
        await queue.submit(item(f"bulk-{k:04d}", tenant="bulk", release_in=-3600.0 + k), b"ack")
    await queue.submit(item("mine", tenant="small", release_in=-1.0), b"ack")


@pytest.mark.parametrize("max_running", [1, 4])
async def test_a_backlog_does_not_delay_another_tenants_request_beyond_one_round(max_running: int) -> None:
    queue = fleet_backlog(MemoryStore(clock=time.time))
    await hold_backlog(queue)
    order: list[str] = []
    gate = asyncio.Event()

    async def run(held: HeldRequest) -> bytes:
        order.append(held.tenant)
        await gate.wait()
        return b"answer"

    worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", max_running=max_running)
    first = await worker._start_due()
    await asyncio.sleep(0)  # let the started runs begin
    if max_running == 1:
        # One run at a time: the longest due tenant's first, the other tenant's next.
        assert order == ["bulk"]
        gate.set()
        await asyncio.gather(*first)
        second = await worker._start_due()
        await asyncio.gather(*second)
        assert order == ["bulk", "small"]
    else:
        # One round: one request of each due tenant, then the rest of the slots go round again.
        assert order[:2] == ["bulk", "small"] and Counter(order) == {"bulk": 3, "small": 1}
        gate.set()
        await asyncio.gather(*first)
    assert await queue.answer("small", "mine") == b"answer"


class CountingGate:
    """A gate that admits up to ``limits[tenant]`` releases at once (a stream cap)."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.inside: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    async def enter(self, tenant: str) -> bool:
        if self.inside[tenant] >= self.limits.get(tenant, 1000):
            self.refused[tenant] += 1
            return False
        self.inside[tenant] += 1
        return True

    def leave(self, tenant: str) -> None:
        self.inside[tenant] -= 1


async def test_a_tenant_over_its_limits_waits_and_the_others_go_on() -> None:
    queue = fleet_backlog(MemoryStore(clock=time.time))
    await hold_backlog(queue)
    gate = CountingGate({"bulk": 2})
    done = asyncio.Event()
    running: Counter[str] = Counter()

    async def run(held: HeldRequest) -> bytes:
        running[held.tenant] += 1
        await done.wait()
        return b"answer"

    worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", max_running=8, gate=gate)
    started = await worker._start_due()
    await asyncio.sleep(0)
    assert running == {"bulk": 2, "small": 1} and len(started) == 3  # bulk at its cap, not the whole pool
    assert gate.refused["bulk"] >= 1 and (await queue.usage("bulk"))[0] == 1000
    done.set()
    await asyncio.gather(*started)
    assert gate.inside == {"bulk": 0, "small": 0}  # every slot given back


class NoScanStore(MemoryStore):
    """The in-process store, failing any listing of keys and counting payload reads."""

    payload_reads: int = 0

    async def keys(self, prefix: str) -> list[str]:
        raise AssertionError(f"the deferral queue listed keys ({prefix!r}): it must read its indexes")

    async def mget(self, keys_: Sequence[str]) -> list[bytes | None]:
        self.payload_reads += sum(key.startswith("deferred_payload:") for key in keys_)
        return await super().mget(keys_)


async def test_a_pass_lists_no_keys_and_reads_only_the_payloads_it_starts() -> None:
    store = NoScanStore(clock=time.time)
    queue = fleet_backlog(store)
    await hold_backlog(queue)
    for k in range(200):  # and many tenants, each with one request due
        await queue.submit(item("job", tenant=f"tenant-{k:03d}"), b"ack")
    answered: list[str] = []

    async def run(held: HeldRequest) -> bytes:
        answered.append(held.tenant)
        return b"answer"

    worker = DeferralWorker(queue, run, "router-a", lambda held, error: b"failed", max_running=16)
    started = await worker._start_due()
    assert len(started) == 16 and store.payload_reads == 16
    await asyncio.gather(*started)
    assert await worker.tick() == 1201 - 16
    assert store.payload_reads == 1201  # each payload read once, by the pass that ran it
    assert Counter(answered)["bulk"] == 1000 and len(set(answered)) == 202
