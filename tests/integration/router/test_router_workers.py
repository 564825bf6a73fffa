"""``scheduler router --workers 2``: two processes on the same ports (SO_REUSEPORT) sharing
Redis; connections spread over both; ``/metrics`` on the one metrics port answers with both
workers' counters summed (prometheus_client's multiprocess mode, in the directory the parent
set up and empties at exit); a worker that dies is started again; SIGTERM stops all.
Real processes, real Redis (a fresh namespace, deleted afterwards)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import redis
import yaml

from scheduler.cli import main
from scheduler.config.loader import load_fleet

from .conftest import Fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_WORKERS", "redis://127.0.0.1:6379/6")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"test-workers-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    found = list(client.scan_iter(match=f"sched:{name}:*"))
    if found:
        client.delete(*found)
    client.close()


async def wait_for(pattern: str, log: Path, count: int, timeout_s: float = 60.0) -> list[str]:
    """Until ``log`` has ``count`` matches (the stub regions keep serving meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.findall(pattern, log.read_text(errors="replace"))
        if len(found) >= count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} x {pattern!r} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")


def test_workers_need_redis_and_fixed_ports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "--workers", "2", "--insecure", "--insecure-no-tickets", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--state redis://" in err and "fixed ports" in err


async def test_two_workers_share_the_ports_and_one_that_dies_comes_back(
    stub_fleet: Fleet, tmp_path: Path, namespace: str,
) -> None:
    regions = tmp_path / "regions"
    regions.mkdir()
    shipped = {r.name: r for r in load_fleet().regions}
    for config in stub_fleet.configs:
        raw = shipped[config.name].model_copy(update={"endpoint": config.endpoint}).model_dump(mode="json")
        (regions / f"{config.name}.yaml").write_text(yaml.safe_dump(raw))
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path / "router.log"
    multiproc = tmp_path / "prometheus"
    command = [sys.executable, "-m", "scheduler.cli", "router", "--workers", "2", "--regions", str(regions),
               "--state", REDIS_URL, "--namespace", namespace, "--port", str(port), "--http-port", str(http_port),
               "--metrics-port", str(metrics_port), "--insecure", "--insecure-no-tickets", "--no-carbon-pollers",
               "--grace", "1"]
    with open(log, "wb") as out:
        parent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)})
    try:
        await wait_for(r"router listening on [^\n]+\(worker \d\)", log, 2)
        workers = {c.pid for c in psutil.Process(parent.pid).children()}
        assert len(workers) == 2
        body = {"model": "llama-3.1-8b", "prompt": "Hello", "max_tokens": 2}
        async def one() -> int:
            async with httpx.AsyncClient() as http:  # a new connection each: the kernel spreads them
                answer = await http.post(f"http://127.0.0.1:{http_port}/v1/completions", json=body)
                return answer.status_code

        assert await asyncio.gather(*(one() for _ in range(40))) == [200] * 40
        # Each scrape a new connection (either worker may answer): always both workers' sum.
        served = []
        for _ in range(6):
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            served.append(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                              if line.startswith("scheduler_router_requests_total") and 'code="OK"' in line))
        assert served == [40.0] * 6, served
        # Both workers counted (one file of counters each).
        assert len(list(multiproc.glob("counter_*.db"))) == 2
        # A counter read at scrape time from a worker's own parts (bytes its HTTP port received)
        # is summed too, once each worker wrote it (every second): every scrape says the same.
        await asyncio.sleep(1.5)
        received = set()
        for _ in range(6):
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            received |= {float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                         if line.startswith('scheduler_http_received_bytes_total{port="http"}')}
        assert len(received) == 1 and min(received) > 40 * len(b"POST /v1/completions"), received

        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        await wait_for(r"router listening on [^\n]+\(worker \d\)", log, 3)
        after = {c.pid for c in psutil.Process(parent.pid).children()}
        assert len(after) == 2 and victim not in after
    finally:
        parent.send_signal(signal.SIGTERM)
        code = parent.wait(30)
    assert code == 0
    assert multiproc.is_dir() and not list(multiproc.iterdir())  # the parent emptied it
    assert not [p for p in psutil.process_iter(["cmdline"]) if namespace in " ".join(p.info["cmdline"] or [])]
