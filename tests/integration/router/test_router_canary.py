"""The canary with automatic rollback, end to end (docs/canary.md): two routers sharing one Redis,
real stub regions, traffic through the routers' gRPC front door.

The control (``steady``) sends New York's requests to us-east; the candidate arm (``thrifty``,
half the request ids) sends them to eu-north. eu-north then turns slow (a 1 s first-token
delay against a 600 ms TTFT SLO): the arm's TTFT-SLO attainment drops, the first router to see
it crossing its bound rolls the arm back, and the other follows within its next refresh. The
test prints how long that took, from the first slow request to the arm being off on both
routers, checks the rest of the traffic goes to the control, that the reason reached the audit
stream, the metrics and the status RPC (and ``scheduler canary status``), and that an admin's
``scheduler canary enable`` turns it back on everywhere.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from scheduler.client import AsyncSchedulerClient
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import FleetConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.server.app import RunningRouter, build_deps, router_gauges, start_router
from scheduler.state import keys as store_keys
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.state.store import StateStore
from scheduler.v1 import admin_pb2, admin_pb2_grpc
from tests.canary_fixtures import CANARY, write_policies

from .conftest import Fleet, Keys

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
PROMPT = "Where should this run?"
NEW_YORK = (40.71, -74.0)
SLOW_S = 1.0  # the slow region's first-token delay; the interactive TTFT SLO is 600 ms


@dataclass(frozen=True)
class Served:
    started: float
    router: str
    decision_arm: str
    policy: str
    region: str
    receipt_arm: str
    ttft_ms: float


StartRouter = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def start_canary_router(stub_fleet: Fleet, keys: Keys) -> AsyncIterator[StartRouter]:
    started: list[RunningRouter] = []
    namespaces: set[str] = set()

    async def start(store: StateStore, config: FleetConfig, http: bool = False) -> RunningRouter:
        if isinstance(store, RedisStore):
            namespaces.add(store.namespace)
        policies = {name: compile_policy(policy) for name, policy in config.policies.items()}
        deps = build_deps(SnapshotBuilder(compile_fleet(stub_fleet.configs), policies["steady"]), store,
                          "memory" if isinstance(store, MemoryStore) else "redis", keys=keys.ring,
                          rate_limit_rps=100_000.0, policies=policies)
        deps.http_port = 0 if http else None
        running = await start_router("127.0.0.1:0", deps)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop(grace_s=0.5)
    # After the routers stopped: their last canary counts are flushed on stop.
    for namespace in namespaces:
        await delete_namespace(REDIS_URL, namespace)


async def _generate(client: AsyncSchedulerClient, router: str, **options: object) -> Served:
    started = time.monotonic()
    generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=2, client_location=NEW_YORK,
                                 request_id=uuid.uuid4().hex, **options)  # type: ignore[arg-type]
    await generation.text()
    decision, receipt = generation.decision, generation.receipt
    assert decision is not None and receipt is not None
    return Served(started, router, decision.canary_arm, decision.policy, decision.ranked[0].region,
                  receipt.canary_arm, receipt.ttft_ms)


async def _admin(port: int, key: str, method: str, request: object) -> object:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = admin_pb2_grpc.RouterAdminStub(channel)  # type: ignore[no-untyped-call]
        return await getattr(stub, method)(request, metadata=(("authorization", f"Bearer {key}"),), timeout=10)


async def _cli(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scheduler.cli", "canary", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[3]))
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


def _arm_on(router: RunningRouter) -> bool:
    split = router.deps.refresher.current().canary
    return split is not None and split.enabled


@pytest.mark.timeout(120)
async def test_a_slow_candidate_is_rolled_back_on_every_router(tmp_path: Path, stub_fleet: Fleet, keys: Keys,
                                                               start_canary_router: StartRouter) -> None:
    config = load_checked_fleet(policies_dir=write_policies(tmp_path / "policies", {
        **CANARY, "rollback": {"window": "5s", "min_requests": 8,
                               "ttft_slo_attainment": {"min": 0.8, "max_drop": 0.1}, "error_rate": {"max": 0.2}}}))
    namespace = f"test-canary-{uuid.uuid4().hex[:8]}"
    router_a = await start_canary_router(RedisStore.from_url(REDIS_URL, namespace), config)
    router_b = await start_canary_router(RedisStore.from_url(REDIS_URL, namespace), config)
    routers = {"A": router_a, "B": router_b}
    admin = keys.admin.key
    clients = {name: AsyncSchedulerClient(f"127.0.0.1:{r.port}", api_key=keys.tenant.key)
               for name, r in routers.items()}
    served: list[Served] = []
    stop = asyncio.Event()

    async def worker(name: str) -> None:
        while not stop.is_set():
            served.append(await _generate(clients[name], name))
            await asyncio.sleep(0.1)

    # Healthy traffic: both arms serve, each from its own region.
    workers = [asyncio.create_task(worker("A" if i % 2 else "B")) for i in range(8)]
    await asyncio.sleep(1.5)
    assert _arm_on(router_a) and _arm_on(router_b)
    healthy = list(served)
    by_arm = {arm: {(s.policy, s.region) for s in healthy if s.decision_arm == arm} for arm in ("control", "canary")}
    assert by_arm == {"control": {("steady", "us-east")}, "canary": {("thrifty", "eu-north")}}, by_arm
    assert all(s.receipt_arm == s.decision_arm for s in healthy)
    assert {s.router for s in healthy if s.decision_arm == "canary"} == {"A", "B"}

    # eu-north turns slow; watch both routers for the arm going off.
    off_at: dict[str, float] = {}

    async def watch() -> None:
        while len(off_at) < len(routers):
            for name, router in routers.items():
                if name not in off_at and not _arm_on(router):
                    off_at[name] = time.monotonic()
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    injected = time.monotonic()
    stub_fleet.regions["eu-north"].settings.first_token_delay_s = SLOW_S
    await asyncio.wait_for(watcher, 30)
    stop.set()
    await asyncio.gather(*workers)

    slow = [s for s in served if s.started >= injected and s.decision_arm == "canary"]
    assert slow and all(s.region == "eu-north" and s.ttft_ms >= SLOW_S * 1000 for s in slow)
    first_bad = min(s.started for s in slow)
    off_everywhere = max(off_at.values())
    print(f"\ncanary rollback: first slow request {1000 * (first_bad - injected):.0f} ms after the injection; "
          f"arm off on router A {off_at['A'] - first_bad:.2f} s and on router B {off_at['B'] - first_bad:.2f} s "
          f"after it: off on every router {off_everywhere - first_bad:.2f} s after the first bad request "
          f"({abs(off_at['A'] - off_at['B']):.2f} s between the routers; {len(slow)} slow canary requests "
          f"started before it)")
    # Off on every router within 1 s of the first one turning it off (the refresh is 0.5 s).
    assert abs(off_at["A"] - off_at["B"]) <= 1.0
    assert off_everywhere - first_bad < 10.0

    # After the rollback every request goes to the control, through either router.
    after = [await _generate(clients["A" if i % 2 else "B"], "A" if i % 2 else "B") for i in range(20)]
    assert {(s.decision_arm, s.receipt_arm, s.policy, s.region) for s in after} == {
        ("control", "control", "steady", "us-east")}

    # The reason: in the status RPC of both routers, the audit stream, the metrics.
    for router in routers.values():
        status = await _admin(router.port, admin, "GetCanaryStatus", admin_pb2.GetCanaryStatusRequest())
        assert isinstance(status, admin_pb2.GetCanaryStatusResponse)
        assert status.configured and status.state == "rolled-back" and not status.enabled
        assert status.policy == "steady" and status.arm == "thrifty" and status.fraction == 0.5
        assert "TTFT-SLO attainment" in status.reason and status.updated_by.startswith("router@")
        canary = status.judged.arms[1]
        assert canary.arm == "canary" and canary.requests >= 8 and canary.ttft_slo_attainment < 0.9
    store = router_a.deps.store
    audit = [body for _, body in await store.xrange(store_keys.AUDIT, 10_000)]
    rollbacks = [body for body in audit if body.get("event") == "canary-rollback"]
    assert len(rollbacks) == 1 and "TTFT-SLO attainment" in rollbacks[0]["reason"]
    assert rollbacks[0]["metrics"] == "ttft_slo_attainment"
    assert {body.get("canary_arm") for body in audit if "decision_id" in body} == {"control", "canary"}
    exposition = router_b.deps.metrics.exposition(router_gauges(router_b.deps))
    # (prometheus_client writes labels sorted by name)
    assert 'scheduler_canary_enabled{candidate="thrifty",policy="steady"} 0' in exposition
    assert 'scheduler_canary_rolled_back{candidate="thrifty",policy="steady"} 1' in exposition
    assert 'scheduler_canary_rollback_info{candidate="thrifty",epoch="0",metrics="ttft_slo_attainment",' \
           'policy="steady"} 1' in exposition

    # A tenant key may not read or change it; an admin's CLI reads it.
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await _admin(router_a.port, keys.tenant.key, "SetCanaryArm", admin_pb2.SetCanaryArmRequest(enabled=True))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    text = await _cli("status", "--router", f"127.0.0.1:{router_a.port}", "--api-key", admin)
    print(text)
    assert "state: rolled-back (TTFT-SLO attainment" in text and "canary arm thrifty on 50 %" in text

    # It stays off until an admin re-enables it; then on for both routers within 1 s.
    stub_fleet.regions["eu-north"].settings.first_token_delay_s = 0.0
    await asyncio.sleep(0.6)
    assert not _arm_on(router_a) and not _arm_on(router_b)
    out = await _cli("enable", "--router", f"127.0.0.1:{router_b.port}", "--api-key", admin,
                     "--reason", "eu-north fixed")
    enabled_at = time.monotonic()
    assert "canary arm thrifty ON" in out
    assert _arm_on(router_b)  # the router that took the call applied it before answering
    while not _arm_on(router_a):
        assert time.monotonic() - enabled_at < 1.0
        await asyncio.sleep(0.005)
    print(f"re-enabled: on router B when `scheduler canary enable` answered, on router A "
          f"{time.monotonic() - enabled_at:.2f} s later")
    again = [await _generate(clients["A"], "A") for _ in range(30)]
    assert {s.decision_arm for s in again} == {"control", "canary"}
    assert {(s.policy, s.region) for s in again if s.decision_arm == "canary"} == {("thrifty", "eu-north")}
    status = await _admin(router_a.port, admin, "GetCanaryStatus", admin_pb2.GetCanaryStatusRequest())
    assert isinstance(status, admin_pb2.GetCanaryStatusResponse)
    assert status.state == "on" and status.epoch != "0"
    for client in clients.values():
        await client.close()


@pytest.mark.timeout(60)
async def test_the_canary_arm_keeps_a_sensitive_prompt_off_the_pool_the_control_refuses(
        tmp_path: Path, keys: Keys, start_canary_router: StartRouter) -> None:
    """``frugal`` would send a medical prompt to us-east's fp8 pool; as the canary arm (all the
    traffic) it decides, and the prompt still runs at full precision."""
    config = load_checked_fleet(policies_dir=write_policies(tmp_path / "policies", {
        "arm": "frugal", "fraction": 1.0, "assign_by": "tenant",
        "rollback": {"window": "30s", "min_requests": 20, "error_rate": {"max": 0.5}}}))
    router = await start_canary_router(MemoryStore(), config, http=True)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        for task_class in ("medical", "legal"):
            generation = client.generate(PROMPT, model="llama-3.1-70b", max_tokens=2, client_location=NEW_YORK,
                                         task_class=task_class, decision_detail="full")
            await generation.text()
            decision, receipt = generation.decision, generation.receipt
            assert decision is not None and receipt is not None
            assert decision.canary_arm == "canary" and decision.policy == "frugal" and receipt.canary_arm == "canary"
            ranked = {(c.region, c.pool) for c in decision.ranked}
            assert ("us-east", "h100-chat") not in ranked  # its llama-3.1-70b is fp8
            assert [r.reason for r in decision.rejected if (r.region, r.pool) == ("us-east", "h100-chat")] == [
                f"task class {task_class} may not run at reduced precision fp8"]
            assert (receipt.region, receipt.pool) != ("us-east", "h100-chat")
    # The OpenAI front door: the same arm, the same limit, and the arm in the answer.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.http_port}", timeout=30) as http:
        answer = await http.post("/v1/chat/completions", headers={
            "authorization": f"Bearer {keys.tenant.key}", "x-scheduler-task-class": "medical",
            "x-scheduler-client-location": "40.71,-74.0"}, json={
            "model": "llama-3.1-70b", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-energy-canary-arm"] == "canary"
    receipt_object = answer.json()["energy_receipt"]
    assert receipt_object["canary_arm"] == "canary"
    assert (receipt_object["region"], receipt_object["pool"]) != ("us-east", "h100-chat")


def test_the_cli_reads_a_router_without_a_canary() -> None:
    from scheduler.canary.cli import render_status

    text = render_status(admin_pb2.GetCanaryStatusResponse(configured=False, policy="default"), time.time())
    assert text.startswith("policy default: no canary")
