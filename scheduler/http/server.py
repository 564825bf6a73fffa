"""``HttpServer``: HTTP/1.1 on asyncio with httptools' parser, routes to handlers.

    server = HttpServer({("POST", "/v1/route"): route, ("GET", "/v1/models"): models})
    port = await server.start("127.0.0.1", 0)

A handler takes an ``HttpRequest`` (method, path, query, lower-cased headers, the whole body)
and returns an ``HttpResponse`` (sent with content-length) or a ``StreamingResponse``
(chunked transfer encoding, each chunk written as it is produced, with back-pressure: a slow
reader pauses the producer; a stream that raises ``AnswerInstead`` before its first chunk is
answered with that response instead, so a failure before anything was sent gets its status).
Requests on one connection are answered in order (pipelined ones wait their turn). A handler
runs at once, in the callback that read its request, up to its first wait (``eager_task``): an
answer that needs no I/O, such as a decision, is written there without a Task. A client that
goes away cancels its handler's task, so a stream's ``finally`` runs (where a receipt for what
was already sent gets booked).

Limits (``ServerLimits``), each answered as HTTP says and with the connection closed: a
header block over ``max_header_bytes`` 431, a body over ``max_body_bytes`` 413 (checked on
the declared content-length before the body is read, and while it arrives), more open
connections than ``max_connections`` 503, a request not complete within
``request_timeout_s`` of its first byte (a slow sender) 408, an unparsable request 400; a
keep-alive connection idle for ``idle_timeout_s`` is closed. ``Expect: 100-continue`` (curl
sends it for bodies over 1 KB) is answered before the body is read. Errors are OpenAI-style
JSON bodies (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import http
import json
import logging
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

log = logging.getLogger(__name__)

MAX_PIPELINED = 16
# How often the server closes connections past their deadline (at most; less for short limits).
SWEEP_S = 1.0


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: str
    # Lower-cased names; a repeated header keeps its last value.
    headers: Mapping[str, str]
    body: bytes
    peer: str = ""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StreamingResponse:
    status: int
    chunks: AsyncIterator[bytes]
    content_type: str = "text/event-stream"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[HttpRequest], Awaitable[HttpResponse | StreamingResponse]]


class AnswerInstead(Exception):
    """Raised by a ``StreamingResponse``'s chunks before the first one: send this answer
    instead (a stream that fails before it starts gets a proper status, not a 200)."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass(frozen=True)
class ServerLimits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 8 * 2**20
    max_connections: int = 10_000
    request_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                413: "invalid_request_error", 429: "rate_limit_error", 431: "invalid_request_error"}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    """An OpenAI-style error answer."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code if code is not None else status}}
    return HttpResponse(status, json.dumps(body).encode(), headers=headers)


_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in http.HTTPStatus}


def _head(status: int, content_type: str, headers: tuple[tuple[str, str], ...], length: int | None,
          close: bool, server: str) -> bytes:
    parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n", "server: ", server,
             "\r\ncontent-type: ", content_type,
             f"\r\ncontent-length: {length}\r\n" if length is not None else "\r\ntransfer-encoding: chunked\r\n"]
    if close:
        parts.append("connection: close\r\n")
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"response header {name!r}: CR/LF not allowed")
        parts += (name, ": ", value, "\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


def _resumed(coro: Coroutine[Any, Any, None], awaiting: Any) -> Generator[Any, Any, None]:
    """The rest of ``coro``, which was stepped by hand and is suspended on ``awaiting`` (what
    it yielded to the event loop): a generator a Task can run, passing on what the Task sends
    or throws (a cancellation included) as ``yield from`` would. Python 3.11 only: from 3.12 a
    Task takes nothing but coroutines."""
    while True:
        try:
            sent = yield awaiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # thrown in by the Task (a cancellation): the coroutine handles it
            try:
                awaiting = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                awaiting = coro.send(sent)
            except StopIteration:
                return


def eager_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, up to its first suspension: None when it finished without one, else a
    Task that runs the rest (in the same context). An answer that needs no I/O (a decision) is
    then written in the callback that read its request, without a Task and a trip through the
    loop's ready queue. An exception raised before the first suspension is raised here."""
    context = contextvars.copy_context()
    if sys.version_info >= (3, 12):
        task = asyncio.eager_task_factory(asyncio.get_running_loop(), coro, context=context)
        if not task.done():
            return task
        task.result()  # raises what the coroutine raised, if it did
        return None
    # Python 3.11 has no eager tasks: step the coroutine by hand and give a Task the rest.
    try:
        awaiting = context.run(coro.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_resumed(coro, awaiting), context=context)  # type: ignore[arg-type]


class _Refused(Exception):
    """The request is answered with this error and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Pending:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        # When this connection's current wait ends (loop time; None: no limit): the server's
        # sweep (every ``SWEEP_S``) closes it then. Cheaper than a timer per request.
        self._deadline: float | None = None
        self._deadline_is_request = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._reading_paused = False
        self._start_message()

    def _start_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._refused = False

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        if not self.server._admit(self):
            self._refuse(_Refused(503, f"the server has {self.limits.max_connections} connections open; retry"))
            return
        self._arm(self.limits.idle_timeout_s, request=False)

    def data_received(self, data: bytes) -> None:
        if self._closed or self._refused:
            return
        try:
            self._parser.feed_data(data)
            if self._queue and self._task is None:
                self._task = eager_task(self._serve())
        except _Refused as refused:
            self._refuse(refused)
        except httptools.HttpParserUpgrade:
            self._refuse(_Refused(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            # A limit raised in a parser callback comes back as the parser's callback error.
            cause = exc.__context__
            self._refuse(cause if isinstance(cause, _Refused) else _Refused(400, f"malformed HTTP request: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._disarm()
        self._writable.set()
        self.server._forget(self)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()  # the client went away: its handler (a stream) unwinds

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._start_message()
        self._arm(self.limits.request_timeout_s, request=True)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        declared = self._headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            raise _Refused(413, f"the body may be at most {self.limits.max_body_bytes:,} bytes "
                                f"(content-length {int(declared):,})")
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            raise _Refused(413, f"the body may be at most {self.limits.max_body_bytes:,} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._disarm()
        target = self._url.decode("latin-1")
        path, _, query = target.partition("?")
        parser = self._parser
        method = parser.get_method().decode("latin-1")
        self._queue.append(_Pending(method, path, query, self._headers, b"".join(self._body),
                                    parser.should_keep_alive()))
        if len(self._queue) > MAX_PIPELINED:
            raise _Refused(400, f"more than {MAX_PIPELINED} pipelined requests")
        if len(self._queue) > 1 and self.transport is not None and not self._reading_paused:
            # A pipelining client: read no more until the answers are out. A lone request keeps
            # the socket read (a client that goes away is seen at once, and no two syscalls).
            self.transport.pause_reading()
            self._reading_paused = True

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.limits.max_header_bytes:
            raise _Refused(431, f"the request line and headers may be at most {self.limits.max_header_bytes:,} bytes")

    # --- timers -------------------------------------------------------------------------

    def _arm(self, seconds: float, request: bool) -> None:
        self._deadline = self.server.now + seconds
        self._deadline_is_request = request

    def _disarm(self) -> None:
        self._deadline = None

    def expire(self) -> None:
        """The sweep found this connection past its deadline."""
        self._deadline = None
        if self._deadline_is_request:
            self._refuse(_Refused(408, f"the request was not complete within {self.limits.request_timeout_s:g} s"))
        elif self._task is None:
            self.close()  # idle between requests for idle_timeout_s

    # --- answering ----------------------------------------------------------------------

    def _refuse(self, refused: _Refused) -> None:
        """Answer with the error (unless an answer is being written) and close."""
        self._refused = True
        self._queue.clear()
        if self._task is None and self.transport is not None and not self._closed:
            response = error_response(refused.status, refused.message)
            self.transport.write(_head(response.status, response.content_type, (), len(response.body), True,
                                       self.server.name) + response.body)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.close()
        self._closed = True

    async def _serve(self) -> None:
        try:
            while self._queue and not self._closed:
                pending = self._queue.popleft()
                keep_alive = pending.keep_alive and not self.server.stopping
                response = await self.server._answer(pending, self.peer)
                try:
                    await self._write(response, close=not keep_alive)
                except Exception:
                    # A stream that fails half-way: closing without the last chunk tells the client.
                    log.exception("HTTP answer to %s %s failed while being sent", pending.method, pending.path)
                    self.close()
                    return
                if not keep_alive:
                    self.close()
                    return
        except asyncio.CancelledError:
            self.close()  # the client went away (or the server stops): the answer is cut
            return
        finally:
            self._task = None
        if not self._closed and self.transport is not None:
            if not self._deadline_is_request or self._deadline is None:
                # Idle from now, unless a next request has begun arriving (its own limit runs).
                self._arm(self.limits.idle_timeout_s, request=False)
            if self._reading_paused:
                self._reading_paused = False
                self.transport.resume_reading()

    async def _write(self, response: HttpResponse | StreamingResponse, close: bool) -> None:
        transport = self.transport
        assert transport is not None
        name = self.server.name
        if isinstance(response, HttpResponse):
            transport.write(_head(response.status, response.content_type, response.headers, len(response.body),
                                  close, name) + response.body)
            return
        chunks = response.chunks
        try:
            try:
                first: bytes | None = await anext(chunks)
            except StopAsyncIteration:
                first = None
            except AnswerInstead as instead:
                answer = instead.response
                transport.write(_head(answer.status, answer.content_type, answer.headers, len(answer.body), close,
                                      name) + answer.body)
                return
            head = _head(response.status, response.content_type, response.headers, None, close, name)
            if first is None:
                transport.write(head + b"0\r\n\r\n")
                return
            # The head leaves with the first chunk: one write, one segment.
            transport.write(head + b"%x\r\n%b\r\n" % (len(first), first) if first else head)
            writable = self._writable
            if not writable.is_set():
                await writable.wait()
            if self._closed:
                return
            async for chunk in chunks:
                if chunk:
                    transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    if not writable.is_set():
                        await writable.wait()
                if self._closed:
                    return
            transport.write(b"0\r\n\r\n")
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


@dataclass
class HttpServer:
    routes: Mapping[tuple[str, str], Handler]
    limits: ServerLimits = field(default_factory=ServerLimits)
    name: str = "carbon-scheduler"
    stopping: bool = field(default=False, init=False)
    # The loop's clock at the last sweep (deadlines are set from it: a sweep's resolution).
    now: float = field(default=0.0, init=False)
    _server: asyncio.Server | None = field(default=None, init=False, repr=False)
    _connections: set[_ServerConnection] = field(default_factory=set, init=False, repr=False)
    _paths: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    _sweeper: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._paths = frozenset(path for _, path in self.routes)
        limits = self.limits
        self._sweep_s = min(SWEEP_S, limits.request_timeout_s / 4, limits.idle_timeout_s / 4)

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                    reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: any free port; ``reuse_port``: beside other processes on
        it, SO_REUSEPORT); returns the port."""
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        self._sweeper = loop.call_later(self._sweep_s, self._sweep)
        self._server = await loop.create_server(lambda: _ServerConnection(self), host, port, ssl=ssl_context,
                                                reuse_address=True, reuse_port=reuse_port or None)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        for connection in [c for c in self._connections if c._deadline is not None and c._deadline <= self.now]:
            connection.expire()
        self._sweeper = loop.call_later(self._sweep_s, self._sweep)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting; let answers in progress finish for ``grace_s``; close the rest."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        until = loop.time() + grace_s
        while any(c._task is not None for c in self._connections) and loop.time() < until:
            await asyncio.sleep(0.01)
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def connections(self) -> int:
        return len(self._connections)

    def _admit(self, connection: _ServerConnection) -> bool:
        if len(self._connections) >= self.limits.max_connections:
            return False
        self._connections.add(connection)
        return True

    def _forget(self, connection: _ServerConnection) -> None:
        self._connections.discard(connection)

    async def _answer(self, pending: _Pending, peer: str) -> HttpResponse | StreamingResponse:
        handler = self.routes.get((pending.method, pending.path))
        if handler is None:
            if pending.path in self._paths:
                allowed = sorted(m for m, p in self.routes if p == pending.path)
                return error_response(405, f"{pending.method} is not allowed on {pending.path} "
                                           f"(allowed: {', '.join(allowed)})", headers=(("allow", ", ".join(allowed)),))
            return error_response(404, f"no such endpoint: {pending.method} {pending.path}", code="not_found")
        request = HttpRequest(pending.method, pending.path, pending.query, pending.headers, pending.body, peer)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("HTTP handler for %s %s failed", pending.method, pending.path)
            return error_response(500, "internal error (the server's log has the details)", code="internal_error")
