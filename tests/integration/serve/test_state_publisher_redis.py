"""The region state publisher against real Redis (DB 4) and a real HTTP ``/state`` server."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from scheduler.region.publisher import HttpStateSource, RegionStatePublisher
from scheduler.state import codec, keys
from scheduler.state.factory import open_store
from scheduler.types import PoolLiveState, RegionLiveState

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_REGIONS", "redis://127.0.0.1:6379/4")

pytestmark = pytest.mark.integration

STATE = RegionLiveState(
    region="ap-northeast", healthy=True, observed_at=1_800_000_000.5,
    pools={"h100-chat": PoolLiveState(queue_depth=1, running=4, kv_cache_usage=0.1, prefix_cache_hit_rate=0.2)},
)


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-regions-{uuid.uuid4().hex[:10]}"
    yield name
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        found = [key async for key in client.scan_iter(match=f"sched:{name}:*")]
        if found:
            await client.delete(*found)
    finally:
        await client.aclose()


async def test_publishes_to_redis_with_a_ttl(namespace: str) -> None:
    store = open_store(REDIS_URL, namespace)

    async def source() -> RegionLiveState:
        return STATE

    try:
        await RegionStatePublisher(region="ap-northeast", source=source, store=store, ttl_s=60).publish_once()
        raw = await store.get(keys.region_state("ap-northeast"))
        assert raw is not None and codec.decode_region_state(raw) == STATE
    finally:
        await store.close()
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        ttl = await client.pttl(f"sched:{namespace}:{keys.region_state('ap-northeast')}")
    finally:
        await client.aclose()
    assert 50_000 < ttl <= 60_000


async def test_redis_down_does_not_raise_and_publishes_nothing() -> None:
    store = open_store("redis://127.0.0.1:1/4", "unreachable")

    async def source() -> RegionLiveState:
        return STATE

    try:
        publisher = RegionStatePublisher(region="ap-northeast", source=source, store=store)
        assert await publisher.publish_once() is None
        assert publisher.published == 0
    finally:
        await store.close()


@pytest.fixture
async def state_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A plain asyncio HTTP server answering ``GET /r/state`` with whatever ``body[0]`` holds."""
    body = [codec.encode_region_state(STATE)]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        ok = request.startswith(b"GET /r/state ")
        payload = body[0] if ok else b"{}"
        status = b"200 OK" if ok else b"404 Not Found"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/r", body
    finally:
        server.close()
        await server.wait_closed()


async def test_http_state_source_reads_a_gateway_state(state_server: tuple[str, list[bytes]]) -> None:
    endpoint, body = state_server
    async with httpx.AsyncClient() as client:
        source = HttpStateSource(endpoint=endpoint, client=client)
        assert await source() == STATE
        body[0] = b"not json"
        assert await source() is None


async def test_http_state_source_of_a_dead_region_is_none() -> None:
    async with httpx.AsyncClient() as client:
        assert await HttpStateSource(endpoint="http://127.0.0.1:1/x", client=client, timeout_s=0.5)() is None
