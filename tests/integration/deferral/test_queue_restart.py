"""The deferral queue in Redis loses no held request when the process releasing them dies.

A child process (standing for a router) holds requests in Redis and runs the release loop; it
is killed with SIGKILL while some are answered, one is mid-run and the rest are not due yet.
A new release loop on a fresh connection (the restarted router) then answers every one of
them: the answered ones stay answered, the one mid-run runs again once its claim lapses, the
rest at their release time. This is the queue's own restart test; the router's (two real
router processes) is tests/integration/router/test_router_deferral_restart.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler.deferral.queue import DeferralQueue, DeferralWorker, HeldRequest
from scheduler.state.redis_store import RedisStore, delete_namespace

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
ROOT = Path(__file__).resolve().parents[3]
N = 40
CLAIM_TTL_S = 1.5

CHILD = r"""
import asyncio, sys, time
from scheduler.deferral.queue import DeferralQueue, DeferralWorker, HeldRequest
from scheduler.state.redis_store import RedisStore

async def main(url: str, namespace: str, n: int, claim_ttl_s: float) -> None:
    store = RedisStore.from_url(url, namespace)
    queue = DeferralQueue(store, claim_ttl_s=claim_ttl_s)
    now = time.time()
    for k in range(n):
        # Even ones are due at once, odd ones in 4 s.
        release = now if k % 2 == 0 else now + 4.0
        await queue.submit(HeldRequest(f"r{k}", "acme", now, now + 3600.0, release, "window", "held",
                                       payload=f"request {k}".encode()), b"ack")
    print("held", flush=True)

    async def run(item: HeldRequest) -> bytes:
        print("running", item.request_id, flush=True)
        await asyncio.sleep(0.2)  # streaming the answer from a region
        return b"answer to " + item.payload

    worker = DeferralWorker(queue, run, "router-a", lambda item, error: b"failed", interval_s=0.05)
    await worker.run_forever(asyncio.Event())

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-deferral-{uuid.uuid4().hex[:12]}"
    yield name
    await delete_namespace(REDIS_URL, name)


@pytest.mark.timeout(60)
async def test_no_held_request_is_lost_when_the_releasing_process_is_killed(namespace: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, REDIS_URL, namespace, str(N), str(CLAIM_TTL_S)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        running = 0
        while running < 4:  # it answered a few and is streaming the next one
            line = child.stdout.readline()
            assert line, "the child exited early"
            running += line.startswith("running")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()

    store = RedisStore.from_url(REDIS_URL, namespace)
    try:
        queue = DeferralQueue(store, claim_ttl_s=CLAIM_TTL_S)
        held = await queue.held()
        answered_before = [k for k in range(N) if await queue.answer("acme", f"r{k}") is not None]
        assert 1 <= len(answered_before) < N // 2
        assert len(held) + len(answered_before) == N  # every request is answered or still held
        assert {f"r{k}" for k in range(1, N, 2)} <= {i.request_id for i in held}  # not due yet

        async def run(item: HeldRequest) -> bytes:
            return b"answer to " + item.payload

        worker = DeferralWorker(queue, run, "router-b", lambda item, error: b"failed", interval_s=0.05)
        give_up_at = time.monotonic() + 20.0
        while await queue.held() and time.monotonic() < give_up_at:
            await worker.tick()
            await asyncio.sleep(0.05)
        assert await queue.held() == []
        for k in range(N):
            assert await queue.answer("acme", f"r{k}") == f"answer to request {k}".encode(), k
    finally:
        await store.close()
