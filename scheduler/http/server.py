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
connections than ``max_connections`` (or than ``max_connections_per_client`` from one remote
address) 503, request line and headers not complete within ``header_timeout_s`` of the
request's first byte (slowloris) 408, a body not complete within ``body_timeout_s`` of its
headers (a slow sender) 408, an unparsable request 400. A new connection must send its first
request's headers within ``header_timeout_s``, a kept-alive one its next request within
``idle_timeout_s``, or it is closed. A client that stops reading (its connection's write
buffer above the transport's high-water mark for ``write_timeout_s``, or past the
``max_s`` of the stream being written) has its connection aborted: its handler unwinds as
when a client leaves. Limits are checked by one sweep a second, not a timer per request.

``authorize`` (optional) sees each request's method, path and headers as soon as the headers
are complete, before ``Expect: 100-continue`` (curl sends it for bodies over 1 KB) is answered
and before any of the body is read: an ``HttpResponse`` it returns is sent at once and the
connection closed, the body unread; anything else reaches the handler as ``HttpRequest.auth``.
Errors are OpenAI-style JSON bodies (``{"error": {"message", "type", "param", "code"}}``).
``stats`` counts the bytes received and every connection a limit closed, by reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import http
import json
import logging
import math
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

log = logging.getLogger(__name__)

MAX_PIPELINED = 16
# Connections the kernel queues for accept (asyncio's default, 100, drops a burst's SYNs: their
# clients retry a second later, legitimate ones included).
LISTEN_BACKLOG = 1024
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
    # What the server's ``authorize`` hook returned for this request (None without one).
    auth: object = None


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
    # The longest the answer may take to send (None: no limit), enforced by the server while
    # the client is not reading; the handler ends a stream that runs long while it is.
    max_s: float | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpResponse | StreamingResponse]]
# (method, path, headers) -> an answer that refuses the request before its body, or its auth.
Authorize = Callable[[str, str, Mapping[str, str]], object]


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
    # Connections one remote address may hold at once (0: no cap). Behind a proxy that does not
    # keep client addresses, every client is the proxy's address.
    max_connections_per_client: int = 1_000
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    write_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name, least in (("max_header_bytes", 1), ("max_body_bytes", 0), ("max_connections", 1),
                            ("max_connections_per_client", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"ServerLimits.{name}: expected an integer >= {least}, got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "write_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"ServerLimits.{name}: expected seconds > 0, got {value!r}")


@dataclass
class ServerStats:
    """What a server counted since it started."""

    # Bytes read from clients' sockets (a request refused before its body shows it unread).
    received_bytes: int = 0
    # Requests and connections closed by a limit, by reason: connections,
    # connections-per-client, header-timeout, body-timeout, write-timeout, headers-too-large,
    # body-too-large, malformed, refused (by ``authorize``).
    refused: collections.Counter[str] = field(default_factory=collections.Counter)


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
    """The request is answered with this error (or ``response``) and the connection closed;
    ``reason`` names the limit in ``ServerStats.refused``."""

    def __init__(self, status: int, message: str, reason: str, response: HttpResponse | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.response = response


# What a connection's deadline ends: a wait between requests (the connection is closed), a
# request's headers or its body (408).
_IDLE, _HEADERS, _BODY = 0, 1, 2


@dataclass
class _Pending:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    auth: object


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        # The remote address, whose connections count against max_connections_per_client.
        self.client = ""
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        # When this connection's current wait ends (loop time; None: no limit) and what it
        # waits for (_IDLE, _HEADERS, _BODY): the server's sweep (every ``SWEEP_S``) acts then.
        # Cheaper than a timer per request.
        self._deadline: float | None = None
        self._deadline_kind = _IDLE
        # While the client is not reading: when its connection is aborted. The current
        # stream's own limit (``StreamingResponse.max_s``), as loop time.
        self._write_deadline: float | None = None
        self._answer_deadline: float | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._admitted = False
        self._reading_paused = False
        self._start_message()

    def _start_message(self) -> None:
        self._url = b""
        self._method = self._path = self._query = ""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._auth: object = None
        self._refused = False

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        refusal = self.server._admit(self)
        if refusal is not None:
            self._refuse(refusal)
            return
        self._admitted = True
        # A new connection has header_timeout_s to send its first request's headers.
        self._arm(self.limits.header_timeout_s, _IDLE)

    def data_received(self, data: bytes) -> None:
        self.server.stats.received_bytes += len(data)
        if self._closed or self._refused:
            return
        try:
            self._parser.feed_data(data)
            if self._queue and self._task is None:
                self._task = eager_task(self._serve())
        except _Refused as refused:
            self._refuse(refused)
        except httptools.HttpParserUpgrade:
            self._refuse(_Refused(400, "protocol upgrades are not supported", "malformed"))
        except httptools.HttpParserError as exc:
            # A limit raised in a parser callback comes back as the parser's callback error.
            cause = exc.__context__
            self._refuse(cause if isinstance(cause, _Refused) else
                         _Refused(400, f"malformed HTTP request: {exc}", "malformed"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._disarm()
        self._writable.set()
        self.server._forget(self)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()  # the client went away: its handler (a stream) unwinds

    def pause_writing(self) -> None:
        # The write buffer is above the high-water mark: the client is not reading as fast as
        # we write. Past the deadline the sweep aborts the connection.
        self._writable.clear()
        deadline = self.server.now + self.limits.write_timeout_s
        answer = self._answer_deadline
        self._write_deadline = deadline if answer is None or answer > deadline else answer
        self.server._unread.add(self)

    def resume_writing(self) -> None:
        self._writable.set()
        if not self._closed:  # (a closing transport keeps its deadline until it has written all)
            self._write_deadline = None
            self.server._unread.discard(self)

    # --- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._start_message()
        self._arm(self.limits.header_timeout_s, _HEADERS)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._method = self._parser.get_method().decode("latin-1")
        self._path, _, self._query = self._url.decode("latin-1").partition("?")
        authorize = self.server.authorize
        if authorize is not None:
            # Before 100 Continue and before any of the body: a refusal costs the headers only.
            verdict = authorize(self._method, self._path, self._headers)
            if isinstance(verdict, HttpResponse):
                raise _Refused(verdict.status, "", "refused", verdict)
            self._auth = verdict
        declared = self._headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            raise _Refused(413, f"the body may be at most {self.limits.max_body_bytes:,} bytes "
                                f"(content-length {int(declared):,})", "body-too-large")
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(self.limits.body_timeout_s, _BODY)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            raise _Refused(413, f"the body may be at most {self.limits.max_body_bytes:,} bytes", "body-too-large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._queue.append(_Pending(self._method, self._path, self._query, self._headers, b"".join(self._body),
                                    self._parser.should_keep_alive(), self._auth))
        if len(self._queue) > MAX_PIPELINED:
            raise _Refused(400, f"more than {MAX_PIPELINED} pipelined requests", "malformed")
        if len(self._queue) > 1 and self.transport is not None and not self._reading_paused:
            # A pipelining client: read no more until the answers are out. A lone request keeps
            # the socket read (a client that goes away is seen at once, and no two syscalls).
            self.transport.pause_reading()
            self._reading_paused = True

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.limits.max_header_bytes:
            raise _Refused(431, f"the request line and headers may be at most {self.limits.max_header_bytes:,} bytes",
                           "headers-too-large")

    # --- timers -------------------------------------------------------------------------

    def _arm(self, seconds: float, kind: int) -> None:
        self._deadline = self.server.now + seconds
        self._deadline_kind = kind

    def _disarm(self) -> None:
        self._deadline = None

    def expire(self) -> None:
        """The sweep found this connection past its deadline."""
        self._deadline = None
        if self._deadline_kind == _HEADERS:
            self._refuse(_Refused(408, f"the request line and headers were not complete within "
                                       f"{self.limits.header_timeout_s:g} s", "header-timeout"))
        elif self._deadline_kind == _BODY:
            self._refuse(_Refused(408, f"the request body was not complete within {self.limits.body_timeout_s:g} s "
                                       "of its headers", "body-timeout"))
        elif self._task is None:
            self.close()  # no request within header_timeout_s of connecting, or idle_timeout_s of the last

    def stalled(self) -> None:
        """The sweep found the client not reading past the write deadline: abort; the handler
        unwinds as when a client leaves."""
        self.server.stats.refused["write-timeout"] += 1
        self.abort()

    def abort(self) -> None:
        """Close now, dropping what is not written (a close would wait for it to drain)."""
        self._write_deadline = None
        self.server._unread.discard(self)
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    # --- answering ----------------------------------------------------------------------

    def _refuse(self, refused: _Refused) -> None:
        """Answer with the error (unless an answer is being written) and close."""
        self._refused = True
        self._queue.clear()
        self.server.stats.refused[refused.reason] += 1
        if self._task is None and self.transport is not None and not self._closed:
            response = refused.response or error_response(refused.status, refused.message)
            self.transport.write(_head(response.status, response.content_type, response.headers, len(response.body),
                                       True, self.server.name) + response.body)
        self.close()

    def close(self) -> None:
        transport = self.transport
        if transport is not None and not self._closed:
            if transport.get_write_buffer_size() and self._write_deadline is None:
                # The transport closes once the answer is written: a client that does not read
                # it gets write_timeout_s, as while writing is paused.
                self._write_deadline = self.server.now + self.limits.write_timeout_s
                self.server._unread.add(self)
            transport.close()
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
            if self._deadline_kind == _IDLE or self._deadline is None:
                # Idle from now, unless a next request has begun arriving (its own limit runs).
                self._arm(self.limits.idle_timeout_s, _IDLE)
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
        if response.max_s is not None:
            self._answer_deadline = self.server.now + response.max_s
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
            self._answer_deadline = None
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


@dataclass
class HttpServer:
    routes: Mapping[tuple[str, str], Handler]
    limits: ServerLimits = field(default_factory=ServerLimits)
    name: str = "carbon-scheduler"
    # Checks each request when its headers are complete (module docstring); None: none.
    authorize: Authorize | None = None
    stats: ServerStats = field(default_factory=ServerStats, init=False)
    stopping: bool = field(default=False, init=False)
    # The loop's clock at the last sweep (deadlines are set from it: a sweep's resolution).
    now: float = field(default=0.0, init=False)
    _server: asyncio.Server | None = field(default=None, init=False, repr=False)
    _connections: set[_ServerConnection] = field(default_factory=set, init=False, repr=False)
    # Open connections per remote address (only addresses with some).
    _per_client: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    # Connections whose client has not read what was written (writing paused, or closing with
    # an answer unwritten): their write deadline runs.
    _unread: set[_ServerConnection] = field(default_factory=set, init=False, repr=False)
    _paths: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    _sweeper: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._paths = frozenset(path for _, path in self.routes)
        limits = self.limits
        self._sweep_s = min(SWEEP_S, limits.header_timeout_s / 4, limits.body_timeout_s / 4,
                            limits.idle_timeout_s / 4, limits.write_timeout_s / 4)

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                    reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: any free port; ``reuse_port``: beside other processes on
        it, SO_REUSEPORT); returns the port."""
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        self._sweeper = loop.call_later(self._sweep_s, self._sweep)
        self._server = await loop.create_server(lambda: _ServerConnection(self), host, port, ssl=ssl_context,
                                                reuse_address=True, reuse_port=reuse_port or None,
                                                backlog=LISTEN_BACKLOG)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = self.now = loop.time()
        for connection in [c for c in self._connections if c._deadline is not None and c._deadline <= now]:
            connection.expire()
        for connection in [c for c in self._unread if c._write_deadline is not None and c._write_deadline <= now]:
            connection.stalled()
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
        # Answers still being written get what is left of the grace; then they are dropped.
        while self._unread and loop.time() < until:
            await asyncio.sleep(0.01)
        for connection in list(self._unread):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def connections(self) -> int:
        return len(self._connections)

    def _admit(self, connection: _ServerConnection) -> _Refused | None:
        """Count a new connection in, or say why not."""
        limits = self.limits
        if len(self._connections) >= limits.max_connections:
            return _Refused(503, f"the server has {limits.max_connections:,} connections open; retry", "connections")
        per_client = limits.max_connections_per_client
        held = self._per_client.get(connection.client, 0)
        if per_client and held >= per_client:
            return _Refused(503, f"{connection.client} has {per_client:,} connections open here, the most one "
                                 "address may; reuse them (keep-alive)", "connections-per-client")
        self._per_client[connection.client] = held + 1
        self._connections.add(connection)
        return None

    def _forget(self, connection: _ServerConnection) -> None:
        self._unread.discard(connection)
        if not connection._admitted:
            return
        connection._admitted = False
        self._connections.discard(connection)
        held = self._per_client.get(connection.client, 0) - 1
        if held > 0:
            self._per_client[connection.client] = held
        else:
            self._per_client.pop(connection.client, None)

    async def _answer(self, pending: _Pending, peer: str) -> HttpResponse | StreamingResponse:
        handler = self.routes.get((pending.method, pending.path))
        if handler is None:
            if pending.path in self._paths:
                allowed = sorted(m for m, p in self.routes if p == pending.path)
                return error_response(405, f"{pending.method} is not allowed on {pending.path} "
                                           f"(allowed: {', '.join(allowed)})", headers=(("allow", ", ".join(allowed)),))
            return error_response(404, f"no such endpoint: {pending.method} {pending.path}", code="not_found")
        request = HttpRequest(pending.method, pending.path, pending.query, pending.headers, pending.body, peer,
                              pending.auth)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("HTTP handler for %s %s failed", pending.method, pending.path)
            return error_response(500, "internal error (the server's log has the details)", code="internal_error")
