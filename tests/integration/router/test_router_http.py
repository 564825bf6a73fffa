"""The router's HTTP front door, driven by clients it did not come with: the official ``openai``
client (sync, async, streaming and not), curl, and httpx for the Connect-protocol Route; and
the SDK's direct mode over it. Same keys, same decision, same ledger and audit as gRPC."""

from __future__ import annotations

import asyncio
import json
import subprocess

import httpx
import openai
import pytest

from scheduler.client import AsyncSchedulerClient, SchedulerClient
from scheduler.client.common import build_request
from scheduler.client.errors import InvalidArgumentError
from scheduler.ledger.ledger import Ledger
from scheduler.server.app import RunningRouter
from scheduler.state import keys as store_keys
from scheduler.state.memory_store import MemoryStore
from scheduler.tickets import TicketKeyRing
from scheduler.v1 import router_pb2

from .conftest import TEST_REGIONS, Fleet, Keys, RouterFactory, stub_regions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama-3.1-8b"


def base_url(router: RunningRouter) -> str:
    assert router.http_port is not None
    return f"http://127.0.0.1:{router.http_port}"


async def booked(store: MemoryStore, tenant: str, want: int, wait_s: float = 5.0) -> tuple[float, list[dict[str, str]]]:
    """The ledger's request count and the audit entries once ``want`` requests are in."""
    ledger = Ledger(store)
    for _ in range(int(wait_s / 0.05)):
        requests = (await ledger.usage(tenant))[0].requests
        if requests >= want:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.2)  # a double booking would land by now
    audit = [fields for _, fields in await store.xrange(store_keys.AUDIT, 1000)]
    return (await ledger.usage(tenant))[0].requests, audit


async def test_the_openai_client_streams_and_gets_whole_answers_with_receipts(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    store = MemoryStore()
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=store, budgets={}, http=True)
    client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
    try:
        whole = await client.completions.with_raw_response.create(model=MODEL, prompt="Hello", max_tokens=3)
        completion = whole.parse()
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
            stream_options={"include_usage": True},
            extra_body={"x_scheduler": {"jurisdictions": ["EU"], "request_id": "eu-only"}})]
        chat = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=2, extra_headers={"x-scheduler-jurisdictions": "US"})
        models = await client.models.list()
    finally:
        await client.close()

    assert completion.choices[0].text == "lorem ipsum dolor "
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    receipt = (completion.model_extra or {})["energy_receipt"]
    assert receipt["energy_j"] > 0 and receipt["completion_tokens"] == 3 and receipt["region"] in TEST_REGIONS
    assert float(whole.headers["x-energy-joules"]) == pytest.approx(receipt["energy_j"], rel=1e-5)
    assert whole.headers["x-energy-decision-id"] == receipt["decision_id"]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "lorem ipsum dolor sit "
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chat.choices[0].message.content == "lorem ipsum "
    assert (chat.model_extra or {})["energy_receipt"]["region"] == "us-east"  # the header hint
    assert MODEL in {m.id for m in models.data}

    requests, audit = await booked(store, "acme", 3)
    assert requests == 3
    assert len(audit) == 3 and {a["tenant"] for a in audit} == {"acme"}
    assert next(a["region"] for a in audit if a["request_id"] == "eu-only") in ("eu-north", "eu-central")


async def test_the_sync_openai_client_and_its_errors(stub_fleet: Fleet, make_router: RouterFactory,
                                                     keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True)

    def use_sync_client() -> None:
        client = openai.OpenAI(base_url=base_url(router) + "/v1", api_key=keys.tenant.key, max_retries=0)
        stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, stream=True)
        assert "".join(c.choices[0].text for c in stream) == "lorem ipsum "
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url(router) + "/v1", api_key="sk-nope.nope", max_retries=0).models.list()
        with pytest.raises(openai.BadRequestError) as unknown:
            client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
        assert isinstance(unknown.value.body, dict) and unknown.value.body["param"] == "model"
        with pytest.raises(openai.BadRequestError) as functions:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                           functions=[{"name": "f"}])
        assert "functions" in functions.value.message and "not supported" in functions.value.message
        with pytest.raises(openai.BadRequestError) as nowhere:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                      extra_body={"x_scheduler": {"jurisdictions": ["JP"]}})
        assert nowhere.value.code == "unschedulable"
        client.close()

    # The blocking client runs in a thread while the router and regions serve on this loop.
    await asyncio.to_thread(use_sync_client)
    # The bad key was refused with the headers, and counted under its endpoint.
    assert router.deps.metrics.value("scheduler_router_requests_total",
                                     {"code": "UNAUTHENTICATED", "method": "openai.models"}) == 1


async def test_curl_streams_sse_then_done_then_the_receipt(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs, http=True)
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 3, "stream": True})
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-N", "-H", "content-type: application/json", "-d", body, f"{base_url(router)}/v1/completions",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    events = [e for e in out.decode().split("\n\n") if e.strip()]
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts) == "lorem ipsum dolor "
    assert events[-2] == "data: [DONE]"
    name, data = events[-1].split("\n")
    assert name == "event: energy_receipt"
    assert json.loads(data.removeprefix("data: "))["energy_receipt"]["completion_tokens"] == 3


async def test_a_stream_that_fails_before_its_first_token_gets_503(make_router: RouterFactory) -> None:
    async with stub_regions(fail_status=500) as failing:
        router = await make_router(failing.configs, http=True)
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{base_url(router)}/v1/completions",
                                     json={"model": MODEL, "prompt": "Hello", "max_tokens": 3, "stream": True})
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "regions_unavailable"
    assert "every candidate failed" in answer.json()["error"]["message"]



async def test_a_client_that_leaves_mid_stream_is_billed_once_partially(
    slow_fleet: Fleet, make_router: RouterFactory,
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={}, http=True)
    async with httpx.AsyncClient() as http, http.stream("POST", f"{base_url(router)}/v1/completions",
                           json={"model": MODEL, "prompt": "Hello", "max_tokens": 200, "stream": True}) as answer:
        async for line in answer.aiter_lines():
            if line.startswith("data:"):
                break  # leave after the first token
    requests, audit = await booked(store, "local", 1)
    assert requests == 1 and len(audit) == 1
    assert audit[0]["partial"] == "1" and audit[0]["end_reason"] == "cancelled"
    assert router.deps.active_streams == 0 and router.deps.slots.held("local") == 0


async def test_connect_route_answers_protobuf_and_json_with_tickets(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    ring = TicketKeyRing.generate(TEST_REGIONS)
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True, ticket_keys=ring)
    url = f"{base_url(router)}/scheduler.v1.GlobalRouter/Route"
    request = build_request(prompt="Hello", model=MODEL, max_tokens=8, jurisdictions=["EU"])
    auth = {"authorization": f"Bearer {keys.tenant.key}"}
    async with httpx.AsyncClient() as http:
        proto = await http.post(url, content=request.SerializeToString(),
                                headers={**auth, "content-type": "application/proto"})
        as_json = await http.post(url, headers={**auth, "content-type": "application/json"},
                                  content=json.dumps({"model": MODEL, "prompt": "Hi", "sampling": {"maxTokens": 4}}))
        bad = await http.post(url, headers={**auth, "content-type": "application/json"},
                              content=json.dumps({"model": MODEL, "prompt": "Hi", "sampling": {"maxTokens": 0}}))
        anonymous = await http.post(url, content=request.SerializeToString(),
                                    headers={"content-type": "application/proto"})
        garbage = await http.post(url, content=b"\xff\xff\xff", headers={**auth, "content-type": "application/proto"})
    routed = router_pb2.RouteResponse.FromString(proto.content)
    assert proto.status_code == 200 and proto.headers["content-type"] == "application/proto"
    assert routed.targets and {t.region for t in routed.targets} <= {"eu-north", "eu-central"}
    assert all(t.ticket.startswith("v1.") for t in routed.targets)
    assert routed.decision.ranked[0].region == routed.targets[0].region
    assert as_json.status_code == 200 and json.loads(as_json.content)["targets"]
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"
    assert bad.json()["details"][0]["type"] == "google.rpc.BadRequest"
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthenticated"
    assert garbage.status_code == 400 and garbage.json()["code"] == "invalid_argument"


async def test_the_sdk_direct_mode_routes_over_http(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    ring = TicketKeyRing.generate(TEST_REGIONS)
    router = await make_router(stub_fleet.configs, keys=keys.ring, http=True, ticket_keys=ring)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key,
                                    http_url=base_url(router)) as client:
        generation = client.generate("Hello", model=MODEL, max_tokens=3, mode="direct")
        assert await generation.text() == "lorem ipsum dolor "
        assert generation.decision is not None and generation.decision.ranked
        with pytest.raises(InvalidArgumentError) as refused:
            await client.generate("Hello", model=MODEL, max_tokens=3, mode="direct", jurisdictions=["eu"]).text()
    assert refused.value.field_violations[0].field.startswith("compliance.allowed_jurisdictions")
    # Route over HTTP counts like Route over gRPC.
    assert router.deps.metrics.value("scheduler_router_requests_total", {"method": "Route", "code": "OK"}) == 1

    def sync_direct() -> str:
        with SchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key, http_url=base_url(router)) as sync:
            return sync.generate("Hello", model=MODEL, max_tokens=2, mode="direct").text()

    assert await asyncio.to_thread(sync_direct) == "lorem ipsum "
