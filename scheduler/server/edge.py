"""The router's edge: one interceptor that admits each call and maps its failure once.

For every scheduler.v1 method it (1) authenticates the ``authorization: Bearer`` key (from
the current key ring: the keys file is reloaded without a restart) and (2) requires the admin
role for ``RouterAdmin``, both from the call's metadata before its message is read: a call
refused there is answered by a handler that never reads the message, so gRPC's flow control
lets at most one stream window (64 KiB, with BDP probing off: ``scheduler.server.app``) of it
in. Then (3) it applies the tenant's rate limit (shared by the routers through the store),
(3b) for streaming methods (Generate) takes one of the tenant's concurrent-stream slots,
given back however the stream ends, and watches its writes (``scheduler.server.stalls``: a
client that stops reading is ended), then runs the servicer with the caller's ``Principal``
available through ``current_principal()``, and (4) turns any ``scheduler.errors`` outcome (or
an unexpected exception) into a gRPC status with ``google.rpc`` details
(``scheduler.server.status``). Health and reflection stay open, as load balancers and grpcurl
expect. Generate and Route get the request's trace span (``current_trace()``;
``scheduler.server.tracing``), ended here with the call's status.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.trace import Span, get_current_span

from scheduler import errors
from scheduler.server.auth import KeyRing, Principal
from scheduler.server.metrics import RouterMetrics
from scheduler.server.rate_limit import SharedRateLimiter
from scheduler.server.stalls import StalledWrites
from scheduler.server.status import status_for
from scheduler.server.stream_slots import StreamSlots
from scheduler.server.tracing import NO_TRACE, RequestTrace, RouterTracing
from scheduler.server.wire import (
    DEFER_REQUEST_FIELDS,
    DEFER_REQUEST_NESTED,
    GENERATE_REQUEST_FIELDS,
    RejectedRequest,
    decoded,
    guarded,
)
from scheduler.v1 import messages_pb2, router_pb2

log = logging.getLogger(__name__)

ADMIN_PREFIX = "/scheduler.v1.RouterAdmin/"
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
# Methods taking a GenerateRequest: their requests are size-checked on the wire before parsing.
DECIDING_DESERIALIZERS = {
    method: guarded(messages_pb2.GenerateRequest.FromString, GENERATE_REQUEST_FIELDS, "scheduler.v1.GenerateRequest")
    for method in ("/scheduler.v1.GlobalRouter/Route", "/scheduler.v1.GlobalRouter/Generate")
}
GUARDED_DESERIALIZERS = {
    **DECIDING_DESERIALIZERS,
    "/scheduler.v1.GlobalRouter/Defer": guarded(router_pb2.DeferRequest.FromString, DEFER_REQUEST_FIELDS,
                                                "scheduler.v1.DeferRequest", DEFER_REQUEST_NESTED),
}
# Methods that decide (and dispatch): one trace span each.
TRACED_METHODS = frozenset(DECIDING_DESERIALIZERS)
# The W3C trace context a caller may send in its metadata.
TRACE_METADATA = ("traceparent", "tracestate")


def _refuse_rejected(request: Any) -> None:
    """A request the wire guard refused is answered like any invalid request."""
    if isinstance(request, RejectedRequest):
        raise errors.InvalidRequest(request.violations)
# Without a keys file every caller is this principal (local use; the CLI warns).
LOCAL_PRINCIPAL = Principal(tenant="local", admin=True)

# The calling principal, set by the edge for the duration of one call (per-task context).
_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("scheduler_principal")
# The call's trace (NO_TRACE: not traced), likewise.
_trace: contextvars.ContextVar[RequestTrace] = contextvars.ContextVar("scheduler_trace", default=NO_TRACE)


def current_principal() -> Principal:
    return _principal.get()


def current_trace() -> RequestTrace:
    return _trace.get()


def current_span() -> Span:
    """The span of the call being served when it is traced, else OpenTelemetry's current one
    (the trace and span ids of ``--log-format json``)."""
    span = _trace.get().span
    return span if span.get_span_context().is_valid else get_current_span()


async def _abort(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    await context.abort(status.code, status.details, status.trailing_metadata)


def authenticate(keys: KeyRing | None, method: str, authorization: str | None, *,
                 admin_method: bool = False) -> Principal:
    """Who calls ``method`` (``Unauthenticated`` / ``PermissionDenied`` if nobody allowed)."""
    if keys is None:
        return LOCAL_PRINCIPAL
    principal = keys.authenticate(authorization)
    if admin_method and not principal.admin:
        raise errors.PermissionDenied(f"{method} needs an admin key; tenant {principal.tenant!r} has none")
    return principal


async def admit(keys: KeyRing | None, limiter: SharedRateLimiter, method: str, authorization: str | None, *,
                admin_method: bool = False) -> Principal:
    """``authenticate``, then the tenant's rate limit (not for admin methods). Every edge, gRPC
    and HTTP, admits so."""
    principal = authenticate(keys, method, authorization, admin_method=admin_method)
    if keys is not None and not admin_method:
        await limiter.check(principal)
    return principal


def _authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode()
    return None


def _trace_context(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or ()
            if key in TRACE_METADATA and isinstance(value, str)}


Unary = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncGenerator[Any, None]]
Writing = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


@dataclass
class EdgeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    # The current key ring, read on every call (None: no authentication, --insecure).
    keys: Callable[[], KeyRing | None]
    limiter: SharedRateLimiter
    metrics: RouterMetrics
    slots: StreamSlots
    tracing: RouterTracing = field(default_factory=RouterTracing)
    # Ends streams whose client stopped reading.
    stalls: StalledWrites = field(default_factory=StalledWrites)

    def _begin(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> RequestTrace:
        if not self.tracing.enabled or method not in TRACED_METHODS:
            return NO_TRACE
        trace = self.tracing.begin_rpc(method, _trace_context(context))
        _trace.set(trace)
        return trace

    def _status(self, exc: Exception) -> grpc.Status:
        """The one mapping of an outcome to a status (and the metric a budget refusal adds)."""
        if isinstance(exc, errors.BudgetExhausted):
            self.metrics.budget_rejection(exc.tenant)
        return status_for(exc)

    def _refusal(self, method: str, exc: errors.SchedulerError) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler for a call refused from its metadata. It takes the request as a stream (gRPC
        then asks the transport for no message) and never reads it: the status goes out at once,
        and flow control lets at most one stream window of the message in."""
        status = self._status(exc)

        async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            self.metrics.request(method, status.code.name)
            await _abort(context, status)

        return grpc.stream_unary_rpc_method_handler(refuse)

    def _unary(self, method: str, inner: Unary, principal: Principal, limited: bool) -> Unary:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            code, message = grpc.StatusCode.OK, ""
            trace = self._begin(method, context)
            try:
                if limited:
                    await self.limiter.check(principal)
                _principal.set(principal)
                _refuse_rejected(request)
                return await inner(request, context)
            except grpc.aio.AbortError:
                code = grpc.StatusCode.UNKNOWN
                raise
            except Exception as exc:
                status = self._status(exc)
                code, message = status.code, status.details
                await _abort(context, status)
            finally:
                self.metrics.request(method, code.name)
                trace.end(code.name, message)

        return behavior

    def _streaming(self, method: str, inner: Streaming, principal: Principal, limited: bool) -> Writing:
        """The servicer's async generator, its messages written here (``context.write``) so that
        each write is watched: a client that stops reading ends the call."""
        stalls = self.stalls

        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            code, message = grpc.StatusCode.OK, ""
            slot: Principal | None = None
            responses: AsyncGenerator[Any, None] | None = None
            watched = None
            trace = self._begin(method, context)
            try:
                if limited:
                    await self.limiter.check(principal)
                _principal.set(principal)
                _refuse_rejected(request)
                self.slots.acquire(principal)
                slot = principal
                watched = stalls.watch()
                responses = inner(request, context)
                async for response in responses:
                    watched.since = stalls.now
                    await context.write(response)
                    watched.since = None
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                code = grpc.StatusCode.UNKNOWN
                raise
            except Exception as exc:
                status = self._status(exc)
                code, message = status.code, status.details
                await _abort(context, status)
            finally:
                if watched is not None:
                    stalls.forget(watched)
                    if watched.ended is not None:
                        message = f"the client stopped reading ({watched.ended})"
                if responses is not None:
                    # Here, not when the generator is collected: the receipt is booked and the
                    # region stream closed before the slot is given back.
                    await responses.aclose()
                if slot is not None:
                    self.slots.release(slot)
                self.metrics.request(method, code.name)
                trace.end(code.name, message)

        return behavior

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        # grpc's stubs type handlers for the sync server; aio behaviours are coroutines.
        handler: Any = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        keys = self.keys()
        admin_method = method.startswith(ADMIN_PREFIX)
        try:
            # Here gRPC has read the call's headers, not its message.
            principal = authenticate(keys, method, _authorization(handler_call_details.invocation_metadata),  # type: ignore[attr-defined]
                                     admin_method=admin_method)
        except (errors.Unauthenticated, errors.PermissionDenied) as exc:
            return self._refusal(method, exc)
        limited = keys is not None and not admin_method
        if method in GUARDED_DESERIALIZERS:
            handler = handler._replace(request_deserializer=GUARDED_DESERIALIZERS[method])
        elif handler.request_deserializer is not None:
            handler = handler._replace(request_deserializer=decoded(handler.request_deserializer, f"request to {method}"))
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary, principal, limited))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(method, handler.unary_stream, principal, limited))
        return handler
