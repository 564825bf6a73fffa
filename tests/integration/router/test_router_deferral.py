"""Deferral in the router (docs/deferral.md) on real Redis: ``Defer`` holds a deferrable request
for the cleaner window of the forecast in the store, an operator releases it
(``scheduler deferred release``), the router's release loop runs it through the Generate path
(receipt, ledger) and ``GetDeferred`` / ``WaitDeferred`` fetch it. A chain step and a deadline
too close are released at once; a retried id gets the first answer; another tenant's same id
is another request; a store that is down holds nothing; bad input names its field; the caps,
the Defer prompt limit and the stores allowed per jurisdiction refuse before anything is
stored; CancelDeferred (and DELETE on the HTTP front door) drops a request; the HTTP front
door mirrors it."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from scheduler.cli import main
from scheduler.client import AsyncSchedulerClient, SchedulerClient
from scheduler.client.errors import (
    InvalidArgumentError,
    NotFoundError,
    RateLimitedError,
    UnavailableError,
    UnschedulableError,
)
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon.store_io import write_forecast
from scheduler.deferral.queue import DeferralQueue
from scheduler.ledger.budget import TenantBudget
from scheduler.ledger.ledger import Ledger, entry_key
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.state import keys as store_keys
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.types import Signal
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2, router_pb2_grpc

from .conftest import Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
MODEL = "llama-3.1-8b"
HOUR_S = 3600.0
# The forecast every test zone gets: dirty for the current and next hour, clean after.
DIRTY, CLEAN = 400.0, 50.0


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-deferral-router-{uuid.uuid4().hex[:12]}"
    yield name
    await delete_namespace(REDIS_URL, name)


@pytest.fixture
def make_router(namespace: str, make_router: RouterFactory) -> RouterFactory:
    """Routers that stop before the namespace is deleted: a router books its last audit entries
    and ledger lines as it stops, which would otherwise outlive the test."""
    return make_router


@pytest.fixture
async def store(namespace: str) -> AsyncIterator[RedisStore]:
    opened = RedisStore.from_url(REDIS_URL, namespace)
    yield opened
    await opened.close()


async def write_forecasts(store: RedisStore, regions: tuple[RegionConfig, ...], now: float,
                          fetched_at: float | None = None) -> float:
    """Each region's zone: DIRTY for this hour and the next, CLEAN for six hours after (the
    carbon pollers' format, fetched at ``fetched_at``, else now); the start of the clean window."""
    hour = math.floor(now / HOUR_S) * HOUR_S
    fetched = now if fetched_at is None else fetched_at
    for zone in {r.carbon.zone for r in regions}:
        points = [Signal("carbon_intensity", zone, DIRTY if k < 2 else CLEAN, "gCO2eq/kWh", hour + k * HOUR_S,
                         fetched, "test", is_forecast=True) for k in range(8)]
        await write_forecast(store, zone, points)
    return hour + 2 * HOUR_S


def grpc_auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def test_a_held_request_waits_for_the_clean_window_then_runs_when_released(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               budgets={})
    now = time.time()
    clean_from = await write_forecasts(store, stub_fleet.configs, now)
    rid = f"job-{uuid.uuid4().hex[:8]}"
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        held = await client.defer("Summarise the quarter", model=MODEL, max_tokens=5, request_id=rid,
                                  deadline_unix_s=now + 6 * HOUR_S)
        assert held.request_id == rid and held.reason == "window"
        assert held.release_at_unix_s == pytest.approx(clean_from)  # the clean window's start
        assert held.deadline_unix_s == pytest.approx(now + 6 * HOUR_S)
        assert held.decision.deferred_until_unix_s == held.release_at_unix_s
        assert held.decision.deferral.startswith("window: held for the forecast's lowest window")
        assert f"({CLEAN:g} against {DIRTY:g} now)" in held.decision.deferral
        status = await client.get_deferred(rid)
        assert status.state == "held" and status.reason == "window" and not status.text

        # What an operator sees and does: the held request, released now.
        cli = ["--state", REDIS_URL, "--namespace", namespace]
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["deferred", "list", *cli]) == 0
        (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(rid)]
        assert row[1:3] == ["acme", "held"] and "window" in row
        assert await asyncio.to_thread(main, ["deferred", "release", "--tenant", "acme", rid, *cli]) == 0

        answer = await client.wait_deferred(rid, timeout_s=30)
        assert answer.text and answer.decision is not None and answer.receipt is not None
        receipt = answer.receipt
        assert receipt.request_id == rid and receipt.energy_j > 0
        assert now < receipt.released_at_unix_s <= time.time()
        assert receipt.deferral.startswith("operator: released early (operator); was: held for")
        assert answer.decision.deferred_until_unix_s < clean_from  # moved to now by the operator
        assert answer.decision.deferral == receipt.deferral

        done = await client.get_deferred(rid)
        assert done.state == "done" and done.text == answer.text and done.reason == "operator"
        assert done.receipt.decision_id == receipt.decision_id == done.decision.decision_id
        # The audit entry of the run says when it was released and why it waited.
        (entry,) = [fields for _, fields in await store.xrange(store_keys.AUDIT, 100)
                    if fields["decision_id"] == receipt.decision_id]
        assert float(entry["released_at"]) == pytest.approx(receipt.released_at_unix_s)
        assert entry["deferral"] == receipt.deferral
    assert sum(len(s.log.bodies) for s in stub_fleet.regions.values()) == 1  # it ran once
    assert await DeferralQueue(store).held() == []
    # Booked as any Generate stream: the ledger has it.
    usage = None
    for _ in range(50):
        usage, _ = await Ledger(store).usage("acme")
        if usage.requests:
            break
        await asyncio.sleep(0.1)
    assert usage is not None and usage.requests == 1 and usage.energy_j == pytest.approx(receipt.energy_j)
    assert await store.hgetall(entry_key(receipt.decision_id, receipt.region, receipt.pool))


async def test_a_chain_step_and_a_near_deadline_are_released_at_once(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace))
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        # The forecast has a cleaner window, but a chain's step is never held.
        chain = await client.defer("step 2 of the plan", model=MODEL, max_tokens=4, workflow_id="plan-7",
                                   workflow_shape="chain", deadline_unix_s=now + 6 * HOUR_S)
        assert chain.reason == "chain" and chain.release_at_unix_s == pytest.approx(now, abs=5)
        assert chain.decision.deferral == "chain: released at once: a chain step never waits for batching"
        # Two minutes left: less than the run needs (its prediction x 2 + 5 min), no waiting.
        hurried = await client.defer("due soon", model=MODEL, max_tokens=4, deadline_unix_s=now + 120)
        assert hurried.reason == "deadline" and hurried.release_at_unix_s == pytest.approx(now, abs=5)
        assert hurried.decision.deferral.startswith("deadline: released at once: waiting would miss the deadline")
        # Deadline 0: the policy's deferrable TTFT SLO (1 h) from now, still too short to wait
        # for a window two hours away.
        default = await client.defer("no deadline", model=MODEL, max_tokens=4)
        assert default.deadline_unix_s == pytest.approx(now + HOUR_S, abs=5)
        answer = await client.wait_deferred(chain.request_id, timeout_s=30)
        assert answer.text and answer.receipt is not None and answer.receipt.deferral == chain.decision.deferral

    def blocking() -> tuple[str, str, bool]:
        """The blocking SDK: the same calls."""
        with SchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as sync:
            answer = sync.wait_deferred(hurried.request_id, timeout_s=30)
            status = sync.get_deferred(hurried.request_id)
            assert answer.receipt is not None
            return answer.receipt.deferral, status.state, bool(answer.text) and status.text == answer.text

    deferral, state, same_text = await asyncio.to_thread(blocking)
    assert deferral == hurried.decision.deferral and state == "done" and same_text


async def test_a_retry_gets_the_first_answer_and_another_tenants_id_is_another_request(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace))
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now)
    rid = f"job-{uuid.uuid4().hex[:8]}"
    target = f"127.0.0.1:{router.port}"
    async with (AsyncSchedulerClient(target, api_key=keys.tenant.key) as acme,
                AsyncSchedulerClient(target, api_key=keys.other_tenant.key) as globex):
        first = await acme.defer("the report", model=MODEL, max_tokens=4, request_id=rid,
                                 deadline_unix_s=now + 6 * HOUR_S)
        again = await acme.defer("the report", model=MODEL, max_tokens=4, request_id=rid,
                                 deadline_unix_s=now + 120)  # would be released at once if it were new
        assert again == first and again.reason == "window"
        assert len(await DeferralQueue(store).held()) == 1

        # globex knows nothing of acme's request: the id names none of globex's ...
        with pytest.raises(NotFoundError) as caught:
            await globex.get_deferred(rid)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND and "globex" in caught.value.message
        with pytest.raises(NotFoundError):
            await globex.wait_deferred(rid, timeout_s=5)
        with pytest.raises(NotFoundError):
            await globex.cancel_deferred(rid)
        # ... and the same id from globex is globex's own request, held beside acme's.
        theirs = await globex.defer("their report", model=MODEL, max_tokens=4, request_id=rid,
                                    deadline_unix_s=now + 120)
        assert theirs.request_id == rid and theirs.reason == "deadline"
        assert sorted(i.tenant for i in await DeferralQueue(store).held()) == ["acme", "globex"]
        with pytest.raises(NotFoundError):
            await acme.get_deferred("never-submitted")
        # Still acme's, unchanged.
        status = await acme.get_deferred(rid)
        assert status.state == "held" and status.release_at_unix_s == first.release_at_unix_s
        # Not done yet: the wait ends at the call's deadline.
        started = time.monotonic()
        with pytest.raises(Exception) as waited:
            await acme.wait_deferred(rid, timeout_s=1.5)
        assert getattr(waited.value, "code", None) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 1.0 < time.monotonic() - started < 5.0
        answer = await globex.wait_deferred(rid, timeout_s=30)
        assert answer.text and (await acme.get_deferred(rid)).state == "held"


async def test_cancel_drops_a_held_request_and_an_answer(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               http=True)
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now)
    queue = DeferralQueue(store)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        held = await client.defer("the report", model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        done = await client.defer("due now", model=MODEL, max_tokens=4, deadline_unix_s=now + 120)
        await client.wait_deferred(done.request_id, timeout_s=30)

        cancelled = await client.cancel_deferred(held.request_id)
        assert cancelled.state == "cancelled" and cancelled.detail == "cancelled while held"
        assert await queue.held() == [] and await queue.fetch("acme", held.request_id) is None
        assert (await client.get_deferred(held.request_id)).state == "cancelled"
        assert await client.cancel_deferred(held.request_id) == cancelled  # again: the same
        with pytest.raises(Exception) as waited:
            await client.wait_deferred(held.request_id, timeout_s=5)
        assert getattr(waited.value, "code", None) == grpc.StatusCode.FAILED_PRECONDITION
        assert "was cancelled" in getattr(waited.value, "message", "")
        # A late retry of its Defer is refused with the cancellation, and nothing is held again.
        with pytest.raises(UnschedulableError) as again:
            await client.defer("the report", model=MODEL, max_tokens=4, request_id=held.request_id)
        assert again.value.code == grpc.StatusCode.FAILED_PRECONDITION and "was cancelled" in again.value.message
        assert await queue.held() == []

    acme = {"authorization": f"Bearer {keys.tenant.key}"}
    globex = {"authorization": f"Bearer {keys.other_tenant.key}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.http_port}", timeout=10) as http:
        path = f"/v1/deferred/{done.request_id}"
        assert (await http.delete(path, headers=globex)).status_code == 404  # not globex's
        assert (await http.get(path, headers=acme)).json()["state"] == "done"
        deleted = await http.delete(path, headers=acme)
        assert deleted.status_code == 200 and deleted.json()["state"] == "cancelled"
        assert deleted.json()["detail"] == "cancelled while done"
        assert await queue.answer("acme", done.request_id) != b"" and "text" not in (await http.get(
            path, headers=acme)).json()  # the answer's text is gone
        missing = await http.delete("/v1/deferred/nobody", headers=acme)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_the_caps_the_prompt_limit_and_the_stores_refuse_before_anything_is_held(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    settings = DeferralSettings(max_held=2, max_bytes=24 * 1024, max_prompt_bytes=16 * 1024, store_url=REDIS_URL,
                                stores={"EU": ("redis://eu-only.example:6379/0",)})
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               deferral=settings)
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now)
    queue = DeferralQueue(store)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        with pytest.raises(InvalidArgumentError) as large:
            await client.defer("x" * (16 * 1024 + 1), model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        assert [v.field for v in large.value.field_violations] == ["request.prompt"]
        assert "at most 16,384 bytes in a deferred request" in large.value.message
        with pytest.raises(UnschedulableError) as refused:
            await client.defer("EU only", model=MODEL, max_tokens=4, jurisdictions=["EU"],
                               deadline_unix_s=now + 6 * HOUR_S)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "jurisdiction EU may only be stored EU in redis://eu-only.example:6379/0" in refused.value.message
        # A request that may also run in the US may be kept here.
        await client.defer("EU or US", model=MODEL, max_tokens=4, jurisdictions=["EU", "US"],
                           deadline_unix_s=now + 6 * HOUR_S)
        await client.defer("second", model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        with pytest.raises(RateLimitedError) as full:
            await client.defer("third", model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "tenant 'acme' holds 2 deferred requests, its limit (deferral max_held 2)" in full.value.message
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.other_tenant.key) as globex:
        await globex.defer("x" * 16 * 1024, model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        with pytest.raises(RateLimitedError) as heavy:  # 24 KiB: a second 16 KiB prompt does not fit
            await globex.defer("x" * 16 * 1024, model=MODEL, max_tokens=4, deadline_unix_s=now + 6 * HOUR_S)
        assert "tenant 'globex' keeps" in heavy.value.message and "(deferral max_bytes)" in heavy.value.message
    held = await queue.held()
    assert sorted(i.tenant for i in held) == ["acme", "acme", "globex"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_store_that_is_down_holds_nothing_and_says_unavailable(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
) -> None:
    dead = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0", "dead", connect_timeout_s=0.2)
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=dead)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        with pytest.raises(UnavailableError) as caught:
            await client.defer("later", model=MODEL, max_tokens=4, deadline_unix_s=time.time() + HOUR_S)
        assert "nothing was held" in caught.value.message and caught.value.retryable
        with pytest.raises(UnavailableError):
            await client.get_deferred("any")


async def test_bad_input_names_the_field(stub_fleet: Fleet, make_router: RouterFactory, keys: Keys,
                                         store: RedisStore, namespace: str) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace))
    now = time.time()

    def request(**fields: object) -> pb.GenerateRequest:
        base: dict[str, object] = {"model": MODEL, "prompt": "hi", "sampling": pb.SamplingParams(max_tokens=4),
                                   "workload_class": pb.WORKLOAD_CLASS_DEFERRABLE, "request_id": "r-bad"}
        return pb.GenerateRequest(**{**base, **fields})  # type: ignore[arg-type]

    cases = {
        "request.workload_class": router_pb2.DeferRequest(request=request(workload_class=pb.WORKLOAD_CLASS_BATCH)),
        "request.request_id": router_pb2.DeferRequest(request=request(request_id="")),
        "deadline_unix_s": router_pb2.DeferRequest(request=request(), deadline_unix_s=now - 60),
        "request.sampling.max_tokens": router_pb2.DeferRequest(request=request(sampling=pb.SamplingParams())),
    }
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        stub = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]
        for field, message in cases.items():
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Defer(message, metadata=grpc_auth(keys.tenant.key), timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert f"{field}:" in (caught.value.details() or ""), (field, caught.value.details())
    assert await DeferralQueue(store).held() == []


async def test_the_http_front_door_defers_and_answers_the_status(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               http=True)
    now = time.time()
    clean_from = await write_forecasts(store, stub_fleet.configs, now)
    rid = f"web-{uuid.uuid4().hex[:8]}"
    acme = {"authorization": f"Bearer {keys.tenant.key}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.http_port}", timeout=10) as http:
        body = {"model": MODEL, "prompt": "Translate the manual", "max_tokens": 4, "deadline": now + 6 * HOUR_S,
                "x_scheduler": {"request_id": rid}}
        submitted = await http.post("/v1/deferred/completions", json=body, headers=acme)
        assert submitted.status_code == 202, submitted.text
        answer = submitted.json()
        assert answer["request_id"] == rid and answer["reason"] == "window"
        assert answer["release_at_unix_s"] == pytest.approx(clean_from)
        assert answer["decision"]["deferral"].startswith("window: ")
        assert submitted.headers["location"] == f"/v1/deferred/{rid}"

        status = await http.get(f"/v1/deferred/{rid}", headers=acme)
        assert status.status_code == 200 and status.json()["state"] == "held"
        other = await http.get(f"/v1/deferred/{rid}", headers={"authorization": f"Bearer {keys.other_tenant.key}"})
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        assert (await http.get(f"/v1/deferred/{rid}")).status_code == 401
        late = await http.post("/v1/deferred/completions", headers=acme,
                               json={**body, "deadline": now - 10, "x_scheduler": {"request_id": "web-late"}})
        assert late.status_code == 400 and late.json()["error"]["param"] == "deadline"

        await DeferralQueue(store).release_now("acme", rid)
        state = None
        for _ in range(100):
            state = (await http.get(f"/v1/deferred/{rid}", headers=acme)).json()
            if state["state"] == "done":
                break
            await asyncio.sleep(0.1)
        assert state is not None and state["state"] == "done" and state["text"]
        assert state["receipt"]["released_at_unix_s"] > now and state["receipt"]["deferral"].startswith("operator: ")



async def test_a_release_that_would_fail_again_is_answered_failed_at_once(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    # Any request costs more than a microjoule: the first one run spends acme's budget.
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               budgets={"acme": TenantBudget(hard_energy_j=1e-6)})
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now)
    rid = f"job-{uuid.uuid4().hex[:8]}"
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        held = await client.defer("the report", model=MODEL, max_tokens=4, request_id=rid,
                                  deadline_unix_s=now + 6 * HOUR_S)  # admitted: nothing spent yet
        assert held.reason == "window"
        refused = None
        for _ in range(50):  # spend it, until the router's ledger knows
            try:
                await client.generate("spend it", model=MODEL, max_tokens=4, workload_class="batch").text()
            except RateLimitedError as exc:
                refused = exc
                break
            await asyncio.sleep(0.1)
        assert refused is not None
        # A retry of the held id is its first answer, whatever the budget says now.
        assert await client.defer("the report", model=MODEL, max_tokens=4, request_id=rid) == held
        await DeferralQueue(store).release_now("acme", rid)
        # A spent budget stays spent: failed at its first release, not retried until the deadline.
        with pytest.raises(RateLimitedError) as caught:
            await client.wait_deferred(rid, timeout_s=20)
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "hard energy_j budget" in caught.value.message
        status = await client.get_deferred(rid)
        assert status.state == "failed" and status.error.startswith("RESOURCE_EXHAUSTED: tenant 'acme' used")
        assert status.reason == "operator" and not status.text and not status.HasField("receipt")
    assert await DeferralQueue(store).held() == []


async def test_a_release_every_region_fails_is_retried_until_its_deadline_then_fails(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, namespace: str,
) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace))
    for stub in stub_fleet.regions.values():
        stub.settings.fail_status = 503
    deadline = time.time() + 4.0
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        soon = await client.defer("due in seconds", model=MODEL, max_tokens=4, deadline_unix_s=deadline)
        assert soon.reason == "deadline"
        with pytest.raises(UnavailableError) as caught:
            await client.wait_deferred(soon.request_id, timeout_s=20)
        assert "unwell" in caught.value.message or "503" in caught.value.message, caught.value.message
        # Answered at the last tick (1 s apart) before the deadline, not before.
        assert time.time() >= deadline - 1.5
        status = await client.get_deferred(soon.request_id)
        assert status.state == "failed" and status.error.startswith("UNAVAILABLE: ")
    attempts = sum(len(s.log.bodies) for s in stub_fleet.regions.values())
    assert attempts >= 2 * len(stub_fleet.regions), attempts  # tried again on the next ticks


async def test_a_forecast_older_than_the_policy_allows_is_not_followed(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    """The same cleaner window, but fetched 7 h ago (the default policy's max_age.forecast is
    6 h): the request is released at once, not held for a forecast nobody has refreshed."""
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               budgets={})
    now = time.time()
    await write_forecasts(store, stub_fleet.configs, now, fetched_at=now - 7 * HOUR_S)
    rid = f"job-{uuid.uuid4().hex[:8]}"
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        held = await client.defer("Summarise the quarter", model=MODEL, max_tokens=5, request_id=rid,
                                  deadline_unix_s=now + 6 * HOUR_S)
        assert held.reason == "no-forecast"
        assert held.release_at_unix_s == pytest.approx(now, abs=5)
        answer = await client.wait_deferred(rid, timeout_s=30)
        assert answer.text
