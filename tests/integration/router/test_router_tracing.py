"""Request traces (OpenTelemetry): one span per request with the decision, each dispatch attempt and
the receipt as children, exported through the SDK's in-memory exporter and, over OTLP
http/protobuf, to a real HTTP collector; the attempt's context reaches the region in
``traceparent``; the client's ``traceparent`` becomes the request span's parent."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scheduler.client import AsyncSchedulerClient
from scheduler.client.common import build_request
from scheduler.http.server import HttpRequest, HttpResponse, HttpServer
from scheduler.server.tracing import RouterTracing, TracingUnavailable, otlp_traces_url
from scheduler.v1 import router_pb2_grpc

from .conftest import Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama-3.1-8b"
PROMPT = "The quick brown fox asks where to run this request"
CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE_ID}-00f067aa0ba902b7-01"


def in_memory() -> tuple[RouterTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RouterTracing(provider), exporter


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """The span tree as indented lines, children in start order (what a test failure prints)."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None and span.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s.start_time or 0):
            lines.append("  " * depth + f"{span.name} [{span.kind.name}]")
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return lines


async def test_a_proxied_stream_with_a_failover_exports_its_span_tree(
    stub_fleet: Fleet, make_router: RouterFactory,
) -> None:
    tracing, exporter = in_memory()
    router = await make_router(stub_fleet.configs, tracing=tracing)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        decision = await client.route(PROMPT, model=MODEL, max_tokens=4, jurisdictions=["EU"])
        first = decision.ranked[0].region
        stub_fleet.regions[first].settings.fail_status = 503
    exporter.clear()
    # A caller that traces sends its context in the metadata (the SDK's client does not trace).
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        call = router_pb2_grpc.GlobalRouterStub(channel).Generate(
            build_request(prompt=PROMPT, model=MODEL, max_tokens=4, jurisdictions=["EU"]),
            metadata=(("traceparent", CLIENT_PARENT),))
        answers = [answer async for answer in call]
    assert "".join(a.chunk.text for a in answers if a.HasField("chunk")) == "lorem ipsum dolor sit "
    receipt = next(a.receipt for a in answers if a.HasField("receipt"))
    assert receipt.region != first
    await router.stop(grace_s=0.5)  # every span ended (the request span ends as the call does)

    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        "scheduler.v1.GlobalRouter/Generate [SERVER]",
        "  scheduler.decide [INTERNAL]",
        f"  text_completion {MODEL} [CLIENT]",
        f"  text_completion {MODEL} [CLIENT]",
        "  scheduler.receipt [INTERNAL]",
    ], tree(spans)
    request = next(s for s in spans if s.kind is SpanKind.SERVER)
    failed, served = sorted((s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0)
    decide = next(s for s in spans if s.name == "scheduler.decide")
    booked = next(s for s in spans if s.name == "scheduler.receipt")

    # The caller's trace continues: one trace id from the client through the region.
    assert {format(s.context.trace_id, "032x") for s in spans} == {CLIENT_TRACE_ID}
    assert request.parent is not None and format(request.parent.span_id, "016x") == "00f067aa0ba902b7"
    attrs = request.attributes or {}
    assert attrs["rpc.system"] == "grpc" and attrs["rpc.method"] == "Generate"
    assert attrs["gen_ai.operation.name"] == "text_completion" and attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.request.max_tokens"] == 4 and attrs["scheduler.failovers"] == 1
    assert attrs["scheduler.decision_id"] == receipt.decision_id and attrs["scheduler.region"] == receipt.region
    assert attrs["scheduler.energy_j"] == pytest.approx(receipt.energy_j, rel=1e-6)
    assert attrs["scheduler.carbon_g"] == pytest.approx(receipt.carbon_g, rel=1e-6)
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert request.status.status_code is StatusCode.UNSET
    assert not any("prompt" in key and isinstance(value, str) for key, value in attrs.items())  # no text

    assert (decide.attributes or {})["scheduler.region"] == first  # what it decided, before the failover
    assert (decide.attributes or {})["scheduler.policy"] == "default"

    failed_attrs, served_attrs = failed.attributes or {}, served.attributes or {}
    assert failed_attrs["scheduler.region"] == first and failed_attrs["http.response.status_code"] == 503
    assert failed.status.status_code is StatusCode.ERROR and failed_attrs["error.type"] == "503"
    assert served_attrs["scheduler.region"] == receipt.region and served_attrs["scheduler.attempt"] == 1
    assert served_attrs["gen_ai.provider.name"] == "vllm" and served_attrs["gen_ai.usage.output_tokens"] == 4
    assert served_attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert (booked.attributes or {})["scheduler.end_reason"] == "complete"

    # Each region saw the context of its own attempt span.
    for span, region in ((failed, first), (served, receipt.region)):
        header = stub_fleet.regions[region].log.headers[-1]["traceparent"]
        assert header == f"00-{CLIENT_TRACE_ID}-{span.context.span_id:016x}-01"


async def test_the_openai_front_door_traces_and_an_unschedulable_request_is_marked(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    tracing, exporter = in_memory()
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True, tracing=tracing)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key=keys.tenant.key,
                                max_retries=0)
    try:
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True)]
        assert chunks
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=3, extra_body={"x_scheduler": {"jurisdictions": ["MARS"]}})
    finally:
        await client.close()
    await router.stop(grace_s=0.5)

    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.kind is SpanKind.SERVER]
    assert [s.name for s in roots] == ["POST /v1/chat/completions"] * 2, tree(spans)
    streamed, refused = sorted(roots, key=lambda s: s.start_time or 0)
    children = [s.name for s in spans if s.parent is not None and s.parent.span_id == streamed.context.span_id]
    assert sorted(children) == sorted(["scheduler.decide", f"chat {MODEL}", "scheduler.receipt"]), tree(spans)
    assert (streamed.attributes or {})["gen_ai.operation.name"] == "chat"
    assert (streamed.attributes or {})["http.response.status_code"] == 200
    assert (streamed.attributes or {})["scheduler.tenant"] == "acme"
    refused_attrs = refused.attributes or {}
    assert refused_attrs["http.response.status_code"] == 400 and "error.type" in refused_attrs
    # The caller's mistake, not the server's: the span's status stays unset (HTTP server conventions).
    assert refused.status.status_code is StatusCode.UNSET


async def test_tracing_off_sends_no_trace_context(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        call = router_pb2_grpc.GlobalRouterStub(channel).Generate(
            build_request(prompt=PROMPT, model=MODEL, max_tokens=2), metadata=(("traceparent", CLIENT_PARENT),))
        receipts = [a.receipt async for a in call if a.HasField("receipt")]
    receipt = receipts[0]
    assert "traceparent" not in stub_fleet.regions[receipt.region].log.headers[-1]


async def test_spans_reach_an_otlp_collector_over_http_protobuf(stub_fleet: Fleet,
                                                                 make_router: RouterFactory) -> None:
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: HttpRequest) -> HttpResponse:
        assert request.headers["content-type"] == "application/x-protobuf"
        received.append(ExportTraceServiceRequest.FromString(request.body))
        return HttpResponse(200, b"", "application/x-protobuf")

    collector = HttpServer({("POST", "/v1/traces"): collect})
    port = await collector.start("127.0.0.1", 0)
    try:
        tracing = RouterTracing.otlp(f"http://127.0.0.1:{port}", "router-under-test", instance_id="test:1")
        router = await make_router(stub_fleet.configs, tracing=tracing)
        async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
            await client.generate(PROMPT, model=MODEL, max_tokens=2).text()
        await router.stop(grace_s=0.5)  # flushes the batch
    finally:
        await collector.stop(grace_s=0.5)

    resources = [rs for export in received for rs in export.resource_spans]
    assert resources, "nothing exported"
    resource = {a.key: a.value.string_value for a in resources[0].resource.attributes}
    assert resource["service.name"] == "router-under-test" and resource["service.instance.id"] == "test:1"
    names = sorted(s.name for rs in resources for ss in rs.scope_spans for s in ss.spans)
    assert names == sorted(["scheduler.v1.GlobalRouter/Generate", "scheduler.decide", f"text_completion {MODEL}",
                            "scheduler.receipt"])


def test_an_otlp_endpoint_must_be_an_http_url() -> None:
    assert otlp_traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("https://c.example/v1/traces") == "https://c.example/v1/traces"
    for bad in ("collector:4318", "grpc://collector:4317", "http://"):
        with pytest.raises(TracingUnavailable, match="--otlp-endpoint"):
            otlp_traces_url(bad)


def test_the_router_refuses_to_start_with_a_bad_otlp_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli import main

    assert main(["router", "--otlp-endpoint", "collector:4318", "--insecure-no-tickets", "--state", "memory"]) == 2
    assert "expected an http(s) URL" in capsys.readouterr().err


def test_grpc_status_codes_that_are_the_callers_do_not_mark_the_span() -> None:
    tracing, exporter = in_memory()
    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE):
        tracing.begin_rpc("/scheduler.v1.GlobalRouter/Route", {}).end(code.name, "why")
    caller, server = exporter.get_finished_spans()
    assert caller.status.status_code is StatusCode.UNSET and (caller.attributes or {})["error.type"] == "INVALID_ARGUMENT"
    assert server.status.status_code is StatusCode.ERROR and server.status.description == "why"
