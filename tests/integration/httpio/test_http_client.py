"""scheduler.http.client against servers it did not come with: uvicorn + Starlette (the stub
region, an OpenAI-format SSE server) and raw sockets that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from scheduler.http.client import ConnectError, HttpClient, ReadTimeout, RemoteProtocolError, split_url
from scheduler.server.stub_region import StubRegion, StubRegionSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
async def stub() -> AsyncIterator[StubRegion]:
    region = await StubRegion(StubRegionSettings(name="eu-north")).start()
    try:
        yield region
    finally:
        await region.stop()


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(serve: Serve) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running ``serve`` per connection; yields its URL and the connections' ports."""
    ports: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports.append(writer.get_extra_info("peername")[1])
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", ports
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


async def test_streams_an_sse_completion_and_reuses_the_connection(stub: StubRegion) -> None:
    body = json.dumps({"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 4, "stream": True}).encode()
    client = HttpClient()
    try:
        for _ in range(3):
            async with client.stream("POST", f"{stub.endpoint}/v1/completions", body=body,
                                     headers={"content-type": "application/json"}) as response:
                assert response.status == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                text = b"".join([data async for data in response.chunks()])
            assert text.count(b"data: ") == 6 and text.rstrip().endswith(b"data: [DONE]")  # 4 tokens, usage, DONE
        assert len(client._idle[split_url(stub.endpoint)[0]]) == 1  # one connection served all three
        status, _, error = await client.request("POST", f"{stub.endpoint}/v1/completions", body=b"{}")
        assert status == 400 and json.loads(error)["error"]["param"]
    finally:
        await client.aclose()


async def test_a_body_left_unread_closes_its_connection(stub: StubRegion) -> None:
    body = json.dumps({"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 64, "stream": True}).encode()
    client = HttpClient()
    try:
        async with client.stream("POST", f"{stub.endpoint}/v1/completions", body=body) as response:
            assert response.status == 200  # nothing read
        assert not client._idle.get(split_url(stub.endpoint)[0])
    finally:
        await client.aclose()


async def test_a_silent_server_is_a_read_timeout_and_the_caller_is_not_cancelled() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with raw_server(silent) as (url, _):
        client = HttpClient(read_timeout_s=0.2)
        try:
            with pytest.raises(ReadTimeout, match="no response"):
                await client.request("GET", url)
            await asyncio.sleep(0.01)  # this task's next await: not a stray cancel
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0
        finally:
            await client.aclose()


async def test_a_server_that_closed_an_idle_connection_gets_the_request_on_a_new_one() -> None:
    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)  # then close the kept-alive connection, as an idle timeout would

    async with raw_server(once_then_close) as (url, ports):
        client = HttpClient()
        try:
            assert (await client.request("GET", url))[2] == b"ok"
            await asyncio.sleep(0.2)
            assert (await client.request("GET", url))[2] == b"ok"
        finally:
            await client.aclose()
    assert len(set(ports)) == 2


async def test_garbage_and_a_cut_response_are_protocol_errors() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SPDY/9 hello\r\n\r\n")
        await writer.drain()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly some")
        await writer.drain()

    client = HttpClient(read_timeout_s=2.0)
    try:
        async with raw_server(garbage) as (url, _):
            with pytest.raises(RemoteProtocolError, match="malformed"):
                await client.request("GET", url)
        async with raw_server(cut) as (url, _):
            with pytest.raises(RemoteProtocolError, match="closed the connection"):
                await client.request("GET", url)
    finally:
        await client.aclose()


async def test_a_closed_port_is_a_connect_error_and_header_injection_is_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpClient()
    try:
        with pytest.raises(ConnectError, match="cannot connect"):
            await client.request("GET", f"http://127.0.0.1:{port}/")
        with pytest.raises(ValueError, match="CR, LF"):
            await client.request("GET", f"http://127.0.0.1:{port}/", headers={"x-ticket": "a\r\nx-admin: 1"})
        with pytest.raises(ValueError, match="http"):
            await client.request("GET", "ftp://example.org/")
    finally:
        await client.aclose()


async def test_the_connection_limit_queues_then_times_out() -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with raw_server(slow) as (url, _):
        client = HttpClient(max_connections=1, connect_timeout_s=0.2)
        try:
            first = asyncio.ensure_future(client.request("GET", url))
            await asyncio.sleep(0.05)
            with pytest.raises(ConnectError, match="connection limit"):
                await client.request("GET", url)
            release.set()
            assert (await first)[0] == 200
        finally:
            await client.aclose()
