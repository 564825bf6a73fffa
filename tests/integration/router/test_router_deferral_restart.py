"""A router killed with deferred requests held and one mid-run loses none of them.

``scheduler router`` runs as a real process on the test's Redis. Six deferrable requests are
held for a clean window hours away; one is released and answered, a second is released and
the router is SIGKILLed while it streams it from a slow region. Another router process on the
same Redis then answers all six: the answered one stays answered, the one cut short runs again
once the dead router's claim lapses, the held ones when they are released.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import yaml

from scheduler.client import AsyncSchedulerClient
from scheduler.datalayer.carbon.store_io import write_forecast
from scheduler.deferral.queue import RUNNING, DeferralQueue
from scheduler.server.auth import NewKey, create_key
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.tickets import TicketKeyRing
from scheduler.types import Signal

from .conftest import Fleet

pytestmark = pytest.mark.integration

# The router's claim on a release: a dead router's lapses within it.
CLAIM_TTL_S = DeferralSettings().claim_ttl_s
REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")
MODEL = "llama-3.1-8b"
N = 6
HOUR_S = 3600.0
# A region streaming 8 tokens 0.4 s apart: a run of about 3 s, long enough to die in.
TOKENS, TOKEN_INTERVAL_S = 8, 0.4


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-deferral-restart-{uuid.uuid4().hex[:12]}"
    yield name
    await delete_namespace(REDIS_URL, name)


@pytest.fixture
def config_dir(stub_fleet: Fleet, tmp_path: Path) -> Iterator[tuple[Path, NewKey]]:
    regions_dir = tmp_path / "regions"
    regions_dir.mkdir()
    for config in stub_fleet.configs:
        (regions_dir / f"{config.name}.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    tenant = create_key("acme")
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"keys": [tenant.entry.model_dump(exclude_none=True)]}))
    (tmp_path / "ticket-keys.yaml").write_text(TicketKeyRing.generate(c.name for c in stub_fleet.configs).to_yaml())
    yield tmp_path, tenant


def start_router(config: Path, namespace: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "router", "--host", "127.0.0.1", "--port", "0",
         "--regions", str(config / "regions"), "--state", REDIS_URL, "--namespace", namespace,
         "--keys", str(config / "keys.yaml"), "--ticket-keys", str(config / "ticket-keys.yaml"),
         "--refresh-interval", "0.5", "--grace", "1", "--no-carbon-pollers"],
        stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = LISTENING.search(line)
    if not match:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"router did not report its port: {line!r}")
    return process, int(match.group(1))


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    give_up_at = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < give_up_at, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
async def test_no_deferred_request_is_lost_when_the_router_is_killed(
    stub_fleet: Fleet, config_dir: tuple[Path, NewKey], namespace: str,
) -> None:
    config, tenant = config_dir
    for stub in stub_fleet.regions.values():
        stub.settings.token_interval_s = TOKEN_INTERVAL_S
    store = RedisStore.from_url(REDIS_URL, namespace)
    queue = DeferralQueue(store)
    routers: list[subprocess.Popen[str]] = []
    try:
        now = time.time()
        hour = math.floor(now / HOUR_S) * HOUR_S
        for zone in {c.carbon.zone for c in stub_fleet.configs}:
            await write_forecast(store, zone, [
                Signal("carbon_intensity", zone, 400.0 if k < 2 else 50.0, "gCO2eq/kWh", hour + k * HOUR_S, now,
                       "test", is_forecast=True) for k in range(8)])
        router_a, port_a = start_router(config, namespace)
        routers.append(router_a)
        ids = [f"job-{k}-{uuid.uuid4().hex[:6]}" for k in range(N)]

        def runs() -> int:
            """Requests the regions received."""
            return sum(len(stub.log.bodies) for stub in stub_fleet.regions.values())

        async with AsyncSchedulerClient(f"127.0.0.1:{port_a}", api_key=tenant.key) as client:
            for rid in ids:
                held = await client.defer(f"report {rid}", model=MODEL, max_tokens=TOKENS, request_id=rid,
                                          deadline_unix_s=now + 6 * HOUR_S)
                assert held.reason == "window" and held.release_at_unix_s > now + 60
            # The first: released and answered by router A.
            async def first_done() -> bool:
                return (await client.get_deferred(ids[0])).state == "done"

            async def second_streaming() -> bool:
                return runs() == 2

            await queue.release_now(tenant.entry.tenant, ids[0])
            await until(first_done, "the first answer")
            assert runs() == 1
            # The second: released, and router A dies while it streams it.
            await queue.release_now(tenant.entry.tenant, ids[1])
            await until(second_streaming, "the second run to reach a region")
            await asyncio.sleep(TOKEN_INTERVAL_S * 2)
        router_a.send_signal(signal.SIGKILL)
        router_a.wait(timeout=10)

        assert await queue.status(tenant.entry.tenant, ids[1]) == RUNNING  # its claim outlives the dead router
        assert await queue.answer(tenant.entry.tenant, ids[1]) is None
        assert sorted(i.request_id for i in await queue.held()) == sorted(ids[1:])

        router_b, port_b = start_router(config, namespace)
        routers.append(router_b)
        for rid in ids[2:]:
            await queue.release_now(tenant.entry.tenant, rid)
        killed_at = time.monotonic()
        async with AsyncSchedulerClient(f"127.0.0.1:{port_b}", api_key=tenant.key) as client:
            answers = await asyncio.gather(*(client.wait_deferred(rid, timeout_s=CLAIM_TTL_S + 45) for rid in ids))
        print(f"all {N} answered {time.monotonic() - killed_at:.1f} s after the restart; region runs {runs()}")
        for rid, answer in zip(ids, answers, strict=True):
            assert answer.text and answer.receipt is not None and answer.receipt.request_id == rid
            assert answer.receipt.deferral.startswith("operator: ")
        # Each ran once, but the one cut short: twice (at least once, never lost).
        assert runs() == N + 1
        assert await queue.held() == []
    finally:
        for process in routers:
            if process.poll() is None:
                process.terminate()
        for process in routers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        await store.close()
