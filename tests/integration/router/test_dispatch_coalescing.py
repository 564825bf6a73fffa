"""The dispatcher against a region that paces its SSE events: the first text goes out at once,
later text arriving within the coalescing window joins one chunk, slower text does not, and a
finish reason sent in an event of its own (in a later read) is not lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.server.dispatch import COMPLETIONS, DispatchSettings, RegionCall, RegionDispatcher
from scheduler.types import Request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


def event(text: str, finish: str | None = None) -> bytes:
    body = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def paced_region(gaps_s: list[float]) -> tuple[asyncio.Server, str]:
    """Answers one POST with one token per gap (chunked), then a finish event, then [DONE]."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def chunk(data: bytes) -> None:
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))

        for i, gap in enumerate(gaps_s):
            await asyncio.sleep(gap)
            chunk(event(f"t{i} "))
            await writer.drain()
        await asyncio.sleep(0.05)
        chunk(event("", "length"))
        await writer.drain()
        await asyncio.sleep(0.05)
        chunk(b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def relay(gaps_s: list[float], coalesce_s: float) -> list[tuple[str, str]]:
    server, url = await paced_region(gaps_s)
    fleet = load_fleet()
    region = next(r for r in fleet.regions if r.name == "eu-north").model_copy(update={"endpoint": url})
    snapshot = SnapshotBuilder(compile_fleet((region,)), compile_policy(fleet.policy("default"))).build(0.0)
    decision = Scheduler.from_registry(default_scheduler_registry()).schedule(
        Request(request_id="r", model="llama-3.1-8b", prompt_tokens=8, max_tokens=8), snapshot)
    dispatcher = RegionDispatcher(DispatchSettings(coalesce_s=coalesce_s))
    try:
        stream = dispatcher.stream(decision, RegionCall(COMPLETIONS, {"prompt": "hi", "max_tokens": 8}), None, {})
        deltas: AsyncIterator = stream.__aiter__()
        return [(d.text, d.finish_reason) async for d in deltas]
    finally:
        await dispatcher.stop()
        server.close()
        await server.wait_closed()


async def test_text_within_the_window_joins_one_chunk_and_the_first_is_not_held() -> None:
    # The first token alone, then four 0.3 ms apart (within 20 ms), then a late one.
    deltas = await relay([0.0, 0.05, 0.0003, 0.0003, 0.0003, 0.2], coalesce_s=0.02)
    # t0 alone (the first text is never held); t1..t4 within the window of t1's read; t5 and
    # the finish reason (its own event, a later read, kept until [DONE]) after it.
    assert deltas == [("t0 ", ""), ("t1 t2 t3 t4 ", ""), ("t5 ", ""), ("", "length")]


async def test_without_coalescing_each_read_is_one_chunk() -> None:
    deltas = await relay([0.0, 0.05, 0.05, 0.05], coalesce_s=0.0)
    assert [text for text, _ in deltas] == ["t0 ", "t1 ", "t2 ", "t3 ", ""]
    assert deltas[-1][1] == "length"
