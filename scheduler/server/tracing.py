"""Request tracing (OpenTelemetry): a span per request, with its decision, each dispatch attempt
and its receipt as children.

Off by default: ``RouterTracing()`` has no tracer, every request gets ``NO_TRACE`` (OpenTelemetry's
invalid, non-recording span) and each instrumentation point costs an attribute read or a no-op
call (``docs/tracing.md``). ``scheduler router --otlp-endpoint URL``, or the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables alone
(``traces_endpoint_from``), export over OTLP http/protobuf. Only the OpenTelemetry API is a
dependency: the SDK and the exporter are the ``otlp`` extra, imported when tracing is turned on;
tests give ``RouterTracing`` a provider of their own (the SDK's in-memory exporter). The
provider belongs to one router (``RouterDeps.tracing``), never to the process: nothing here
touches OpenTelemetry's global provider, propagator or context.

The tree of a proxied request::

    scheduler.v1.GlobalRouter/Generate | POST /v1/chat/completions   SERVER
      scheduler.decide                                                INTERNAL  policy, candidates, choice
      chat llama-3.1-8b                                               CLIENT    one per candidate tried
      scheduler.receipt                                               INTERNAL  energy, carbon, end reason

Attributes follow the GenAI semantic conventions (``gen_ai.*``), the RPC and HTTP ones where they
apply (``rpc.*``, ``http.*``, ``server.*``, ``error.type``), and ours under ``scheduler.``. No
prompt or completion text is ever recorded. A dispatch carries its attempt span's context to the
region in a W3C ``traceparent`` header; a client's ``traceparent`` (HTTP header or gRPC metadata)
makes the request span its child.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from scheduler.types import Candidate, Decision, EnergyReceipt, Request

OTLP_EXTRA = "otlp"
# The standard variables (OpenTelemetry's exporter specification): the traces endpoint, used as
# it is, else the base endpoint of every signal, to which /v1/traces is added.
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
DEFAULT_SERVICE_NAME = "carbon-scheduler-router"
# What the regions serve (gen_ai.provider.name of a dispatch attempt): vLLM's OpenAI-compatible API.
REGION_PROVIDER = "vllm"
# gRPC codes that make a server span an error (the RPC conventions); others are the caller's.
SERVER_ERROR_CODES = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
                                "DATA_LOSS"})
# Stateless (W3C trace context only); OpenTelemetry's global propagator is never read or set.
_PROPAGATOR = TraceContextTextMapPropagator()
_ROOT = Context()


class TracingUnavailable(Exception):
    """The OTLP exporter is not installed (the ``otlp`` extra)."""


def operation_name(path: str) -> str:
    """gen_ai.operation.name of an OpenAI path."""
    return "chat" if path.endswith("/chat/completions") else "text_completion"


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's span and the tracer of its children (``NO_TRACE``: not traced)."""

    span: Span
    # None: the span is not recorded (tracing off, or this trace sampled out): no children.
    tracer: Tracer | None = None

    @property
    def recording(self) -> bool:
        return self.tracer is not None

    def child(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, Any] | None = None) -> Span:
        """A child span, started now; end it (``with`` it: an exception marks it failed)."""
        if self.tracer is None:
            return INVALID_SPAN
        return self.tracer.start_span(name, context=set_span_in_context(self.span), kind=kind, attributes=attributes)

    def inject(self, span: Span, headers: MutableMapping[str, str]) -> None:
        """``traceparent`` (and ``tracestate``) of ``span`` into outgoing headers; of the request's
        span when ``span`` is not recorded (a sampled-out trace stays sampled out downstream)."""
        if self.span is INVALID_SPAN:
            return
        carrier = span if span.get_span_context().is_valid else self.span
        _PROPAGATOR.inject(headers, set_span_in_context(carrier))

    def end(self, code: str, message: str = "", http_status: int | None = None) -> None:
        """End the request span with its outcome: ``code`` as gRPC names it (``OK``,
        ``UNAVAILABLE``, ...: what the edges count in the metrics), the HTTP status on the front door."""
        if self.tracer is None:
            return
        span = self.span
        if http_status is not None:
            span.set_attribute("http.response.status_code", http_status)
        if code != "OK":
            span.set_attribute("error.type", code)
            if code in SERVER_ERROR_CODES or (http_status or 0) >= 500:
                span.set_status(Status(StatusCode.ERROR, message or code))
        span.end()


NO_TRACE = RequestTrace(INVALID_SPAN)


class RouterTracing:
    """The router's tracer (one per router); without a provider, tracing is off."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer = None if provider is None else provider.get_tracer("scheduler.server", _version())

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @classmethod
    def otlp(cls, endpoint: str, service_name: str = DEFAULT_SERVICE_NAME, instance_id: str = "",
             source: str = "--otlp-endpoint", exact: bool = False) -> RouterTracing:
        """Export to an OTLP collector over http/protobuf (``otlp_traces_url``), in batches, from
        the SDK's exporter thread. Sampling, headers and timeouts follow the standard
        ``OTEL_TRACES_SAMPLER*`` and ``OTEL_EXPORTER_OTLP_*`` variables."""
        url = otlp_traces_url(endpoint, source, exact)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.name": service_name, "service.version": _version()}
        if instance_id:
            attributes["service.instance.id"] = instance_id
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        return cls(provider)

    def begin(self, name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any]) -> RequestTrace:
        """A request's SERVER span, the child of the caller's ``traceparent`` in ``carrier`` if any."""
        if self.tracer is None:
            return NO_TRACE
        parent = _PROPAGATOR.extract(carrier, _ROOT) if "traceparent" in carrier else _ROOT
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return RequestTrace(span, self.tracer if span.is_recording() else None)

    def begin_rpc(self, method: str, carrier: Mapping[str, str]) -> RequestTrace:
        """``/scheduler.v1.GlobalRouter/Generate`` -> span ``scheduler.v1.GlobalRouter/Generate``."""
        if self.tracer is None:
            return NO_TRACE
        service, _, name = method.lstrip("/").partition("/")
        return self.begin(method.lstrip("/"), carrier,
                          {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name})

    def begin_http(self, method: str, path: str, headers: Mapping[str, str]) -> RequestTrace:
        if self.tracer is None:
            return NO_TRACE
        return self.begin(f"{method} {path}", headers,
                          {"http.request.method": method, "http.route": path, "url.path": path})

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        """Flush what is still queued and stop the exporter (after the last stream booked)."""
        if self.provider is not None:
            await asyncio.to_thread(self.provider.shutdown)


@dataclass(frozen=True, slots=True)
class TracesEndpoint:
    """Where traces go and what said so (a flag or a variable, for the errors)."""

    url: str
    source: str
    # True: the URL is the traces endpoint itself (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), used as is.
    exact: bool = False


def traces_endpoint_from(flag: str | None, environ: Mapping[str, str]) -> TracesEndpoint | None:
    """Where the router exports traces; None: tracing off. ``--otlp-endpoint`` first, else the
    standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (as is), else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (a base URL); ``OTEL_SDK_DISABLED=true`` turns the variables' tracing off."""
    if flag:
        return TracesEndpoint(flag, "--otlp-endpoint")
    if environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true":
        return None
    if environ.get(TRACES_ENDPOINT_ENV):
        return TracesEndpoint(environ[TRACES_ENDPOINT_ENV], TRACES_ENDPOINT_ENV, exact=True)
    if environ.get(ENDPOINT_ENV):
        return TracesEndpoint(environ[ENDPOINT_ENV], ENDPOINT_ENV)
    return None


def otlp_traces_url(endpoint: str, source: str = "--otlp-endpoint", exact: bool = False) -> str:
    """The OTLP http/protobuf traces URL of a collector's base URL (``http://collector:4318``;
    ``/v1/traces`` is added unless given or ``exact``). ``TracingUnavailable`` naming ``source``
    when it is not an http(s) URL or the SDK and exporter (the ``otlp`` extra) are not
    installed: the router refuses to start so."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TracingUnavailable(f"{source}: expected an http(s) URL like http://collector:4318, "
                                 f"got {endpoint!r}")
    try:
        for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
            importlib.import_module(module)
    except ImportError as exc:
        raise TracingUnavailable(
            f"{source} turns tracing on, which needs the OpenTelemetry SDK and OTLP exporter: pip install "
            f"'carbon-scheduler[{OTLP_EXTRA}]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http; "
            f"{exc})") from None
    url = endpoint.rstrip("/")
    return url if exact or url.endswith("/v1/traces") else url + "/v1/traces"


def _version() -> str:
    try:
        return metadata.version("carbon-scheduler")
    except metadata.PackageNotFoundError:
        return "dev"


# --- attributes (built only for recording spans) -------------------------------------------------

def request_attributes(request: Request, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the GenAI conventions name it, and what the scheduler reads of it;
    ``path`` and ``body``: the OpenAI call it is sent as."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation_name(path),
        "gen_ai.request.model": request.model,
        "gen_ai.request.max_tokens": request.max_tokens,
        "scheduler.request_id": request.request_id,
        "scheduler.tenant": request.tenant,
        "scheduler.workload_class": request.workload_class,
        "scheduler.prompt_tokens": request.prompt_tokens,
    }
    for key, name in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p"),
                      ("seed", "gen_ai.request.seed")):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    if request.allowed_jurisdictions:
        attributes["scheduler.jurisdictions"] = sorted(request.allowed_jurisdictions)
    return attributes


def decision_attributes(decision: Decision) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "scheduler.policy": decision.policy,
        "scheduler.candidates": len(decision.fleet),
        "scheduler.ranked": len(decision.order),
        "scheduler.rejected": decision.rejected_count,
        "scheduler.energy_ranking": decision.energy_ranking,
        "scheduler.fallbacks": [f.signal for f in decision.fallbacks],
    }
    if decision.canary_arm:
        attributes["scheduler.canary_arm"] = decision.canary_arm
    if decision.schedulable:
        chosen = decision.ranked_candidates[0]
        attributes["scheduler.region"] = chosen.region.name
        attributes["scheduler.pool"] = chosen.pool.name
        estimate = decision.energy
        if estimate is not None:
            attributes["scheduler.predicted_energy_j"] = estimate.energy_j
    return attributes


def attempt_span(trace: RequestTrace, candidate: Candidate, url: str, path: str, index: int) -> Span:
    """The CLIENT span of one dispatch attempt (``index``: 0 for the first candidate tried), named as
    the GenAI conventions name a model call: ``chat llama-3.1-8b``."""
    if not trace.recording:
        return INVALID_SPAN
    return trace.child(f"{operation_name(path)} {candidate.deployment.name}", SpanKind.CLIENT,
                       attempt_attributes(candidate, url, path, index))


def attempt_attributes(candidate: Candidate, url: str, path: str, index: int) -> dict[str, Any]:
    """A dispatch attempt: a GenAI client call to the region's pool."""
    parts = urlsplit(url)
    return {
        "gen_ai.operation.name": operation_name(path),
        "gen_ai.provider.name": REGION_PROVIDER,
        "gen_ai.request.model": candidate.deployment.name,
        "http.request.method": "POST",
        "url.full": url,
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
        "scheduler.region": candidate.region.name,
        "scheduler.pool": candidate.pool.name,
        "scheduler.attempt": index,
    }


def usage_attributes(usage: Mapping[str, Any] | None, finish_reason: str) -> dict[str, Any]:
    """What the region reported in its final event."""
    attributes: dict[str, Any] = {}
    if usage is not None:
        for key, name in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                          ("completion_tokens", "gen_ai.usage.output_tokens")):
            value = usage.get(key)
            if isinstance(value, int):
                attributes[name] = value
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    return attributes


def attempt_failed(span: Span, exc: BaseException) -> None:
    """Mark an attempt span failed: the region's error (as the failover record has it), an invalid
    request, a deadline. A cancelled attempt (the client went away) is no failure of the region."""
    if not span.is_recording():
        return
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        span.set_attribute("scheduler.cancelled", True)
        return
    status = getattr(exc, "http_status", 0)
    span.set_attribute("error.type", str(status) if status else type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, getattr(exc, "error", "") or str(exc)))


def receipt_attributes(receipt: EnergyReceipt, finish_reason: str) -> dict[str, Any]:
    """The receipt: where it ran, what it cost, how it ended."""
    attributes: dict[str, Any] = {
        "scheduler.decision_id": receipt.decision_id,
        "scheduler.region": receipt.region,
        "scheduler.pool": receipt.pool,
        "scheduler.precision": receipt.precision,
        "scheduler.measurement_source": receipt.measurement_source,
        "scheduler.carbon_basis": receipt.carbon_basis,
        "scheduler.end_reason": receipt.end_reason,
        "scheduler.partial": receipt.partial,
        "scheduler.failovers": len(receipt.failovers),
        "scheduler.fallbacks": [f.signal for f in receipt.fallbacks],
        "gen_ai.response.model": receipt.model,
    }
    for name, value in (("gen_ai.usage.input_tokens", receipt.prompt_tokens),
                        ("gen_ai.usage.output_tokens", receipt.completion_tokens),
                        ("gen_ai.usage.cache_read.input_tokens", receipt.reused_tokens),
                        ("scheduler.energy_j", receipt.energy_j),
                        ("scheduler.energy_j_low", receipt.energy_j_low),
                        ("scheduler.energy_j_high", receipt.energy_j_high),
                        ("scheduler.carbon_g", receipt.carbon_g),
                        ("scheduler.carbon_intensity_g_per_kwh", receipt.carbon_intensity_g_per_kwh),
                        ("scheduler.pue", receipt.pue)):
        if value is not None:
            attributes[name] = value
    if receipt.ttft_ms is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = receipt.ttft_ms / 1000
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    return attributes
