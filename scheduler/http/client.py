"""``HttpClient``: HTTP/1.1 with keep-alive pools per origin and streamed response bodies.

    async with client.stream("POST", url, body=payload, headers={...}) as response:
        response.status, response.headers          # after the response's header block
        async for data in response.chunks():       # the body as it arrives (chunked decoded)
            ...

A connection goes back to its origin's pool when its response was read to the end and both
sides keep it alive; anything else closes it. A request that fails on a reused connection
before a single byte of answer came back (the server had closed it while idle) is sent once
more on a new connection. Header names and values are checked for CR/LF (no header
injection from a caller's value).

Timeouts never cancel the caller's task: every wait is a future that a timer fails with
``ReadTimeout`` / ``ConnectTimeout`` (on Python 3.11 a cancelling timeout can leave a stray
cancel behind, scheduler.tasks). ``connect_timeout_s`` bounds getting a connection (pool
wait, TCP and TLS handshakes); ``read_timeout_s`` bounds each wait for the header block or
for more body, and each call may pass its own (a stream's deadline shrinks it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# Pause reading from the socket while this much body waits for the consumer.
READ_BUFFER_HIGH = 1 << 20


class HttpError(Exception):
    """A request that got no (complete) answer: connection, protocol or timeout."""


class ConnectError(HttpError):
    pass


class ConnectTimeout(ConnectError, TimeoutError):
    pass


class ReadTimeout(HttpError, TimeoutError):
    pass


class RemoteProtocolError(HttpError):
    pass


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


@functools.lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str]:
    """(origin, path with query) of an http(s) URL; ``ValueError`` for anything else. Memoized:
    a client calls the same few URLs (a region's, the router's) for every request, and
    ``urlsplit`` costs more than the rest of a request's head."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(parts.scheme, parts.hostname, port), target


_FORBIDDEN_IN_NAME = frozenset("\r\n:")


def _check_header(name: str, value: str) -> None:
    if not _FORBIDDEN_IN_NAME.isdisjoint(name) or "\r" in value or "\n" in value:
        raise ValueError(f"header {name!r}: CR, LF (or ':' in the name) are not allowed")


def _end_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _fail_waiter(waiter: asyncio.Future[None], error: Exception) -> None:
    if not waiter.done():
        waiter.set_exception(error)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the response being read on it."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received_any = False
        self.error: HttpError | None = None
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = RemoteProtocolError(f"malformed HTTP response from {self.origin.host_header}: {exc}")
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            detail = f": {exc}" if exc else ""
            self.error = RemoteProtocolError(
                f"{self.origin.host_header} closed the connection before the response ended{detail}")
        self._wake()

    # --- httptools callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER_HIGH and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()

    # --- for the client ---------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float, what: str) -> None:
        """Until the next event on this connection, at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(max(0.0, timeout_s), _fail_waiter, waiter,
                                ReadTimeout(f"no {what} from {self.origin.host_header} within {timeout_s:.3g} s"))
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def wait_quietly(self, timeout_s: float) -> None:
        """Until the next event on this connection or ``timeout_s``, whichever comes first."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(max(0.0, timeout_s), _end_waiter, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take_body(self) -> bytes:
        data = b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class Response:
    """A response whose header block has arrived; the body is read with ``chunks``/``read``."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self.status = connection.status
        self.headers: Mapping[str, str] = connection.headers
        self.read_timeout_s = read_timeout_s

    @property
    def complete(self) -> bool:
        return self._connection.complete

    async def next_chunk(self, timeout_s: float | None = None) -> bytes | None:
        """The body that arrived since the last call (waiting for some, at most ``timeout_s``,
        default ``read_timeout_s``); None at the end of the body."""
        connection = self._connection
        while True:
            data = connection.take_body()
            if data:
                return data
            if connection.complete:
                return None
            if connection.error is not None:
                raise connection.error
            await connection.wait(self.read_timeout_s if timeout_s is None else timeout_s, "more of the body")

    async def more_within(self, seconds: float) -> bytes | None:
        """The body that arrives within ``seconds`` (b"" if none did: not an error), None at
        the end of the body."""
        connection = self._connection
        data = connection.take_body()
        if data:
            return data
        if connection.complete:
            return None
        if connection.error is not None:
            raise connection.error
        await connection.wait_quietly(seconds)
        data = connection.take_body()
        if data or not connection.complete:
            if not data and connection.error is not None:
                raise connection.error
            return data
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        while (data := await self.next_chunk()) is not None:
            yield data

    async def read(self) -> bytes:
        parts = [data async for data in self.chunks()]
        return b"".join(parts)


def _abandon(opening: asyncio.Future[tuple[asyncio.Transport, _Connection]]) -> None:
    """Cancel a connection attempt; one that completed as it was abandoned is closed."""
    if opening.cancel():
        return
    if not opening.cancelled() and opening.exception() is None:
        opening.result()[1].close()


class HttpClient:
    """Keep-alive connections per origin; at most ``max_connections`` requests at once."""

    def __init__(self, *, max_connections: int = 1024, max_idle_per_origin: int = 256,
                 connect_timeout_s: float = 2.0, read_timeout_s: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None, user_agent: str = "carbon-scheduler") -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_origin = max_idle_per_origin
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._user_agent = user_agent
        self._closed = False

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, *, body: bytes = b"", headers: Mapping[str, str] | None = None,
                     connect_timeout_s: float | None = None, read_timeout_s: float | None = None,
                     ) -> AsyncIterator[Response]:
        """Send the request; yields once the header block arrived. The connection is pooled
        again only if the body was read to its end."""
        if self._closed:
            raise RuntimeError("HttpClient is closed")
        origin, target = split_url(url)
        head = self._head(method, origin, target, headers or {}, len(body))
        connect_timeout = self.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        read_timeout = self.read_timeout_s if read_timeout_s is None else read_timeout_s
        await self._acquire_slot(connect_timeout, origin)
        connection: _Connection | None = None
        try:
            connection = await self._send(origin, head, body, connect_timeout, read_timeout)
            yield Response(connection, read_timeout)
        finally:
            self._slots.release()
            if connection is not None:
                self._release(connection)

    async def request(self, method: str, url: str, *, body: bytes = b"", headers: Mapping[str, str] | None = None,
                      connect_timeout_s: float | None = None, read_timeout_s: float | None = None,
                      ) -> tuple[int, Mapping[str, str], bytes]:
        """The whole response: (status, headers, body)."""
        async with self.stream(method, url, body=body, headers=headers, connect_timeout_s=connect_timeout_s,
                               read_timeout_s=read_timeout_s) as response:
            return response.status, response.headers, await response.read()

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    # --- internals ----------------------------------------------------------------------

    def _head(self, method: str, origin: Origin, target: str, headers: Mapping[str, str], length: int) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"host: {origin.host_header}", f"user-agent: {self._user_agent}"]
        if length or method not in ("GET", "HEAD"):
            lines.append(f"content-length: {length}")
        for name, value in headers.items():
            _check_header(name, value)
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _acquire_slot(self, timeout_s: float, origin: Origin) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        waiting = asyncio.ensure_future(self._slots.acquire())
        try:
            done, _ = await asyncio.wait({waiting}, timeout=timeout_s)
        except asyncio.CancelledError:
            if not waiting.cancel() and not waiting.cancelled():
                self._slots.release()  # it got the slot as the caller was cancelled
            raise
        if not done:
            waiting.cancel()
            raise ConnectTimeout(f"no free connection to {origin.host_header} within {timeout_s:.3g} s "
                                 "(the client's connection limit is reached)")

    async def _send(self, origin: Origin, head: bytes, body: bytes, connect_timeout: float,
                    read_timeout: float) -> _Connection:
        while True:
            connection = self._pooled(origin)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(origin, connect_timeout)
            connection.send(head, body)
            try:
                while not connection.headers_done:
                    if connection.error is not None:
                        raise connection.error
                    await connection.wait(read_timeout, "response")
            except RemoteProtocolError:
                connection.close()
                if reused and not connection.received_any:
                    continue  # the server had closed it while idle: once more on a new one
                raise
            except BaseException:
                connection.close()
                raise
            return connection

    def _pooled(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                connection.reused = True
                return connection
        return None

    async def _connect(self, origin: Origin, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.scheme == "https":
            tls = self._ssl or ssl.create_default_context()
        opening = asyncio.ensure_future(loop.create_connection(
            lambda: _Connection(origin), origin.host, origin.port, ssl=tls,
            server_hostname=origin.host if tls is not None else None))
        try:
            done, _ = await asyncio.wait({opening}, timeout=timeout_s)
        except asyncio.CancelledError:
            _abandon(opening)
            raise
        if not done:
            _abandon(opening)
            raise ConnectTimeout(f"no connection to {origin.host_header} within {timeout_s:.3g} s")
        try:
            _, protocol = opening.result()
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {origin.host_header}: {exc}") from None
        return protocol

    def _release(self, connection: _Connection) -> None:
        if not connection.reusable or self._closed:
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self.max_idle_per_origin:
            connection.close()
            return
        idle.append(connection)
