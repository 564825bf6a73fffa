"""Generate over the router's HTTP front door in the Connect protocol's streaming form: the SDK's
proxy mode when it is given the router's HTTP address, and raw HTTP clients. The same stream as
gRPC's (decision, text, receipt), the same errors, the same ledger and audit."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from scheduler.client import AsyncSchedulerClient, RetryPolicy, SchedulerClient
from scheduler.client.common import build_request
from scheduler.client.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    UnauthenticatedError,
    UnavailableError,
)
from scheduler.envelope import CONNECT_PROTO, END_STREAM, EnvelopeReader, envelope
from scheduler.server.app import RunningRouter
from scheduler.state.memory_store import MemoryStore
from scheduler.v1 import messages_pb2

from .conftest import Fleet, Keys, RouterFactory, stub_regions
from .test_router_http import base_url, booked

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama-3.1-8b"
PATH = "/scheduler.v1.GlobalRouter/Generate"


def target(router: RunningRouter) -> str:
    return f"127.0.0.1:{router.port}"


async def test_the_sdk_proxy_mode_streams_over_http_with_its_decision_and_receipt(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    store = MemoryStore()
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=store, budgets={}, http=True)
    async with AsyncSchedulerClient(target(router), api_key=keys.tenant.key, http_url=base_url(router)) as client:
        generation = client.generate("Hello", model=MODEL, max_tokens=3, jurisdictions=["EU"], request_id="over-http")
        parts = [part async for part in generation]
    assert "".join(parts) == "lorem ipsum dolor "
    assert generation.decision is not None and generation.decision.ranked[0].region in ("eu-north", "eu-central")
    receipt = generation.receipt
    assert receipt is not None and receipt.completion_tokens == 3 and receipt.energy_j > 0
    assert receipt.decision_id == generation.decision.decision_id and receipt.region == generation.decision.ranked[0].region

    def sync_proxy() -> tuple[str, float]:
        with SchedulerClient(target(router), api_key=keys.tenant.key, http_url=base_url(router)) as sync:
            answer = sync.generate("Hello", model=MODEL, max_tokens=2)
            text = answer.text()
            assert answer.receipt is not None
            return text, answer.receipt.energy_j

    text, energy_j = await asyncio.to_thread(sync_proxy)
    assert text == "lorem ipsum " and energy_j > 0
    # Booked once each, like a gRPC stream; counted under the same method.
    requests, audit = await booked(store, "acme", 2)
    assert requests == 2 and len(audit) == 2
    assert next(a for a in audit if a["request_id"] == "over-http")["partial"] == "0"
    assert router.deps.metrics.value("scheduler_router_requests_total", {"method": "Generate", "code": "OK"}) == 2


async def test_errors_end_the_stream_as_connect_errors_and_the_sdk_raises_them_typed(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)
    url = base_url(router) + PATH
    auth = {"authorization": f"Bearer {keys.tenant.key}", "content-type": CONNECT_PROTO}
    request = build_request(prompt="Hello", model="no-such-model", max_tokens=3)
    async with httpx.AsyncClient() as http:
        unknown = await http.post(url, content=envelope(request.SerializeToString()), headers=auth)
        not_enveloped = await http.post(url, content=request.SerializeToString(), headers=auth)
        two = await http.post(url, content=envelope(request.SerializeToString()) * 2, headers=auth)
        wrong_type = await http.post(url, content=envelope(request.SerializeToString()),
                                     headers={**auth, "content-type": "application/proto"})
        bad_timeout = await http.post(url, content=envelope(request.SerializeToString()),
                                      headers={**auth, "connect-timeout-ms": "soon"})

    def end_error(answer: httpx.Response) -> dict[str, object]:
        assert answer.status_code == 200 and answer.headers["content-type"] == CONNECT_PROTO
        [(flags, body)] = EnvelopeReader(1 << 20).feed(answer.content)
        assert flags == END_STREAM
        error: dict[str, object] = json.loads(body)["error"]
        return error

    unknown_error = end_error(unknown)
    assert unknown_error["code"] == "invalid_argument" and "no-such-model" in str(unknown_error["message"])
    assert end_error(not_enveloped)["code"] == "invalid_argument"
    assert "one uncompressed GenerateRequest envelope" in str(end_error(two)["message"])
    assert wrong_type.status_code == 415
    assert "connect-timeout-ms" in str(end_error(bad_timeout)["message"])

    async with AsyncSchedulerClient(target(router), api_key=keys.tenant.key, http_url=base_url(router)) as client:
        with pytest.raises(InvalidArgumentError) as invalid:
            await client.generate("Hello", model="no-such-model", max_tokens=3).text()
    assert invalid.value.field_violations[0].field == "model"
    async with AsyncSchedulerClient(target(router), api_key="sk-nope.nope", http_url=base_url(router)) as client:
        with pytest.raises(UnauthenticatedError):
            await client.generate("Hello", model=MODEL, max_tokens=3).text()


async def test_a_fleet_failing_before_the_first_token_is_retried_then_unavailable(make_router: RouterFactory) -> None:
    async with stub_regions(fail_status=500) as failing:
        router = await make_router(failing.configs, http=True)
        retry = RetryPolicy(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05)
        async with AsyncSchedulerClient(target(router), http_url=base_url(router), retry=retry) as client:
            generation = client.generate("Hello", model=MODEL, max_tokens=3)
            with pytest.raises(UnavailableError) as failed:
                await generation.text()
    assert "every candidate failed" in str(failed.value)
    assert generation.attempts == 2 and generation.decision is not None  # the decision came first



async def test_a_client_that_leaves_is_billed_once_partially_and_a_deadline_ends_the_stream(
    slow_fleet: Fleet, make_router: RouterFactory,
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={}, http=True)
    async with AsyncSchedulerClient(target(router), http_url=base_url(router)) as client:
        generation = client.generate("Hello", model=MODEL, max_tokens=200, request_id="leaves")
        stream = generation.__aiter__()
        assert await anext(stream) == "lorem "
        await stream.aclose()  # the caller stops reading: the connection closes
        late = client.generate("Hello", model=MODEL, max_tokens=200, timeout_s=0.4, request_id="late")
        with pytest.raises(DeadlineExceededError):
            await late.text()
    requests, audit = await booked(store, "local", 2)
    by_request = {a["request_id"]: a for a in audit}
    assert requests == 2 and set(by_request) == {"leaves", "late"}
    assert by_request["leaves"]["partial"] == "1" and by_request["leaves"]["end_reason"] == "cancelled"
    assert by_request["late"]["partial"] == "1" and by_request["late"]["end_reason"] == "deadline"
    assert router.deps.active_streams == 0 and router.deps.slots.held("local") == 0


async def test_a_raw_client_reads_the_same_messages_as_grpc(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs, http=True)
    request = build_request(prompt="Hello", model=MODEL, max_tokens=2)
    async with httpx.AsyncClient() as http:
        answer = await http.post(base_url(router) + PATH, content=envelope(request.SerializeToString()),
                                 headers={"content-type": CONNECT_PROTO, "connect-timeout-ms": "5000"})
    envelopes = EnvelopeReader(1 << 20).feed(answer.content)
    kinds = [messages_pb2.GenerateResponse.FromString(body).WhichOneof("event") for flags, body in envelopes[:-1]]
    assert kinds[0] == "decision" and kinds[-1] == "receipt" and set(kinds[1:-1]) == {"chunk"}
    assert envelopes[-1] == (END_STREAM, b"{}")
