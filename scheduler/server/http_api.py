"""The router's HTTP front door (``scheduler router --http-port PORT``), beside gRPC.

- ``POST /scheduler.v1.GlobalRouter/Route``: the Route RPC in the Connect protocol's unary
  form (connectrpc.com/docs/protocol): the body is a ``GenerateRequest`` as protobuf
  (``content-type: application/proto``) or JSON (``application/json``), the answer a
  ``RouteResponse`` in the same codec; an error is HTTP status + ``{"code", "message",
  "details"}``. The SDK's direct mode uses it when given the router's HTTP address: one
  HTTP request on a kept-alive connection costs the router a fraction of a gRPC call.
- ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``: OpenAI's API,
  streamed or not (scheduler.server.openai_front has the formats and the scheduling hints).
- ``GET /health``: 200 while the router serves (503 while it starts or drains); no key
  needed, nothing read but memory.
- ``POST /v1/files``, ``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET
  /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``: OpenAI's Batch API on the deferral
  queue (scheduler.server.batches).
- ``POST /v1/deferred/completions`` (a completions body plus ``"deadline"``, epoch seconds):
  the Defer RPC, answered ``202`` with the ``DeferResponse`` as JSON; ``GET /v1/deferred/{id}``:
  GetDeferred, the ``DeferredStatus`` as JSON; ``DELETE /v1/deferred/{id}``: CancelDeferred
  (docs/deferral.md).

The same keys (``authorization: Bearer``), rate limits, per-tenant stream slots, decision,
admission (budgets), dispatch with failover, receipts, ledger and audit as gRPC: every
handler goes through ``RouterCore``. Errors are mapped once here: Connect codes for Route,
OpenAI error objects (and statuses OpenAI clients retry on: 429, 503) for the OpenAI API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from google.protobuf import json_format
from google.rpc import code_pb2

from scheduler import errors
from scheduler.envelope import CONNECT_PROTO, END_STREAM, MESSAGE, EnvelopeError, EnvelopeReader, envelope
from scheduler.http.server import (
    AnswerInstead,
    Handler,
    HttpRequest,
    HttpResponse,
    HttpServer,
    ServerLimits,
    StreamingResponse,
    error_response,
)
from scheduler.server import convert, openai_front
from scheduler.server.auth import Principal
from scheduler.server.batches import Batches
from scheduler.server.core import TRANSIENT_PLUGINS, ProxyRun, RouterCore
from scheduler.server.deferral_api import Deferrals
from scheduler.server.dispatch import merge_fields
from scheduler.server.edge import GUARDED_DESERIALIZERS, admit, authenticate
from scheduler.server.openai_front import deferred_request
from scheduler.server.router_parts import Proxying, SharedState, TenantLimits
from scheduler.server.status import rpc_status_for
from scheduler.server.tracing import RouterTracing
from scheduler.server.wire import RejectedRequest
from scheduler.v1 import messages_pb2, router_pb2

log = logging.getLogger(__name__)

ROUTE_PATH = "/scheduler.v1.GlobalRouter/Route"
GENERATE_PATH = "/scheduler.v1.GlobalRouter/Generate"
DEFERRED_COMPLETIONS_PATH = "/v1/deferred/completions"
# GET DEFERRED_PREFIX + request id: a deferred request's status.
DEFERRED_PREFIX = "/v1/deferred/"
# Load balancers' and orchestrators' probe: the one path that takes no key.
HEALTH_PATH = "/health"
# OpenAI's Batch API (scheduler.server.batches).
FILES_PATH, BATCHES_PATH = "/v1/files", "/v1/batches"
# A route's parameter segment.
PARAMETER = "{id}"
# What the DeferRequest's fields are called in a deferred completions body.
_DEFERRED_BODY_FIELDS = {"deadline_unix_s": "deadline", "request.request_id": "x_scheduler.request_id",
                         "request.workload_class": "x_scheduler.workload_class"}
PROTO = "application/proto"
JSON = "application/json"
# The largest body the OpenAI endpoints and Route take: a 4 MiB prompt and its envelope.
MAX_BODY_BYTES = 5 * 2**20
# The method label (scheduler_router_requests_total) of a request refused before its handler
# runs: its endpoint's, as the handler counts it.
_METRIC_METHODS = {ROUTE_PATH: "Route", GENERATE_PATH: GENERATE_PATH, "/v1/completions": "openai.completions",
                   "/v1/chat/completions": "openai.chat.completions", "/v1/models": "openai.models",
                   DEFERRED_COMPLETIONS_PATH: "openai.deferred.completions", FILES_PATH: "openai.files.create",
                   BATCHES_PATH: "openai.batches.create"}

_CONNECT_STATUS = {code_pb2.OK: 200, code_pb2.CANCELLED: 499, code_pb2.UNKNOWN: 500, code_pb2.INVALID_ARGUMENT: 400,
                   code_pb2.DEADLINE_EXCEEDED: 504, code_pb2.NOT_FOUND: 404, code_pb2.ALREADY_EXISTS: 409,
                   code_pb2.PERMISSION_DENIED: 403, code_pb2.RESOURCE_EXHAUSTED: 429,
                   code_pb2.FAILED_PRECONDITION: 400, code_pb2.ABORTED: 409, code_pb2.OUT_OF_RANGE: 400,
                   code_pb2.UNIMPLEMENTED: 501, code_pb2.INTERNAL: 500, code_pb2.UNAVAILABLE: 503,
                   code_pb2.DATA_LOSS: 500, code_pb2.UNAUTHENTICATED: 401}


def code_name(code: int) -> str:
    """``INVALID_ARGUMENT`` for 3: the names gRPC and the metrics use."""
    return str(code_pb2.Code.Name(code))


def _connect_error_body(exc: BaseException) -> tuple[dict[str, Any], int]:
    """A Connect error object (``{"code", "message", "details"}``, the details gRPC would carry)
    and its google.rpc code."""
    status = rpc_status_for(exc)
    details = [{"type": any_.type_url.rsplit("/", 1)[-1], "value": base64.b64encode(any_.value).decode().rstrip("=")}
               for any_ in status.details]
    return {"code": code_name(status.code).lower(), "message": status.message, "details": details}, status.code


def connect_error(exc: BaseException) -> tuple[HttpResponse, str]:
    """A Connect error answer (a unary call's) and the code's name."""
    body, code = _connect_error_body(exc)
    headers: tuple[tuple[str, str], ...] = ()
    retry_after = getattr(exc, "retry_after_s", None)
    if isinstance(retry_after, int | float):
        headers = (("retry-after", str(max(1, round(retry_after)))),)
    return HttpResponse(_CONNECT_STATUS.get(code, 500), orjson.dumps(body), JSON, headers), code_name(code)


def connect_end(exc: BaseException | None) -> tuple[bytes, str]:
    """A streaming call's end-of-stream envelope (its error, if any) and the code's name."""
    if exc is None:
        return envelope(b"{}", END_STREAM), "OK"
    body, code = _connect_error_body(exc)
    return envelope(orjson.dumps({"error": body}), END_STREAM), code_name(code)


def connect_timeout_s(headers: Mapping[str, str]) -> float | None:
    """The call's ``connect-timeout-ms`` in seconds (None: none); ``InvalidRequest`` if malformed."""
    raw = headers.get("connect-timeout-ms")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise errors.InvalidRequest([errors.FieldViolation("connect-timeout-ms", f"expected up to 10 digits, got "
                                                                                 f"{raw[:20]!r}")])
    return int(raw) / 1000.0


@dataclass
class _Outcome:
    """How a stream ended, as its metrics and trace record it."""

    code: str = "OK"  # the gRPC code's name
    message: str = ""
    status: int = 200  # the HTTP status it was answered with


@dataclass(frozen=True)
class _OpenAiError:
    status: int
    code: str  # OpenAI's error code
    grpc_code: str  # for the metrics, as gRPC counts it


def _openai_mapping(exc: BaseException) -> _OpenAiError:
    if isinstance(exc, errors.InvalidRequest):
        return _OpenAiError(400, "invalid_request", "INVALID_ARGUMENT")
    if isinstance(exc, errors.Unschedulable):
        # About the fleet's state now: 503 (retry later); about the request: 400.
        transient = exc.plugin in TRANSIENT_PLUGINS
        return _OpenAiError(503 if transient else 400, "unschedulable", "FAILED_PRECONDITION")
    if isinstance(exc, errors.Unauthenticated):
        return _OpenAiError(401, "invalid_api_key", "UNAUTHENTICATED")
    if isinstance(exc, errors.PermissionDenied):
        return _OpenAiError(403, "permission_denied", "PERMISSION_DENIED")
    if isinstance(exc, errors.BudgetExhausted):
        return _OpenAiError(429, "insufficient_quota", "RESOURCE_EXHAUSTED")
    if isinstance(exc, errors.RateLimited):
        return _OpenAiError(429, "rate_limit_exceeded", "RESOURCE_EXHAUSTED")
    if isinstance(exc, errors.StreamLimited):
        return _OpenAiError(429, "too_many_streams", "RESOURCE_EXHAUSTED")
    if isinstance(exc, errors.QuotaExceeded):
        return _OpenAiError(429, "deferral_quota_exceeded", "RESOURCE_EXHAUSTED")
    if isinstance(exc, errors.StorageRefused):
        return _OpenAiError(400, "storage_refused", "FAILED_PRECONDITION")
    if isinstance(exc, errors.Unavailable):
        return _OpenAiError(503, "regions_unavailable", "UNAVAILABLE")
    if isinstance(exc, errors.DeadlineExceeded):
        return _OpenAiError(504, "deadline_exceeded", "DEADLINE_EXCEEDED")
    if isinstance(exc, errors.NotFound):
        return _OpenAiError(404, "not_found", "NOT_FOUND")
    return _OpenAiError(500, "internal_error", "INTERNAL")


def openai_error(exc: BaseException) -> tuple[HttpResponse, str]:
    """An OpenAI error object for an outcome (the message of an unexpected one is not shown)."""
    mapping = _openai_mapping(exc)
    if mapping.status == 500:
        log.exception("unexpected error in the router's HTTP front door", exc_info=exc)
        message = "internal error in the router"
    else:
        message = rpc_status_for(exc).message
    param = exc.violations[0].field if isinstance(exc, errors.InvalidRequest) and exc.violations else None
    headers: tuple[tuple[str, str], ...] = ()
    retry_after = getattr(exc, "retry_after_s", None)
    if isinstance(retry_after, int | float):
        headers = (("retry-after", str(max(1, round(retry_after)))),)
    return error_response(mapping.status, message, code=mapping.code, param=param, headers=headers), mapping.grpc_code


def _json_body(request: HttpRequest) -> Any:
    try:
        return orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidRequest([errors.FieldViolation("body", f"not JSON: {exc}"[:200])]) from None


def _body_names(exc: errors.InvalidRequest) -> errors.InvalidRequest:
    """A Defer violation named as the deferred completions body names the field."""
    return errors.InvalidRequest([
        errors.FieldViolation(_DEFERRED_BODY_FIELDS.get(v.field, v.field.removeprefix("request.")), v.description)
        for v in exc.violations])


class Routes(Mapping[tuple[str, str], Handler]):
    """The server's routes: exact paths, and paths with one segment a parameter (keyed by their
    template, e.g. ``/v1/deferred/{id}`` or ``/v1/batches/{id}/cancel``): a path with the
    template's text around one non-empty segment."""

    def __init__(self, exact: Mapping[tuple[str, str], Handler],
                 parameterized: Mapping[tuple[str, str], Handler]) -> None:
        self.exact = dict(exact)
        self.parameterized = {(method, *template.split(PARAMETER, 1)): handler
                              for (method, template), handler in parameterized.items()}

    def __getitem__(self, key: tuple[str, str]) -> Handler:
        handler = self.exact.get(key)
        if handler is not None:
            return handler
        method, path = key
        for (route_method, prefix, suffix), candidate in self.parameterized.items():
            if route_method == method and path.startswith(prefix) and path.endswith(suffix):
                value = path[len(prefix):len(path) - len(suffix)]
                if value and "/" not in value:
                    return candidate
        raise KeyError(key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        yield from self.exact
        yield from ((method, prefix + PARAMETER + suffix) for method, prefix, suffix in self.parameterized)

    def __len__(self) -> int:
        return len(self.exact) + len(self.parameterized)


class HttpApiParts(Proxying, TenantLimits, SharedState, Protocol):
    """What the HTTP front door takes of the router: the gRPC services' parts, the router's own
    tracing, and the deferral queue (None: not run) with the batches kept beside it."""

    tracing: RouterTracing
    deferrals: Deferrals | None


class HttpApi:
    def __init__(self, deps: HttpApiParts, serving: Callable[[], bool] = lambda: True) -> None:
        self.deps = deps
        self.core = RouterCore(deps)
        self.serving = serving
        self.batches = Batches(deps.store, deps.deferrals, deps.clock,
                               lambda msg: openai_front.fill_chat_max_tokens(msg, deps.refresher.current()))

    def routes(self) -> Routes:
        return Routes({
            ("POST", ROUTE_PATH): self.route,
            ("POST", GENERATE_PATH): self.generate,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("GET", "/v1/models"): self.models,
            ("GET", HEALTH_PATH): self.health,
            ("POST", DEFERRED_COMPLETIONS_PATH): self.deferred_completions,
            ("POST", FILES_PATH): self.upload_file,
            ("POST", BATCHES_PATH): self.create_batch,
        }, {("GET", DEFERRED_PREFIX + PARAMETER): self.deferred_status,
            ("DELETE", DEFERRED_PREFIX + PARAMETER): self.deferred_cancel,
            ("GET", FILES_PATH + "/" + PARAMETER + "/content"): self.file_content,
            ("GET", BATCHES_PATH + "/" + PARAMETER): self.batch_status,
            ("POST", BATCHES_PATH + "/" + PARAMETER + "/cancel"): self.batch_cancel})

    def authorize(self, method: str, path: str, headers: Mapping[str, str]) -> Principal | HttpResponse | None:
        """The server's check when a request's headers are complete (every endpoint here takes a
        key): the key's principal, for the handler, or the 401 that refuses the request before
        ``100 Continue`` and before any of its body is read (the server then closes the
        connection); None without keys (--insecure: nothing to check)."""
        keys = self.deps.keys
        if keys is None or (method == "GET" and path == HEALTH_PATH):
            return None
        try:
            return authenticate(keys, path, headers.get("authorization"))
        except errors.Unauthenticated as exc:
            status_path = method == "GET" and path.startswith(DEFERRED_PREFIX)
            self.deps.metrics.request("openai.deferred.get" if status_path else _METRIC_METHODS.get(path, "http.other"),
                                      "UNAUTHENTICATED")
            if path == GENERATE_PATH:  # a Connect stream: its error in the end-of-stream message
                return HttpResponse(200, connect_end(exc)[0], CONNECT_PROTO)
            response, _ = connect_error(exc) if path == ROUTE_PATH else openai_error(exc)
            return response

    async def _admit(self, request: HttpRequest, method: str) -> Principal:
        principal = request.auth
        if isinstance(principal, Principal):  # the key was checked with the headers
            await self.deps.limiter.check(principal)
            return principal
        return await admit(self.deps.keys, self.deps.limiter, method, request.headers.get("authorization"))

    # --- Route (Connect unary) ------------------------------------------------------------

    async def route(self, request: HttpRequest) -> HttpResponse:
        code, message = "OK", ""
        trace = self.deps.tracing.begin_http(request.method, ROUTE_PATH, request.headers)
        response: HttpResponse | None = None
        try:
            principal = await self._admit(request, ROUTE_PATH)
            codec = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if codec not in (PROTO, JSON):
                response = error_response(415, f"content-type must be {PROTO} or {JSON}, got {codec or 'none'!r}")
                return response
            msg = self._route_message(request.body, codec)
            routed = self.core.route(principal, msg, trace)
            answer = routed.to_proto()
            if codec == PROTO:
                response = HttpResponse(200, answer.SerializeToString(), PROTO)
            else:
                response = HttpResponse(200, _json(answer), JSON)
            return response
        except Exception as exc:
            response, code = connect_error(exc)
            message = str(exc)
            return response
        finally:
            self.deps.metrics.request("Route", code)
            trace.end(code, message, None if response is None else response.status)

    @staticmethod
    def _route_message(body: bytes, codec: str) -> messages_pb2.GenerateRequest:
        if codec == PROTO:
            parsed = GUARDED_DESERIALIZERS[ROUTE_PATH](body)
            if isinstance(parsed, RejectedRequest):
                raise errors.InvalidRequest(parsed.violations)
            assert isinstance(parsed, messages_pb2.GenerateRequest)
            return parsed
        msg = messages_pb2.GenerateRequest()
        try:
            json_format.Parse(body, msg)
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            raise errors.InvalidRequest([errors.FieldViolation("body", f"not a GenerateRequest: {exc}"[:300])]) \
                from None
        return msg

    # --- Generate (Connect server-streaming) -----------------------------------------------

    async def generate(self, request: HttpRequest) -> HttpResponse | StreamingResponse:
        """The Generate RPC in the Connect protocol's streaming form: a ``GenerateRequest`` in
        one envelope (``application/connect+proto``); the answer the gRPC stream's messages
        (decision, text chunks, receipt), each in an envelope, then the end-of-stream envelope
        with the error if the call failed. The same proxy run as gRPC's and the OpenAI API's:
        the SDK's proxy mode uses it when given the router's HTTP address (a stream costs the
        router about two thirds of a gRPC stream's CPU: docs/benchmarks.md)."""
        trace = self.deps.tracing.begin_http(request.method, GENERATE_PATH, request.headers)
        try:
            principal = await self._admit(request, GENERATE_PATH)
            codec = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if codec != CONNECT_PROTO:
                self.deps.metrics.request(GENERATE_PATH, "INVALID_ARGUMENT")
                trace.end("INVALID_ARGUMENT", "unsupported content-type", 415)
                return error_response(415, f"content-type must be {CONNECT_PROTO}, got {codec or 'none'!r}")
            msg = self._generate_message(request.body)
            run = self.core.proxy(principal, msg, connect_timeout_s(request.headers), trace)
        except Exception as exc:
            end, code = connect_end(exc)
            self.deps.metrics.request(GENERATE_PATH, code)
            trace.end(code, str(exc), 200)
            return HttpResponse(200, end, CONNECT_PROTO)
        return StreamingResponse(200, self._connect_stream(principal, run), CONNECT_PROTO, max_s=_remaining_s(run))

    @staticmethod
    def _generate_message(body: bytes) -> messages_pb2.GenerateRequest:
        reader = EnvelopeReader(MAX_BODY_BYTES)
        try:
            envelopes = reader.feed(body)
        except EnvelopeError as exc:
            raise errors.InvalidRequest([errors.FieldViolation("body", str(exc))]) from None
        if len(envelopes) != 1 or reader.pending or envelopes[0][0] != MESSAGE:
            raise errors.InvalidRequest([errors.FieldViolation(
                "body", "expected one uncompressed GenerateRequest envelope")])
        parsed = GUARDED_DESERIALIZERS[GENERATE_PATH](envelopes[0][1])
        if isinstance(parsed, RejectedRequest):
            raise errors.InvalidRequest(parsed.violations)
        assert isinstance(parsed, messages_pb2.GenerateRequest)
        return parsed

    async def _connect_stream(self, principal: Principal, run: ProxyRun) -> AsyncIterator[bytes]:
        """As the gRPC servicer's Generate: the decision first, the text, the receipt (also after
        an early end, while the stream can carry it), then the end of the stream."""
        try:
            self.deps.slots.acquire(principal)
        except errors.StreamLimited as exc:
            end, code = connect_end(exc)
            self.deps.metrics.request(GENERATE_PATH, code)
            run.trace.end(code, str(exc), 200)
            yield end
            return
        with self._stream_outcome(principal, run, GENERATE_PATH) as outcome:
            failure: BaseException | None = None
            try:
                async with run:
                    # The region request went out on entry; the decision message is built while it prefills.
                    await asyncio.sleep(0)
                    yield envelope(messages_pb2.GenerateResponse(decision=convert.decision_to_proto(
                        run.decision, run.decision_id, run.incoming, run.snapshot.config_version)).SerializeToString())
                    async for delta in run:
                        yield envelope(messages_pb2.GenerateResponse(chunk=messages_pb2.TokenChunk(
                            text=delta.text, finish_reason=delta.finish_reason)).SerializeToString())
            except Exception as exc:  # the run booked what it must; the client gets the error in the end
                failure = exc
            else:
                if run.receipt is not None:
                    yield envelope(messages_pb2.GenerateResponse(
                        receipt=convert.receipt_to_proto(run.receipt)).SerializeToString())
                failure = run.failure
            end, outcome.code = connect_end(failure)
            outcome.message = "" if failure is None else str(failure)
            yield end

    @contextlib.contextmanager
    def _stream_outcome(self, principal: Principal, run: ProxyRun, method: str) -> Iterator[_Outcome]:
        """A stream's end, whatever ends it: its slot released, the request counted and its trace
        ended with the outcome the body recorded (CANCELLED when it was cut short while OK)."""
        outcome = _Outcome()
        try:
            yield outcome
        except BaseException:
            if outcome.code == "OK":
                outcome.code = "CANCELLED"
            raise
        finally:
            self.deps.slots.release(principal)
            self.deps.metrics.request(method, outcome.code)
            run.trace.end(outcome.code, outcome.message, outcome.status)

    # --- deferral (docs/deferral.md) --------------------------------------------------------

    def _deferrals(self) -> Deferrals:
        if self.deps.deferrals is None:
            raise errors.Unavailable("this router does not run the deferral queue", retryable=False)
        return self.deps.deferrals

    async def deferred_completions(self, request: HttpRequest) -> HttpResponse:
        """Defer: ``202`` with the ``DeferResponse`` (and its status URL in ``location``)."""
        method = "openai.deferred.completions"
        code, message = "OK", ""
        trace = self.deps.tracing.begin_http(request.method, request.path, request.headers)
        response: HttpResponse | None = None
        try:
            principal = await self._admit(request, method)
            try:
                answer = await self._deferrals().defer(principal, deferred_request(_json_body(request),
                                                                                   request.headers), trace)
            except errors.InvalidRequest as exc:
                raise _body_names(exc) from None
            location = DEFERRED_PREFIX + urllib.parse.quote(answer.request_id, safe="")
            response = HttpResponse(202, _json(answer), JSON, (("location", location),))
            return response
        except Exception as exc:
            response, code = openai_error(exc)
            message = str(exc)
            return response
        finally:
            self.deps.metrics.request(method, code)
            trace.end(code, message, None if response is None else response.status)

    async def deferred_status(self, request: HttpRequest) -> HttpResponse:
        """GetDeferred: the ``DeferredStatus``; 404 for an unknown id (another tenant's is another)."""
        return await self._deferred_call(request, "openai.deferred.get", Deferrals.status)

    async def deferred_cancel(self, request: HttpRequest) -> HttpResponse:
        """CancelDeferred: the ``DeferredStatus`` (``cancelled``); 404 for an unknown id."""
        return await self._deferred_call(request, "openai.deferred.delete", Deferrals.cancel)

    async def _deferred_call(self, request: HttpRequest, method: str,
                             call: Callable[[Deferrals, Principal, str], Awaitable[router_pb2.DeferredStatus]],
                             ) -> HttpResponse:
        code = "OK"
        try:
            principal = await self._admit(request, method)
            request_id = urllib.parse.unquote(request.path[len(DEFERRED_PREFIX):])
            return HttpResponse(200, _json(await call(self._deferrals(), principal, request_id)), JSON)
        except Exception as exc:
            response, code = openai_error(exc)
            return response
        finally:
            self.deps.metrics.request(method, code)

    # --- OpenAI's Batch API (scheduler.server.batches) ---------------------------------------

    async def upload_file(self, request: HttpRequest) -> HttpResponse:
        return await self._batch_call(request, "openai.files.create", lambda principal: self.batches.upload(
            principal, request.headers.get("content-type", ""), request.body))

    async def file_content(self, request: HttpRequest) -> HttpResponse:
        file_id = _parameter(request.path, FILES_PATH + "/", "/content")
        return await self._batch_call(request, "openai.files.content",
                                      lambda principal: self.batches.content(principal, file_id))

    async def create_batch(self, request: HttpRequest) -> HttpResponse:
        return await self._batch_call(request, "openai.batches.create", lambda principal: self.batches.create(
            principal, _json_body(request), request.headers))

    async def batch_status(self, request: HttpRequest) -> HttpResponse:
        batch_id = _parameter(request.path, BATCHES_PATH + "/", "")
        return await self._batch_call(request, "openai.batches.get",
                                      lambda principal: self.batches.get(principal, batch_id))

    async def batch_cancel(self, request: HttpRequest) -> HttpResponse:
        batch_id = _parameter(request.path, BATCHES_PATH + "/", "/cancel")
        return await self._batch_call(request, "openai.batches.cancel",
                                      lambda principal: self.batches.cancel(principal, batch_id))

    async def _batch_call(self, request: HttpRequest, method: str,
                          call: Callable[[Principal], Awaitable[dict[str, Any] | bytes]]) -> HttpResponse:
        """One Batch API call: admitted, answered as JSON (a file's content as it is), errors as
        OpenAI error objects, counted."""
        code = "OK"
        try:
            answer = await call(await self._admit(request, method))
            if isinstance(answer, bytes):
                return HttpResponse(200, answer, "application/jsonl")
            return HttpResponse(200, orjson.dumps(answer), JSON)
        except Exception as exc:
            response, code = openai_error(exc)
            return response
        finally:
            self.deps.metrics.request(method, code)

    # --- the OpenAI API ------------------------------------------------------------------

    async def models(self, request: HttpRequest) -> HttpResponse:
        code = "OK"
        try:
            await self._admit(request, "openai.models")
            snapshot = self.deps.refresher.current()
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "carbon-scheduler",
                     "max_model_len": openai_front.max_model_len(snapshot, name)}
                    for name in sorted(snapshot.candidates_by_model)]
            return HttpResponse(200, orjson.dumps({"object": "list", "data": data}))
        except Exception as exc:
            response, code = openai_error(exc)
            return response
        finally:
            self.deps.metrics.request("openai.models", code)

    async def health(self, request: HttpRequest) -> HttpResponse:
        """200 while the router takes requests; 503 while it starts or drains (as the metrics
        port's /healthz). Whether regions are well is the decision's business, not the probe's."""
        if self.serving():
            return HttpResponse(200, b'{"status":"ok"}', JSON)
        return HttpResponse(503, b'{"status":"not serving"}', JSON)

    async def completions(self, request: HttpRequest) -> HttpResponse | StreamingResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> HttpResponse | StreamingResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: HttpRequest, chat: bool) -> HttpResponse | StreamingResponse:
        method = "openai.chat.completions" if chat else "openai.completions"
        trace = self.deps.tracing.begin_http(request.method, request.path, request.headers)
        try:
            principal = await self._admit(request, method)
            msg, call = openai_front.generate_request(_json_body(request), request.headers, chat)
            openai_front.fill_chat_max_tokens(msg, self.deps.refresher.current())
            run = self.core.proxy(principal, msg, call.remaining_s, trace, prefetch=False)
        except Exception as exc:
            response, code = openai_error(exc)
            self.deps.metrics.request(method, code)
            trace.end(code, str(exc), response.status)
            return response
        if call.stream:
            return StreamingResponse(200, self._sse(principal, run, call, method), headers=_stream_headers(run),
                                     max_s=_remaining_s(run))
        return await self._whole(principal, run, call, method)

    async def _whole(self, principal: Principal, run: ProxyRun, call: openai_front.OpenAiCall,
                     method: str) -> HttpResponse:
        """Not streamed: relay into one completion object."""
        code, message, status = "OK", "", 200
        slots = self.deps.slots
        try:
            slots.acquire(principal)
            try:
                texts, finish = [], ""
                fields: dict[str, Any] | None = None
                logprobs: dict[str, Any] | None = None
                async with run:
                    async for delta in run:
                        texts.append(delta.text)
                        finish = delta.finish_reason or finish
                        if delta.delta_fields is not None:
                            fields = merge_fields(fields, delta.delta_fields)
                        if delta.logprobs is not None:
                            logprobs = merge_fields(logprobs, delta.logprobs)
            finally:
                slots.release(principal)
            if run.failure is not None:
                raise run.failure
            body = openai_front.completion_object(call, run.decision_id, "".join(texts), finish, run.stream.usage,
                                                  run.receipt, fields, logprobs)
            headers = openai_front.receipt_headers(run.receipt) if run.receipt is not None else ()
            return HttpResponse(200, orjson.dumps(body), JSON, headers)
        except Exception as exc:
            response, code = openai_error(exc)
            message, status = str(exc), response.status
            return response
        finally:
            self.deps.metrics.request(method, code)
            run.trace.end(code, message, status)

    async def _sse(self, principal: Principal, run: ProxyRun, call: openai_front.OpenAiCall,
                   method: str) -> AsyncIterator[bytes]:
        """Streamed: OpenAI chunks, the usage chunk with the receipt (``include_usage``), [DONE];
        the receipt after [DONE] when no usage chunk carried it. A failure before the first text
        is answered with its own status (``AnswerInstead``); after it, as an error event."""
        writer = openai_front.ChunkWriter(call, run.decision_id)
        try:
            self.deps.slots.acquire(principal)
        except errors.StreamLimited as exc:
            response, code = openai_error(exc)
            self.deps.metrics.request(method, code)
            run.trace.end(code, str(exc), response.status)
            raise AnswerInstead(response) from None
        sent = False
        with self._stream_outcome(principal, run, method) as outcome:
            async with run:
                try:
                    async for delta in run:
                        sent = True
                        yield writer.delta(delta)
                except Exception as exc:
                    response, outcome.code = openai_error(exc)
                    outcome.message = str(exc)
                    if not sent:
                        outcome.status = response.status
                        raise AnswerInstead(response) from None
                    yield writer.error(str(exc), "server_error", _openai_mapping(exc).code)
                    return
            receipt_sent = False
            if run.failure is not None:
                _, outcome.code = openai_error(run.failure)
                outcome.message = str(run.failure)
                yield writer.error(str(run.failure), "server_error", _openai_mapping(run.failure).code)
            else:
                if call.include_usage:
                    yield writer.usage(run.stream.usage, run.receipt)
                    receipt_sent = True
                yield writer.done()
            if run.receipt is not None and not receipt_sent:
                yield writer.receipt(run.receipt)


def _parameter(path: str, prefix: str, suffix: str) -> str:
    """A route's parameter segment, unquoted."""
    return urllib.parse.unquote(path[len(prefix):len(path) - len(suffix)])


def _json(message: Any) -> bytes:
    """A message as JSON with the proto's field names."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True).encode()


def _stream_headers(run: ProxyRun) -> tuple[tuple[str, str], ...]:
    return (("cache-control", "no-cache"), ("x-scheduler-decision-id", run.decision_id))


def _remaining_s(run: ProxyRun) -> float | None:
    """How long the stream may still last: its deadline (the client's, capped by max_stream_s),
    which the server enforces while the client does not read (None: no deadline)."""
    deadline = run.stream.deadline_s
    return None if deadline is None else max(0.0, deadline - run.stream.clock())


def server_ssl_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """TLS for the HTTP port from the router's gRPC TLS files (mutual when ``client_ca``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def build_http_server(deps: HttpApiParts, limits: ServerLimits | None = None,
                      serving: Callable[[], bool] = lambda: True) -> HttpServer:
    """The front door; ``serving``: whether the router takes requests now (``GET /health``)."""
    api = HttpApi(deps, serving)
    return HttpServer(api.routes(), limits=limits or ServerLimits(max_body_bytes=MAX_BODY_BYTES),
                      name="carbon-scheduler-router", authorize=api.authorize)
