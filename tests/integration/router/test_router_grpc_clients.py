"""The gRPC port against clients that cost without paying, driven by a raw HTTP/2 client
(tests/h2_raw.py): a call without a valid key is refused from its headers with its message
unread (flow control lets at most one 64 KiB window of it in), a connection may open 100 calls
at once, and a client that stops reading is ended after the write timeout: its stream slot
given back, the text it was sent billed with end_reason ``cancelled``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest

from scheduler.server.app import GrpcLimits
from scheduler.state import keys as store_keys
from scheduler.state.memory_store import MemoryStore
from scheduler.v1 import messages_pb2 as pb
from tests.h2_raw import DEFAULT_WINDOW, SETTINGS_MAX_CONCURRENT_STREAMS, RawH2

from .conftest import Fleet, Keys, RouterFactory, stub_regions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

GENERATE = "/scheduler.v1.GlobalRouter/Generate"


async def until(condition: Callable[[], bool], within_s: float, what: str) -> float:
    """Seconds until ``condition`` held (AssertionError naming ``what`` if it never did)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within_s, f"{what} within {within_s} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_call_without_a_key_is_refused_before_its_message_is_read(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    connection = await RawH2.connect("127.0.0.1", router.port)
    try:
        await until(lambda: SETTINGS_MAX_CONCURRENT_STREAMS in connection.server_settings, 5, "the server's SETTINGS")
        assert connection.server_settings[SETTINGS_MAX_CONCURRENT_STREAMS] == 100
        started = time.monotonic()
        sent, stream = await connection.call(GENERATE, b"x" * (8 * 2**20), {"authorization": "Bearer sk-0000.nope"},
                                             send_for_s=3)
        await asyncio.wait_for(stream.ended.wait(), 5)
        refused_in = time.monotonic() - started
    finally:
        connection.close()
    # One stream window at most: the server never asked for the message.
    assert sent <= DEFAULT_WINDOW, f"the server let {sent:,} bytes of an unauthenticated message in"
    assert refused_in < 2.0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}",
                                         options=[("grpc.max_send_message_length", 64 * 2**20)]) as channel:
        generate = channel.unary_stream(GENERATE)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in generate(b"x" * (4 * 2**20), metadata=(("authorization", "Bearer sk-0000.nope"),),
                                    timeout=10):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        route = channel.unary_unary("/scheduler.v1.GlobalRouter/Route")
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await route(b"", timeout=10)
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    metrics = router.deps.metrics
    assert metrics.value("scheduler_router_requests_total", {"code": "UNAUTHENTICATED", "method": "Generate"}) == 2
    assert metrics.value("scheduler_router_requests_total", {"code": "UNAUTHENTICATED", "method": "Route"}) == 1


async def test_a_client_that_stops_reading_is_ended_and_billed_as_cancelled(
    make_router: RouterFactory, keys: Keys,
) -> None:
    store = MemoryStore()
    async with stub_regions() as fleet:
        router = await make_router(fleet.configs, keys=keys.ring, store=store,
                                   grpc_limits=GrpcLimits(write_timeout_s=0.5))
        request = pb.GenerateRequest(model="llama-3.1-8b", prompt="hi", sampling=pb.SamplingParams(max_tokens=4000))
        # A 4 KiB window, never acknowledged: the decision and some text, then nothing more fits.
        connection = await RawH2.connect("127.0.0.1", router.port, initial_window=4096)
        try:
            _, stream = await connection.call(GENERATE, request.SerializeToString(),
                                              {"authorization": f"Bearer {keys.tenant.key}"})
            slots = router.deps.slots
            await until(lambda: slots.held("acme") == 1, 5, "the stream to start")
            held_for = await until(lambda: slots.held("acme") == 0, 5, "the slot to come back")
            assert stream.received <= 4096 + 9 * 8  # the window (and frame headers), not more
            assert router.stalls.ended == {"write-timeout": 1}
        finally:
            connection.close()
    for _ in range(250):  # the audit writer flushes in the background
        entries = [fields for _, fields in await store.xrange(store_keys.AUDIT, 10)]
        if entries:
            break
        await asyncio.sleep(0.02)
    assert [(e["end_reason"], e["partial"]) for e in entries] == [("cancelled", "1")]
    assert 0.4 < held_for < 3.0
    assert router.deps.metrics.value("scheduler_router_requests_total",
                                     {"code": "CANCELLED", "method": "Generate"}) == 1
