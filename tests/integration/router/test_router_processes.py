"""Two ``scheduler router`` processes sharing one Redis (db 1): the kill switch set on one
holds on both within a second."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml

from scheduler.client import AsyncSchedulerClient
from scheduler.server.auth import create_key
from scheduler.state import codec, keys
from scheduler.state.redis_store import RedisStore
from scheduler.tickets import TicketKeyRing
from scheduler.types import Signal

from .conftest import Fleet

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-routers-{uuid.uuid4().hex[:12]}"
    yield name
    raw = aioredis.Redis.from_url(REDIS_URL)
    found = [key async for key in raw.scan_iter(match=f"sched:{name}:*")]
    if found:
        await raw.delete(*found)
    await raw.aclose()


def _start_router(regions_dir: Path, keys_file: Path, namespace: str) -> tuple[subprocess.Popen[str], int]:
    ticket_keys = regions_dir.parent / "ticket-keys.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "router", "--host", "127.0.0.1", "--port", "0",
         "--regions", str(regions_dir), "--state", REDIS_URL, "--namespace", namespace,
         "--keys", str(keys_file), "--ticket-keys", str(ticket_keys), "--refresh-interval", "0.5", "--grace", "1",
         "--no-carbon-pollers"],
        stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = LISTENING.search(line)
    if not match:
        process.kill()
        raise AssertionError(f"router did not report its port: {line!r}")
    return process, int(match.group(1))


@pytest.fixture
def two_routers(stub_fleet: Fleet, tmp_path: Path, namespace: str) -> Iterator[tuple[int, int, str]]:
    regions_dir = tmp_path / "regions"
    regions_dir.mkdir()
    for config in stub_fleet.configs:
        (regions_dir / f"{config.name}.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    admin = create_key("ops", admin=True)
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(yaml.safe_dump({"keys": [admin.entry.model_dump(exclude_none=True)]}))
    (tmp_path / "ticket-keys.yaml").write_text(TicketKeyRing.generate(c.name for c in stub_fleet.configs).to_yaml())
    processes = []
    try:
        for _ in range(2):
            process, port = _start_router(regions_dir, keys_file, namespace)
            processes.append((process, port))
        yield processes[0][1], processes[1][1], admin.key
    finally:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            try:
                assert process.wait(timeout=30) == 0  # graceful shutdown on SIGTERM (slower on a loaded machine)
            except subprocess.TimeoutExpired:
                process.kill()
                raise


@pytest.mark.timeout(120)
async def test_kill_switch_on_one_router_switches_both_within_a_second(
    stub_fleet: Fleet, two_routers: tuple[int, int, str], namespace: str
) -> None:
    port_a, port_b, admin_key = two_routers
    store = RedisStore.from_url(REDIS_URL, namespace)
    now = time.time()
    try:
        # Fresh carbon signals for every zone, so that both routers rank by energy and carbon.
        for config in stub_fleet.configs:
            signal = Signal("carbon_intensity", config.carbon.zone, 300.0, "gCO2eq/kWh", now - 30, now, "test")
            await store.set(keys.signal("carbon_intensity", config.carbon.zone), codec.encode_signal(signal))
        async with (
            AsyncSchedulerClient(f"127.0.0.1:{port_a}", api_key=admin_key) as router_a,
            AsyncSchedulerClient(f"127.0.0.1:{port_b}", api_key=admin_key) as router_b,
        ):
            async def energy_ranking(client: AsyncSchedulerClient) -> bool:
                decision = await client.route("hi", model="llama-3.1-8b", max_tokens=8)
                return decision.energy_ranking

            deadline = time.monotonic() + 10
            while not (await energy_ranking(router_a) and await energy_ranking(router_b)):
                assert time.monotonic() < deadline, "routers never saw the carbon signals"
                await asyncio.sleep(0.1)
            before = await router_b.route("hi", model="llama-3.1-8b", max_tokens=8)
            assert "carbon-scorer" in before.rates and before.units["carbon-scorer"] == "gCO2e"

            switched_at = time.monotonic()
            await router_a.set_energy_routing(False, reason="integration test")
            assert not await energy_ranking(router_a)  # the router that took the call: at once
            while await energy_ranking(router_b):
                await asyncio.sleep(0.02)
            elapsed = time.monotonic() - switched_at
            assert elapsed < 1.0, f"router B took {elapsed:.2f} s"

            after = await router_b.route("hi", model="llama-3.1-8b", max_tokens=8)
            # The policy's fallback (performance) objective: time and electricity, no carbon.
            assert "ttft-scorer" in after.rates and set(after.rates) <= {"ttft-scorer", "price-scorer"}
            assert "energy_routing_disabled" in {f.signal for f in after.fallbacks}
            status = await router_b.status()
            assert not status.energy_routing and status.state_backend == "redis" and status.state_reachable

            flags = json.loads(await store.get(keys.FLAGS) or b"{}")
            assert flags["energy_routing"] is False and flags["updated_by"].startswith("ops@")

            await router_b.set_energy_routing(True)
            deadline = time.monotonic() + 1.0
            while not await energy_ranking(router_a):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
    finally:
        await store.close()
