"""Streaming a request to a region's OpenAI-compatible endpoint, failing over before the first token.

One ``scheduler.http.client.HttpClient`` per router (keep-alive pools shared by every
stream; httpx cost about 1 ms of CPU per request on these hosts, this a few tens of µs). For each
candidate of ``Decision.ranked`` in order: POST ``{endpoint}/v1/completions`` (or
``/v1/chat/completions``) with ``"stream": true``; a connect error, a timeout, a 5xx (or any
failure) before the first text reaches the client moves on to the next candidate and is
recorded; once text has been relayed, a failure ends the stream with a non-retryable
``Unavailable``. A 400/422 from the region is the request's fault: ``InvalidRequest``.

Every stream has a total deadline: the client's gRPC deadline, capped by the router-wide
``DispatchSettings.max_stream_s`` (``scheduler router --max-stream-s``), so a region that keeps
streaming cannot hold a router connection forever. Past it the stream ends with
``DeadlineExceeded`` (each read is bounded by the time left, not only by the silence between
reads).

While relaying, the stream counts the content events it passed on (``content_events``): a
partial receipt bills those when the region's usage (sent only in the final event) never came.

Text that arrives in one network read is relayed as one chunk; after the first text, text
arriving within ``DispatchSettings.coalesce_s`` (2 ms) joins it: fewer, larger messages to the
client, and the first token is never held back.

Besides text, a choice may carry what an OpenAI client reads too: a chat delta's tool calls or
reasoning, a choice's logprobs. They travel with the text (``TextDelta.delta_fields`` and
``logprobs``; events joined into one delta have theirs merged by ``merge_fields``) and count as
content, as text does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from scheduler import errors
from scheduler.http.client import HttpClient, HttpError, Response
from scheduler.server.tracing import NO_TRACE, RequestTrace, attempt_failed, attempt_span, usage_attributes
from scheduler.sse_parser import DONE_BYTES, MalformedEvent, SseParser, choice_text, openai_error, parse_event
from scheduler.tickets import HEADER as TICKET_HEADER
from scheduler.types import Candidate, Decision

log = logging.getLogger(__name__)

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
# Region answers that mean "this request is wrong" rather than "this region is unwell".
CLIENT_ERRORS = frozenset({400, 422})
# Coalescing waits only while reads come within this many windows of each other (a burst).
COALESCE_BURST = 4
# A chat delta's keys that carry its text (any other is relayed as ``TextDelta.delta_fields``).
_TEXT_DELTA_KEYS = frozenset({"content", "role"})
# Longest region error message kept (in failover records, receipts and statuses).
REGION_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class RegionCall:
    """The OpenAI request body to send (without model/stream, which the dispatcher sets)."""

    path: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class TextDelta:
    text: str
    finish_reason: str = ""
    # A chat delta's fields beside its text (tool_calls, reasoning_content ...), as the region
    # sent them; None: none.
    delta_fields: Mapping[str, Any] | None = None
    # The choice's logprobs, as the region sent them; None: none.
    logprobs: Mapping[str, Any] | None = None


def merge_fields(earlier: Mapping[str, Any] | None, later: Mapping[str, Any]) -> dict[str, Any]:
    """Two consecutive events' fields as one: strings and lists joined (reasoning text, tool-call
    deltas, logprobs' token lists), objects merged the same way, anything else the later one."""
    out = dict(earlier or {})
    for name, value in later.items():
        before = out.get(name)
        if isinstance(before, str) and isinstance(value, str):
            out[name] = before + value
        elif isinstance(before, list) and isinstance(value, list):
            out[name] = [*before, *value]
        elif isinstance(before, dict) and isinstance(value, dict):
            out[name] = merge_fields(before, value)
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class DispatchSettings:
    connect_timeout_s: float = 2.0
    # Longest silence between two reads, the wait for the first byte (prefill of a long prompt)
    # included; always capped by the request's deadline.
    read_timeout_s: float = 60.0
    max_connections: int = 1024
    keepalive_connections: int = 256
    # Longest a Generate stream may last, whatever the client's deadline (None: no limit).
    max_stream_s: float | None = 600.0
    # After the first text: text arriving within this long of a read joins it in one chunk
    # (fewer, larger messages to the client; 0: only what one read brings). The first text is
    # never held back, so TTFT does not change; nor is text of a region that streams slower
    # than COALESCE_BURST windows a read (nothing would join it: the wait would only cost).
    coalesce_s: float = 0.002


@dataclass
class RegionStream:
    """Iterate the text; afterwards ``candidate``, ``usage``, ``energy`` and ``failovers`` tell
    where it ran and what the region reported."""

    decision: Decision
    call: RegionCall
    client: HttpClient
    settings: DispatchSettings
    deadline_s: float | None
    x_scheduler: Mapping[str, str]
    clock: Callable[[], float] = time.monotonic
    # The signed dispatch ticket for a candidate (None: regions run without tickets).
    ticket_for: Callable[[Candidate], str] | None = None
    # The request's trace: a span per attempt, its context to the region in ``traceparent``.
    trace: RequestTrace = NO_TRACE
    # The dispatcher's turns over a plain vLLM pool's servers (shared by its streams).
    turns: Iterator[int] = field(default_factory=itertools.count)
    candidate: Candidate | None = None
    usage: Mapping[str, Any] | None = None
    energy: Mapping[str, Any] | None = None
    failovers: list[errors.Attempt] = field(default_factory=list)
    first_text_at: float | None = None
    # The candidate being tried (after the first text: the one answering).
    current: Candidate | None = None
    # SSE events with text relayed to the client (about one token each; see the module doc).
    content_events: int = 0
    # The region's last finish reason ("stop", "length", ...; empty: none yet).
    finish_reason: str = ""
    _deltas: AsyncGenerator[TextDelta, None] | None = field(default=None, init=False, repr=False)
    # What the events read since the last delta carried beside their text (TextDelta's fields).
    _delta_fields: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _logprobs: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _first: asyncio.Future[TextDelta | None] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        """Send the request now, in a task, so the caller can do other work (build the decision
        message) while the region prefills; iterating then picks up the first delta."""
        if self._deltas is None:
            self._deltas = self._failover()
            self._first = asyncio.ensure_future(anext(self._deltas, None))

    async def aclose(self) -> None:
        """Abandon the stream (the client went away): cancel and close the region request."""
        first, self._first = self._first, None
        if first is not None:
            first.cancel()
            # Retrieve its outcome so an abandoned failure is not reported as unhandled.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await first
        if self._deltas is not None:
            await self._deltas.aclose()

    async def __aiter__(self) -> AsyncIterator[TextDelta]:
        if self._deltas is None:
            # Not started: nothing to overlap with the region's prefill, so no task for it.
            self._deltas = self._failover()
            try:
                async for delta in self._deltas:
                    yield delta
            finally:
                await self.aclose()
            return
        assert self._first is not None
        try:
            first = await self._first
            self._first = None
            if first is None:
                return
            yield first
            async for delta in self._deltas:
                yield delta
        finally:
            await self.aclose()

    def _timeout(self, limit: float) -> float:
        if self.deadline_s is None:
            return limit
        return max(0.001, min(limit, self.deadline_s - self.clock()))

    async def _failover(self) -> AsyncGenerator[TextDelta, None]:
        for candidate in self.decision.ranked_candidates:
            self.current = candidate
            try:
                async for delta in self._attempt(candidate):
                    yield delta
                self.candidate = candidate
                return
            except _RegionFailed as failure:
                attempt = errors.Attempt(candidate.region.name, candidate.pool.name, failure.error, failure.http_status)
                if self.deadline_s is not None and self.clock() >= self.deadline_s:
                    raise self._deadline_exceeded(f"{candidate.key}: {failure.error}") from None
                if self.first_text_at is not None:
                    raise errors.Unavailable(
                        f"region {candidate.key} failed after the first token: {failure.error}",
                        attempts=(*self.failovers, attempt), retryable=False,
                    ) from None
                log.warning("failover: %s failed before the first token: %s", candidate.key, failure.error)
                self.failovers.append(attempt)
        tried = ", ".join(f"{a.region}/{a.pool} ({a.error})" for a in self.failovers)
        raise errors.Unavailable(f"every candidate failed before the first token: {tried}",
                                 attempts=tuple(self.failovers), retryable=True, retry_after_s=1.0)

    def _server(self, candidate: Candidate) -> str:
        """The base URL a plain vLLM pool's attempt goes to: the same server for a prefix key
        (its prefix cache holds the prefix), else the next in turn."""
        urls = candidate.pool.vllm.urls if candidate.pool.vllm is not None else (candidate.region.endpoint,)
        if len(urls) == 1:
            return urls[0]
        prefix_key = self.x_scheduler.get("prefix_key")
        turn = zlib.crc32(prefix_key.encode()) if prefix_key else next(self.turns)
        return urls[turn % len(urls)]

    async def _attempt(self, candidate: Candidate) -> AsyncIterator[TextDelta]:
        headers = {"content-type": "application/json"}
        if candidate.region.tickets_enforced:
            url = candidate.region.endpoint.rstrip("/") + self.call.path
            body = {
                **self.call.body,
                "model": candidate.deployment.name,
                "stream": True,
                "stream_options": {"include_usage": True},
                "x_scheduler": {**self.x_scheduler, "pool": candidate.pool.name},
            }
            if self.ticket_for is not None:
                headers[TICKET_HEADER] = self.ticket_for(candidate)
        else:
            # A plain vLLM server (docs/byo-vllm.md): the OpenAI request alone, under the name the
            # server knows the model by; it checks no ticket and reads no scheduling hints.
            url = self._server(candidate).rstrip("/") + self.call.path
            api_key_env = candidate.pool.vllm.api_key_env if candidate.pool.vllm is not None else None
            if api_key_env is not None:
                api_key = os.environ.get(api_key_env)
                if not api_key:
                    raise _RegionFailed(f"${api_key_env}, the API key of {candidate.key}'s vLLM servers, is not set "
                                        "on this router")
                headers["authorization"] = f"Bearer {api_key}"
            body = {
                **self.call.body,
                "model": candidate.pool.served_model_name(candidate.deployment.name),
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        settings = self.settings
        trace = self.trace
        span = attempt_span(trace, candidate, url, self.call.path, len(self.failovers))
        trace.inject(span, headers)
        try:
            try:
                async with self.client.stream("POST", url, body=orjson.dumps(body), headers=headers,
                                              connect_timeout_s=self._timeout(settings.connect_timeout_s),
                                              read_timeout_s=self._timeout(settings.read_timeout_s)) as response:
                    if trace.recording:
                        span.set_attribute("http.response.status_code", response.status)
                    if response.status != 200:
                        await self._reject(response)
                    async for delta in self._relay(response):
                        yield delta
            except TimeoutError as exc:
                if self.deadline_s is not None and self.clock() >= self.deadline_s:
                    raise self._deadline_exceeded("") from None
                raise _RegionFailed(f"timeout ({exc})") from None
            except HttpError as exc:
                raise _RegionFailed(f"{type(exc).__name__}: {exc}") from None
            if trace.recording:
                span.set_attributes(usage_attributes(self.usage, self.finish_reason))
        except BaseException as exc:
            attempt_failed(span, exc)
            raise
        finally:
            span.end()

    async def _reject(self, response: Response) -> None:
        raw = await response.read()
        message, param = openai_error(raw)
        # A region's error body may carry a whole traceback: keep what names the problem.
        message = message if len(message) <= REGION_MESSAGE_CHARS else message[:REGION_MESSAGE_CHARS] + " …"
        if response.status in CLIENT_ERRORS:
            raise errors.InvalidRequest([errors.FieldViolation(param or "request", f"region says: {message}")])
        raise _RegionFailed(f"HTTP {response.status}: {message}", response.status)

    async def _relay(self, response: Response) -> AsyncIterator[TextDelta]:
        parser = SseParser()
        done = False
        # A finish reason may come in an event of its own: it waits for the next yield.
        finish = ""
        read_timeout, coalesce_s = self.settings.read_timeout_s, self.settings.coalesce_s
        last_read_at: float | None = None
        while not done:
            # Each read is bounded by the time left, so the deadline bounds the whole stream.
            data = await response.next_chunk(self._timeout(read_timeout))
            if data is None:
                break
            read_at = self.clock()
            # Text in a burst (this read soon after the last one): wait a moment for the rest.
            bursting = last_read_at is not None and read_at - last_read_at <= COALESCE_BURST * coalesce_s
            last_read_at = read_at
            texts: list[str] = []
            read_finish, done = self._take(parser, data, texts)
            finish = read_finish or finish
            if coalesce_s > 0 and bursting and self.first_text_at is not None:
                until = read_at + coalesce_s
                while not done and (left := until - self.clock()) > 0:
                    more = await response.more_within(left)
                    if not more:
                        break
                    more_finish, done = self._take(parser, more, texts)
                    finish = more_finish or finish
            text = "".join(texts)
            fields, logprobs = self._delta_fields, self._logprobs
            content = bool(text) or fields is not None or logprobs is not None
            if content or (finish and done):
                if self.first_text_at is None and content:
                    self.first_text_at = self.clock()
                if finish:
                    self.finish_reason = finish
                self._delta_fields = self._logprobs = None
                yield TextDelta(text, finish, fields, logprobs)
                finish = ""
        if not done:
            raise _RegionFailed("stream ended without [DONE]")
        # Read the body to its end (nothing follows [DONE]): only then is the connection
        # reused, else every stream would pay a new TCP (and TLS) handshake.
        while await response.next_chunk(self._timeout(read_timeout)) is not None:
            pass

    def _take(self, parser: SseParser, data: bytes, texts: list[str]) -> tuple[str, bool]:
        """Parse ``data``, add its text to ``texts``; (finish reason, [DONE] seen)."""
        finish = ""
        for payload in parser.feed_bytes(data):
            if payload == DONE_BYTES:
                return finish, True
            text, reason, other = self._event(payload)
            if text:
                texts.append(text)
            if text or other:
                self.content_events += 1
            finish = reason or finish
        return finish, False

    def _deadline_exceeded(self, detail: str) -> errors.DeadlineExceeded:
        limit = self.settings.max_stream_s
        what = "the client's deadline" if limit is None else \
            f"the client's deadline or the router's max_stream_s ({limit:g} s), whichever came first"
        return errors.DeadlineExceeded(
            f"the stream passed its deadline ({what}) after {self.content_events} content events"
            + (f"; last failure {detail}" if detail else ""))

    def _event(self, payload: bytes) -> tuple[str, str, bool]:
        """(text, finish reason, whether the choice carried more than text) of one event."""
        # The usual event, a completion chunk's text (no usage, no error, no logprobs), read in
        # one step; anything else takes the general path, which judges it the same way.
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            event = None
        if type(event) is dict and event.get("usage") is None and "error" not in event:
            choices = event.get("choices")
            if (type(choices) is list and choices and type(choice := choices[0]) is dict and "delta" not in choice
                    and choice.get("logprobs") is None):
                text, reason = choice.get("text"), choice.get("finish_reason")
                if type(text) is str and (reason is None or type(reason) is str):
                    return text, reason or "", False
        return self._general_event(payload)

    def _general_event(self, payload: bytes) -> tuple[str, str, bool]:
        try:
            event = parse_event(payload)
        except MalformedEvent as exc:
            raise _RegionFailed(str(exc)) from None
        usage = event.get("usage")
        if type(usage) is dict:
            self.usage = usage
            energy = event.get("energy", usage.get("energy"))
            if type(energy) is dict:
                self.energy = energy
        text, reason = choice_text(event)
        choices = event.get("choices")
        if type(choices) is list and choices and type(choice := choices[0]) is dict:
            delta, logprobs = choice.get("delta"), choice.get("logprobs")
            # The usual chat chunk carries its text alone: nothing more to look at.
            if (type(delta) is dict and not delta.keys() <= _TEXT_DELTA_KEYS) or logprobs is not None:
                return text, reason, self._keep_other_fields(delta, logprobs)
        return text, reason, False

    def _keep_other_fields(self, delta: Any, logprobs: Any) -> bool:
        """Keep what a choice carries beside its text (its delta's other fields, its logprobs)
        for the next delta; whether there was any."""
        kept = False
        if type(delta) is dict:
            other = {name: value for name, value in delta.items()
                     if name not in ("content", "role") and value is not None and value != []}
            if other:
                self._delta_fields = merge_fields(self._delta_fields, other)
                kept = True
        if type(logprobs) is dict:
            self._logprobs = merge_fields(self._logprobs, logprobs)
            kept = True
        return kept


class _RegionFailed(Exception):
    def __init__(self, error: str, http_status: int = 0) -> None:
        self.error = error
        self.http_status = http_status
        super().__init__(error)


@dataclass
class RegionDispatcher:
    """Owns the router's one HTTP client; ``stream`` starts a ``RegionStream`` for a decision."""

    settings: DispatchSettings = field(default_factory=DispatchSettings)
    clock: Callable[[], float] = time.monotonic
    turns: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.client = HttpClient(max_connections=self.settings.max_connections,
                                 max_idle_per_origin=self.settings.keepalive_connections,
                                 connect_timeout_s=self.settings.connect_timeout_s,
                                 read_timeout_s=self.settings.read_timeout_s, user_agent="carbon-scheduler-router")

    def stream(self, decision: Decision, call: RegionCall, deadline_s: float | None,
               x_scheduler: Mapping[str, str], ticket_for: Callable[[Candidate], str] | None = None,
               trace: RequestTrace = NO_TRACE) -> RegionStream:
        """``deadline_s``: the client's, on this dispatcher's clock (None: none); the stream's
        deadline is the earlier of it and ``settings.max_stream_s`` from now. ``trace``: the request's."""
        limit = self.settings.max_stream_s
        if limit is not None:
            cap = self.clock() + limit
            deadline_s = cap if deadline_s is None else min(deadline_s, cap)
        return RegionStream(decision, call, self.client, self.settings, deadline_s, x_scheduler, self.clock,
                            ticket_for, trace, self.turns)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.client.aclose()
