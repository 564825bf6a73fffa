"""scheduler.http.server driven by clients it did not come with: httpx, and raw sockets for
what a careless or hostile client sends (garbage, huge headers and bodies, a trickle,
pipelining, Expect: 100-continue, a disconnect mid-stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from scheduler.http.client import HttpClient
from scheduler.http.server import HttpRequest, HttpResponse, HttpServer, ServerLimits, StreamingResponse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class App:
    """Routes for the tests: an echo, a stream of N chunks, a failing handler and stream."""

    def __init__(self) -> None:
        self.stream_ended: asyncio.Event = asyncio.Event()
        self.stream_cancelled = False
        self.slow_started: asyncio.Event = asyncio.Event()
        self.slow_cancelled: asyncio.Event = asyncio.Event()

    async def echo(self, request: HttpRequest) -> HttpResponse:
        body = {"method": request.method, "path": request.path, "query": request.query,
                "auth": request.headers.get("authorization"), "body": request.body.decode()}
        return HttpResponse(200, json.dumps(body).encode(), headers=(("x-echo", "1"),))

    async def stream(self, request: HttpRequest) -> StreamingResponse:
        count = int(request.query.removeprefix("n=") or 3)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                for i in range(count):
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                self.stream_cancelled = True
                raise
            finally:
                self.stream_ended.set()

        return StreamingResponse(200, chunks())

    async def slow(self, request: HttpRequest) -> HttpResponse:
        self.slow_started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            self.slow_cancelled.set()
            raise
        return HttpResponse(200, b"{}")

    async def broken(self, request: HttpRequest) -> HttpResponse:
        raise RuntimeError("a bug")

    async def broken_stream(self, request: HttpRequest) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: 0\n\n"
            raise RuntimeError("a bug half-way")

        return StreamingResponse(200, chunks())


@pytest.fixture
async def served() -> AsyncIterator[tuple[App, str, HttpServer]]:
    app = App()
    server = HttpServer({("POST", "/echo"): app.echo, ("GET", "/echo"): app.echo, ("GET", "/stream"): app.stream,
                         ("GET", "/slow"): app.slow,
                         ("GET", "/broken"): app.broken, ("GET", "/broken-stream"): app.broken_stream},
                        limits=ServerLimits(max_header_bytes=4096, max_body_bytes=10_000, max_connections=8,
                                            header_timeout_s=0.5, body_timeout_s=0.5))
    port = await server.start("127.0.0.1", 0)
    try:
        yield app, f"http://127.0.0.1:{port}", server
    finally:
        await server.stop(grace_s=0.5)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TCP connection to the server at ``url``."""
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def raw(url: str, data: bytes, read_for_s: float = 0.5) -> bytes:
    reader, writer = await connect(url)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(read_for_s):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)
    finally:
        writer.close()


async def test_answers_routes_with_keep_alive_and_openai_errors(served: tuple[App, str, HttpServer]) -> None:
    _, url, _ = served
    async with httpx.AsyncClient() as client:
        echo = await client.post(f"{url}/echo?x=1", content=b"hello", headers={"authorization": "Bearer k"})
        again = await client.get(f"{url}/echo")
        missing = await client.get(f"{url}/nowhere")
        wrong = await client.delete(f"{url}/echo")
        broken = await client.get(f"{url}/broken")
    assert echo.status_code == 200 and echo.headers["x-echo"] == "1"
    assert echo.json() == {"method": "POST", "path": "/echo", "query": "x=1", "auth": "Bearer k", "body": "hello"}
    assert again.json()["method"] == "GET"
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST"
    assert broken.status_code == 500 and "a bug" not in broken.text  # no internals to the client


async def test_streams_chunked_and_a_client_that_leaves_cancels_the_stream(served: tuple[App, str, HttpServer]) -> None:
    app, url, _ = served
    async with httpx.AsyncClient() as client:
        async with client.stream("GET", f"{url}/stream?n=3") as response:
            assert response.headers["transfer-encoding"] == "chunked"
            body = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        app.stream_ended.clear()
        async with client.stream("GET", f"{url}/stream?n=1000") as response:
            async for _ in response.aiter_bytes():
                break  # leave after the first chunk
    await asyncio.wait_for(app.stream_ended.wait(), 5)
    assert app.stream_cancelled


async def test_a_stream_failing_half_way_is_cut_not_finished(served: tuple[App, str, HttpServer]) -> None:
    _, url, _ = served
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", f"{url}/broken-stream") as response:
                async for _ in response.aiter_bytes():
                    pass


async def test_limits_are_answered_with_their_status(served: tuple[App, str, HttpServer]) -> None:
    _, url, _ = served
    too_big = await raw(url, b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 20000\r\n\r\n")
    chunked_big = await raw(url, b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                                 + b"".join(b"%x\r\n%s\r\n" % (1000, b"a" * 1000) for _ in range(11)))
    huge_headers = await raw(url, b"GET /echo HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 5000 + b"\r\n\r\n")
    garbage = await raw(url, b"\x16\x03\x01 this is not http\r\n\r\n")
    trickle = await raw(url, b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nab", read_for_s=1.5)
    assert too_big.startswith(b"HTTP/1.1 413") and b"content-length 20,000" in too_big
    assert chunked_big.startswith(b"HTTP/1.1 413")
    assert huge_headers.startswith(b"HTTP/1.1 431")
    assert garbage.startswith(b"HTTP/1.1 400")
    assert trickle.startswith(b"HTTP/1.1 408")


async def test_pipelined_requests_are_answered_in_order_and_100_continue_is_sent(
    served: tuple[App, str, HttpServer],
) -> None:
    _, url, _ = served
    pipelined = await raw(url, b"GET /echo?n=1 HTTP/1.1\r\nhost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nhost: x\r\n\r\n")
    assert pipelined.count(b"HTTP/1.1 200") == 2 and pipelined.index(b"n=1") < pipelined.index(b"n=2")

    reader, writer = await connect(url)
    try:
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


async def test_a_client_that_leaves_during_an_unstreamed_answer_cancels_it_at_once(
    served: tuple[App, str, HttpServer],
) -> None:
    app, url, server = served
    _, writer = await connect(url)
    writer.write(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.wait_for(app.slow_started.wait(), 2)
    writer.close()
    # Nothing was being written: only the socket's read end can tell the client went away.
    await asyncio.wait_for(app.slow_cancelled.wait(), 2)
    assert await _drained(server)


async def _drained(server: HttpServer) -> bool:
    for _ in range(100):
        if server.connections == 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_requests_sent_while_a_stream_runs_are_answered_after_it_in_order(
    served: tuple[App, str, HttpServer],
) -> None:
    _, url, _ = served
    reader, writer = await connect(url)
    try:
        writer.write(b"GET /stream?n=20 HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"data: 0"), 2)
        # Three more, one write each, while the stream is still being answered.
        for n in range(3):
            writer.write(f"GET /echo?n={n} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            await asyncio.sleep(0.02)
        data = b""
        async with asyncio.timeout(5):
            while data.count(b'"path": "/echo"') < 3:
                data += await reader.read(65536)
        assert b"data: 19" in data and b"0\r\n\r\n" in data
        order = [data.index(f"n={n}".encode()) for n in range(3)]
        assert data.index(b"data: 19") < order[0] < order[1] < order[2]
    finally:
        writer.close()


async def test_connections_past_the_limit_get_503(served: tuple[App, str, HttpServer]) -> None:
    _, url, server = served
    held = [await connect(url) for _ in range(8)]
    try:
        await asyncio.sleep(0.05)
        assert server.connections == 8
        assert (await raw(url, b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 503")
    finally:
        for _, writer in held:
            writer.close()


async def test_the_lean_client_and_server_speak_to_each_other(served: tuple[App, str, HttpServer]) -> None:
    _, url, _ = served
    client = HttpClient()
    try:
        for _ in range(3):
            async with client.stream("GET", f"{url}/stream?n=5") as response:
                body = await response.read()
            assert body.count(b"data:") == 5
        status, _, echoed = await client.request("POST", f"{url}/echo", body=b"x" * 9000)
        assert status == 200 and len(json.loads(echoed)["body"]) == 9000
    finally:
        await client.aclose()
