"""scheduler.http.server against clients that cost without paying: a request ``authorize``
refuses is answered before 100 Continue and before its body, connections are capped per
address, a silent or slowloris connection and a slow body time out, and a client that stops
reading is cut (after the write timeout, or at its stream's ``max_s``), its handler unwinding."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping

import pytest

from scheduler.http.server import HttpRequest, HttpResponse, HttpServer, ServerLimits, StreamingResponse, error_response

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

KEY = "Bearer good"
LIMITS = ServerLimits(max_body_bytes=8 * 2**20, max_connections_per_client=3, header_timeout_s=0.5,
                      body_timeout_s=0.5, idle_timeout_s=0.5, write_timeout_s=0.5)


class App:
    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.auth: list[object] = []
        self.stream_ended = asyncio.Event()
        self.stream_cut = False

    async def upload(self, request: HttpRequest) -> HttpResponse:
        self.bodies.append(len(request.body))
        self.auth.append(request.auth)
        return HttpResponse(200, b"{}")

    async def big(self, request: HttpRequest) -> HttpResponse:
        """An answer larger than the kernel's buffers take."""
        return HttpResponse(200, b"x" * 8 * 2**20)

    async def flood(self, request: HttpRequest) -> StreamingResponse:
        """64 KiB chunks for as long as the client takes them."""
        max_s = float(request.query.removeprefix("max_s=")) if request.query else None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)
            except (asyncio.CancelledError, GeneratorExit):
                self.stream_cut = True
                raise
            finally:
                self.stream_ended.set()

        return StreamingResponse(200, chunks(), max_s=max_s)


def authorize(method: str, path: str, headers: Mapping[str, str]) -> object:
    if path == "/open":
        return None  # a health check: no key
    if headers.get("authorization") == KEY:
        return "the principal"
    return error_response(401, "missing or unknown key")


async def serve(app: App, limits: ServerLimits = LIMITS) -> tuple[HttpServer, int]:
    server = HttpServer({("POST", "/upload"): app.upload, ("GET", "/open"): app.upload,
                         ("GET", "/flood"): app.flood, ("GET", "/big"): app.big}, limits=limits, authorize=authorize)
    return server, await server.start("127.0.0.1", 0)


@pytest.fixture
async def served() -> AsyncIterator[tuple[App, HttpServer, int]]:
    app = App()
    server, port = await serve(app)
    try:
        yield app, server, port
    finally:
        await server.stop(grace_s=0.2)


async def read_all(reader: asyncio.StreamReader, within_s: float = 3.0) -> bytes:
    """Everything until the server closes (ECONNRESET counts as closed)."""
    data = b""
    try:
        async with asyncio.timeout(within_s):
            while chunk := await reader.read(65536):
                data += chunk
    except ConnectionResetError:
        pass
    return data


async def test_a_request_without_a_key_is_refused_before_100_continue_and_before_its_body(
    served: tuple[App, HttpServer, int],
) -> None:
    app, server, port = served
    head = b"POST /upload HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 5242880\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"authorization: Bearer stolen\r\n\r\n")
    answer = await read_all(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401") and b"100 Continue" not in answer
    assert b"connection: close" in answer and b"missing or unknown key" in answer
    assert server.stats.received_bytes <= len(head) + 40 and server.stats.refused["refused"] == 1
    # With the key: 100 Continue, then the body is read and the handler gets what authorize said.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /upload HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 5\r\n"
                 b"authorization: " + KEY.encode() + b"\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).startswith(b"HTTP/1.1 200")
    writer.close()
    assert app.bodies == [5] and app.auth == ["the principal"]


async def test_a_keyless_body_sent_at_once_is_answered_401_unread(served: tuple[App, HttpServer, int]) -> None:
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 5242880\r\n\r\n" + b"x" * 65536)
    answer = await read_all(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401")
    # At most what arrived with the headers in one read; the body was never buffered.
    assert server.stats.received_bytes <= 65536 + 100 and app.bodies == []


async def test_an_open_path_needs_no_key(served: tuple[App, HttpServer, int]) -> None:
    app, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /open HTTP/1.1\r\nhost: x\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).startswith(b"HTTP/1.1 200")
    writer.close()
    assert app.auth == [None]


async def test_connections_are_capped_per_address(served: tuple[App, HttpServer, int]) -> None:
    _, server, port = served
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        refused = await read_all(reader)
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503") and b"127.0.0.1 has 3 connections open here" in refused
        # Another address is not held back by this one.
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        writer.write(b"GET /open HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).startswith(b"HTTP/1.1 200")
        writer.close()
        # One of the three closes: the address may connect again.
        held.pop()[1].close()
        for _ in range(100):
            if server.connections < 3:
                break
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /open HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        for _, writer in held:
            writer.close()
    assert server.stats.refused["connections-per-client"] == 1


async def test_silent_slowloris_slow_body_and_idle_connections_are_closed(served: tuple[App, HttpServer, int]) -> None:
    _, server, port = served
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def silent() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await read_all(reader)
        finally:
            writer.close()

    async def trickle(first: bytes, piece: bytes) -> bytes:
        """``first``, then ``piece`` every 0.1 s until the server answers."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(first)
        answer = asyncio.ensure_future(read_all(reader))
        try:
            while not answer.done():
                await asyncio.sleep(0.1)
                if not writer.is_closing():
                    writer.write(piece)
            return answer.result()
        finally:
            writer.close()

    async def idle_after_a_request() -> bytes:
        # From another address: three connections are this fixture's cap per address.
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        writer.write(b"GET /open HTTP/1.1\r\nhost: x\r\n\r\n")
        try:
            return await read_all(reader)
        finally:
            writer.close()

    silence, slowloris, slow_body, idle = await asyncio.gather(
        silent(),
        trickle(b"GET /open HTTP/1.1\r\n", b"x-a: 1\r\n"),
        trickle(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\nauthorization: " + KEY.encode()
                + b"\r\n\r\n", b"y" * 10),
        idle_after_a_request())
    elapsed = loop.time() - started
    assert silence == b""
    assert slowloris.startswith(b"HTTP/1.1 408") and b"headers were not complete within 0.5 s" in slowloris
    assert slow_body.startswith(b"HTTP/1.1 408") and b"body was not complete within 0.5 s" in slow_body
    assert idle.startswith(b"HTTP/1.1 200") and idle.count(b"HTTP/1.1") == 1  # answered, then closed when idle
    assert elapsed < 2.5, f"closed after {elapsed:.1f} s"
    assert server.stats.refused["header-timeout"] == 1 and server.stats.refused["body-timeout"] == 1
    assert server.connections == 0


async def never_reading(port: int, request: bytes) -> socket.socket:
    """A client with a small receive buffer that sends ``request`` and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


@pytest.mark.parametrize("query, write_timeout_s, cut_within_s", [
    ("", 0.5, 3.0),
    # A stream whose own limit (max_s) comes before the write timeout is cut at it.
    ("?max_s=0.5", 20.0, 3.0),
], ids=["write-timeout", "stream-max-s"])
async def test_a_client_that_stops_reading_is_cut_and_its_stream_unwinds(query: str, write_timeout_s: float,
                                                                         cut_within_s: float) -> None:
    app = App()
    limits = ServerLimits(header_timeout_s=5, body_timeout_s=5, idle_timeout_s=5, write_timeout_s=write_timeout_s)
    server, port = await serve(app, limits)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        sock = await never_reading(port, f"GET /flood{query} HTTP/1.1\r\nhost: x\r\nauthorization: {KEY}\r\n\r\n"
                                   .encode())
        try:
            await asyncio.wait_for(app.stream_ended.wait(), cut_within_s)
        finally:
            sock.close()
        assert app.stream_cut and loop.time() - started < cut_within_s
        assert server.stats.refused["write-timeout"] == 1
    finally:
        await server.stop(grace_s=0.2)


async def test_a_closing_connection_whose_answer_is_never_read_is_dropped_after_the_write_timeout(
    served: tuple[App, HttpServer, int],
) -> None:
    _, server, port = served
    # Closed after its answer (connection: close), which never drains: a close waits for it, so
    # without the write timeout the connection would stay for as long as the client does not read.
    sock = await never_reading(port, b"GET /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: "
                               + KEY.encode() + b"\r\n\r\n")
    try:
        for want in (1, 0):  # accepted, then dropped
            for _ in range(300):
                if server.connections == want:
                    break
                await asyncio.sleep(0.01)
            assert server.connections == want
    finally:
        sock.close()
    assert server.stats.refused["write-timeout"] == 1
