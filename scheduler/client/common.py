"""What the sync and async clients share: building requests, channels, metadata, retry policy."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from scheduler.client.errors import SchedulerRpcError, UnavailableError
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2
from scheduler.wire.retry import JITTER, RetryPolicy

DECISION_DETAILS = {"full": pb.DECISION_DETAIL_FULL, "summary": pb.DECISION_DETAIL_SUMMARY}
WORKLOAD_CLASSES = {
    "interactive": pb.WORKLOAD_CLASS_INTERACTIVE,
    "batch": pb.WORKLOAD_CLASS_BATCH,
    "deferrable": pb.WORKLOAD_CLASS_DEFERRABLE,
}
WORKFLOW_SHAPES = {"chain": pb.WORKFLOW_SHAPE_CHAIN, "fanout": pb.WORKFLOW_SHAPE_FANOUT, "dag": pb.WORKFLOW_SHAPE_DAG}


@dataclass(frozen=True)
class TlsConfig:
    """Server verification (``ca_cert``: None = the system roots) and, for mTLS, a client
    certificate and key. Paths or PEM bytes."""

    ca_cert: Path | bytes | None = None
    client_cert: Path | bytes | None = None
    client_key: Path | bytes | None = None
    # Verify the server as this name (e.g. when connecting by IP to a cert for "localhost").
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca_cert),
            private_key=_pem(self.client_key),
            certificate_chain=_pem(self.client_cert),
        )

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _pem(value: Path | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def channel_options(tls: TlsConfig | None) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [("grpc.keepalive_time_ms", 30_000)]
    if tls is not None:
        options += tls.options()
    return options


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def resolve_tls(tls: TlsConfig | bool | None) -> TlsConfig | None:
    """True: TLS with the system roots; False/None: plaintext."""
    if tls is True:
        return TlsConfig()
    return tls or None


def build_request(
    *,
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
    tenant: str = "",
    # Empty: the client makes one, so that retries of this request share it.
    request_id: str = "",
    temperature: float | None = None,
    top_p: float | None = None,
    stop: Sequence[str] = (),
    seed: int | None = None,
    workload_class: str = "interactive",
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    jurisdictions: Sequence[str] = (),
    certifications: Sequence[str] = (),
    precision: str = "",
    task_class: str = "",
    client_location: tuple[float, float] | None = None,
    prefix_key: str = "",
    workflow_id: str = "",
    workflow_shape: str = "",
    shared_prefix_tokens: int | None = None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    decision_detail: str = "full",
) -> pb.GenerateRequest:
    """A ``GenerateRequest``; the router validates it (INVALID_ARGUMENT names a bad field).
    ``decision_detail``: ``full`` (every ranked candidate and rejection) or ``summary`` (the
    chosen candidate only: less work for the router on every request). ``workflow_shape``:
    ``chain``, ``fanout`` or ``dag`` (with a ``workflow_id``; docs/affinity.md, "Workflow shapes")."""
    if workload_class not in WORKLOAD_CLASSES:
        raise ValueError(f"workload_class must be one of {sorted(WORKLOAD_CLASSES)}, got {workload_class!r}")
    if decision_detail not in DECISION_DETAILS:
        raise ValueError(f"decision_detail must be one of {sorted(DECISION_DETAILS)}, got {decision_detail!r}")
    if workflow_shape and workflow_shape not in WORKFLOW_SHAPES:
        raise ValueError(f"workflow_shape must be one of {sorted(WORKFLOW_SHAPES)}, got {workflow_shape!r}")
    request = pb.GenerateRequest(
        tenant=tenant, request_id=request_id or os.urandom(16).hex(), model=model,
        workload_class=WORKLOAD_CLASSES[workload_class], prefix_key=prefix_key, workflow_id=workflow_id,
        workflow_shape=WORKFLOW_SHAPES.get(workflow_shape, pb.WORKFLOW_SHAPE_UNSPECIFIED),
        decision_detail=DECISION_DETAILS[decision_detail],
    )
    # Sub-messages filled in place (a message given to a constructor is copied), and only
    # with what was asked for.
    request.sampling.max_tokens = max_tokens
    if stop:
        request.sampling.stop.extend(stop)
    if jurisdictions or certifications or precision or task_class:
        compliance = request.compliance
        compliance.allowed_jurisdictions.extend(jurisdictions)
        compliance.required_certifications.extend(certifications)
        compliance.precision, compliance.task_class = precision, task_class
    if prompt is not None:
        request.prompt = prompt
    if messages is not None:
        request.chat.CopyFrom(pb.ChatMessages(
            messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages]))
    for name, value in (("temperature", temperature), ("top_p", top_p), ("seed", seed)):
        if value is not None:
            setattr(request.sampling, name, value)
    for name, value in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms)):
        if value is not None:
            setattr(request.slo, name, value)
    if client_location is not None:
        request.client_location.CopyFrom(pb.GeoPoint(lat=client_location[0], lon=client_location[1]))
    if prompt_tokens is not None:
        request.prompt_tokens = prompt_tokens
    if cached_tokens is not None:
        request.cached_tokens = cached_tokens
    if shared_prefix_tokens is not None:
        request.shared_prefix_tokens = shared_prefix_tokens
    return request


def retryable(error: Exception) -> bool:
    """Retry only what is safe: UNAVAILABLE before any text reached the client."""
    return isinstance(error, UnavailableError) and error.retryable


def retry_hint_s(error: Exception) -> float | None:
    """The wait the router asked for (its ``RetryInfo``, over gRPC and Connect alike)."""
    return error.retry_after_s if isinstance(error, SchedulerRpcError) else None


class StreamState:
    """What a Generate stream has delivered so far, shared by the sync and async clients:
    the decision, the receipt, the attempts made and the deadline they share."""

    def __init__(self, request: pb.GenerateRequest, timeout_s: float | None, retry: RetryPolicy) -> None:
        self.request = request
        self.decision: pb.Decision | None = None
        self.receipt: pb.EnergyReceipt | None = None
        self.attempts = 0
        self._retry = retry
        self._timeout_s = timeout_s
        self._deadline: float | None = None

    def begin_attempt(self) -> float | None:
        """Start an attempt; the seconds it may take (None: no deadline)."""
        if self.attempts == 0 and self._timeout_s is not None:
            self._deadline = time.monotonic() + self._timeout_s
        self.attempts += 1
        return None if self._deadline is None else max(0.001, self._deadline - time.monotonic())

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self._deadline is None else max(0.001, self._deadline - time.monotonic())

    def take(self, event: pb.GenerateResponse) -> str | None:
        """Record a decision or receipt; the text of a chunk."""
        kind = event.WhichOneof("event")
        if kind == "chunk":
            return event.chunk.text
        if kind == "decision":
            self.decision = event.decision
        elif kind == "receipt":
            self.receipt = event.receipt
        return None

    def retry_delay(self, error: SchedulerRpcError, received_text: bool) -> float:
        """Seconds to wait before the next attempt, or raise ``error``: nothing is retried
        once text reached the caller, nor past the deadline."""
        retry = self.attempts - 1
        if received_text or not retryable(error) or not self._retry.retries_after(retry):
            raise error
        delay = self._retry.delay_s(retry, error.retry_after_s, JITTER)
        if self._deadline is not None and time.monotonic() + delay >= self._deadline:
            raise error
        return delay


@dataclass(frozen=True)
class DeferredAnswer:
    """A deferred request's answer, as ``WaitDeferred`` streams it: the release's decision
    (``deferred_until_unix_s`` and ``deferral`` set), the whole text, the receipt
    (``released_at_unix_s`` and ``deferral`` set)."""

    request_id: str
    decision: pb.Decision | None
    text: str
    receipt: pb.EnergyReceipt | None


def defer_request(request: pb.GenerateRequest, deadline_unix_s: float) -> router_pb2.DeferRequest:
    """A ``DeferRequest``: ``deadline_unix_s`` 0 means the policy's deferrable TTFT SLO from now."""
    return router_pb2.DeferRequest(request=request, deadline_unix_s=deadline_unix_s)


def wait_state(request_id: str, timeout_s: float | None, retry: RetryPolicy) -> StreamState:
    """The state of a ``WaitDeferred`` stream: a Generate stream's (the same events, the same
    retries before the first of them, one deadline for all attempts) for the request id."""
    return StreamState(pb.GenerateRequest(request_id=request_id), timeout_s, retry)
