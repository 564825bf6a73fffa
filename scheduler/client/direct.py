"""Direct mode, shared by the sync and async clients: the router decides and signs tickets
(``Route``); the client streams from the region itself over HTTP, failing over down the
targets before the first token. The region writes the receipt to the ledger; the client gets
the same receipt in the stream's final event.

Only the region's reply carries text, so the router's CPU per request is one ``Route``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import orjson

from scheduler.client.errors import InvalidArgumentError, SchedulerRpcError, UnavailableError
from scheduler.sse_parser import DONE, MalformedEvent, SseParser, choice_text, openai_error, parse_event
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2
from scheduler.wire.claims import RegionReceipt
from scheduler.wire.engine_body import message_body
from scheduler.wire.headers import TICKET_HEADER
from scheduler.wire.proto import receipt_to_proto

# Region answers that mean "this request is wrong", not "try the next region".
CLIENT_ERRORS = frozenset({400, 422})


def region_body(request: pb.GenerateRequest, target: router_pb2.DirectTarget,
                decision: pb.Decision | None = None) -> dict[str, Any]:
    """The OpenAI request the region expects: the prompt (or messages) and engine fields the
    ticket is bound to, at the max_tokens of the decision's enforced output budget if it has one
    (the ticket binds it)."""
    max_tokens = request.sampling.max_tokens
    if decision is not None and decision.HasField("output_budget") and decision.output_budget.enforced:
        max_tokens = decision.output_budget.max_tokens
    body: dict[str, Any] = {"model": target.model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "x_scheduler": {"pool": target.pool}}
    if request.WhichOneof("input") == "chat":
        body["messages"] = [message_body(m.role, m.content, m.name, m.tool_call_id,
                                         orjson.loads(m.tool_calls_json) if m.tool_calls_json else None)
                             for m in request.chat.messages]
    else:
        body["prompt"] = request.prompt
    sampling = request.sampling
    for name in ("temperature", "top_p", "seed"):
        if sampling.HasField(name):
            body[name] = getattr(sampling, name)
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.engine_fields_json:
        body.update(orjson.loads(request.engine_fields_json))
    return body


def region_payload(request: pb.GenerateRequest, target: router_pb2.DirectTarget,
                   decision: pb.Decision | None = None) -> bytes:
    return orjson.dumps(region_body(request, target, decision))


def expired(target: router_pb2.DirectTarget, margin_s: float = 1.0) -> bool:
    """The target's ticket lapses within ``margin_s`` (by this machine's clock)."""
    return time.time() + margin_s > target.expires_at_unix_s


def untried(targets: Sequence[router_pb2.DirectTarget],
            failovers: Sequence[pb.Failover]) -> list[router_pb2.DirectTarget]:
    """``targets`` without the regions that already failed this request."""
    failed = {f.region for f in failovers}
    return [t for t in targets if t.region not in failed]


def headers(target: router_pb2.DirectTarget) -> dict[str, str]:
    return {TICKET_HEADER: target.ticket, "content-type": "application/json"}


def region_error(target: router_pb2.DirectTarget, status: int, raw: bytes) -> Exception:
    """What a non-200 answer means: the request's fault (raise) or the region's (fail over)."""
    message, _ = openai_error(raw)
    if status in CLIENT_ERRORS:
        return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"region {target.region} says: {message}")
    return RegionFailed(f"HTTP {status}: {message}", status)


class RegionFailed(Exception):
    def __init__(self, error: str, http_status: int = 0) -> None:
        super().__init__(error)
        self.error = error
        self.http_status = http_status


@dataclass
class DirectStream:
    """Parses one region's SSE reply; ``receipt_claims`` is set by the final event."""

    parser: SseParser = field(default_factory=SseParser)
    done: bool = False
    receipt_claims: dict[str, Any] | None = None

    def feed(self, data: bytes) -> str:
        """The text in ``data``. The caller reads the body to its end after ``done`` (nothing
        follows ``[DONE]``), so that httpx can reuse the connection."""
        texts = []
        for payload in self.parser.feed(data):
            if payload == DONE:
                self.done = True
                break
            try:
                event = parse_event(payload)
            except MalformedEvent as exc:
                raise RegionFailed(str(exc)) from None
            if isinstance(event.get("receipt"), dict):
                self.receipt_claims = event["receipt"]
            texts.append(choice_text(event)[0])
        return "".join(texts)


def receipt_proto(claims: dict[str, Any] | None, failovers: list[pb.Failover]) -> pb.EnergyReceipt | None:
    if claims is None:
        return None
    receipt = receipt_to_proto(RegionReceipt(claims).energy_receipt())
    receipt.failovers.extend(failovers)
    return receipt


def read_timeout_s(remaining_s: float | None) -> float:
    return 60.0 if remaining_s is None else max(0.001, remaining_s)


def timeout(remaining_s: float | None) -> Any:
    """The sync client's httpx timeouts."""
    import httpx

    read = read_timeout_s(remaining_s)
    return httpx.Timeout(connect=min(2.0, read), read=read, write=min(2.0, read), pool=min(2.0, read))


def failover(target: router_pb2.DirectTarget, exc: Exception, received_text: bool) -> pb.Failover:
    """Record a target that failed; raise when text had already reached the caller."""
    error = exc.error if isinstance(exc, RegionFailed) else f"{type(exc).__name__}: {exc}"
    if received_text:
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                               f"region {target.region}/{target.pool} failed after the first token: {error}")
    status = exc.http_status if isinstance(exc, RegionFailed) else 0
    return pb.Failover(region=target.region, pool=target.pool, error=error, http_status=status)


def no_targets() -> SchedulerRpcError:
    return SchedulerRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                            "no direct-mode targets: the router signs no dispatch tickets (it runs without ticket "
                            "keys), or every candidate is a plain vLLM region (reached through the router only): "
                            "use mode='proxy'")


def exhausted(failovers: list[pb.Failover]) -> UnavailableError:
    tried = ", ".join(f"{f.region}/{f.pool} ({f.error})" for f in failovers) or "no targets"
    return UnavailableError(grpc.StatusCode.UNAVAILABLE, f"direct mode: every target failed before the first token: {tried}")
