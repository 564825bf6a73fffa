"""Tenancy at the router's edge: concurrent-stream caps per tenant, a tenant's rate shared by
two routers through Redis (and the fallback when Redis is gone), keys reloaded without a
restart (a revoked key is refused), keys bound to jurisdictions, and the secure CLI defaults."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
import yaml

from scheduler.server.auth import KeyRing, NewKey, create_key
from scheduler.server.keys_reload import KeysReloader
from scheduler.server.rate_limit import bucket_key
from scheduler.state.redis_store import RedisStore
from scheduler.v1 import messages_pb2 as pb
from scheduler.v1 import router_pb2, router_pb2_grpc

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
GENERATE = pb.GenerateRequest(model="llama-3.1-8b", prompt="Where should this run?",
                              sampling=pb.SamplingParams(max_tokens=40))
SHORT = pb.GenerateRequest(model="llama-3.1-8b", prompt="Where should this run?",
                           sampling=pb.SamplingParams(max_tokens=2))


def _auth(key: NewKey) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key.key}"),)


def _ring(*keys: NewKey) -> KeyRing:
    return KeyRing.of([key.entry for key in keys])


def _write_keys(path: Path, *keys: NewKey) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"keys": [key.entry_dict() for key in keys]}, sort_keys=False))
    tmp.replace(path)


@pytest.mark.timeout(60)
async def test_a_tenant_holds_at_most_its_concurrent_streams(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    for stub in stub_fleet.regions.values():
        stub.settings.token_interval_s = 0.1  # 40 tokens: a 4 s stream
    capped = create_key("acme", max_concurrent_streams=2)
    other = create_key("globex")
    router = await make_router(stub_fleet.configs, keys=_ring(capped, other))
    slots = router.deps.slots
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        stub = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]
        first = stub.Generate(GENERATE, metadata=_auth(capped), timeout=30)
        second = stub.Generate(GENERATE, metadata=_auth(capped), timeout=30)
        assert (await first.read()).HasField("decision") and (await second.read()).HasField("decision")
        assert slots.held("acme") == 2
        third = stub.Generate(GENERATE, metadata=_auth(capped), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await third.read()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 concurrent Generate streams" in (refused.value.details() or "")
        # Another tenant is not held back by acme's streams.
        others = [message async for message in stub.Generate(SHORT, metadata=_auth(other), timeout=30)]
        assert others[-1].HasField("receipt")
        # A client cancel gives the slot back: a new stream is admitted.
        first.cancel()
        for _ in range(100):
            if slots.held("acme") == 1:
                break
            await asyncio.sleep(0.02)
        assert slots.held("acme") == 1
        fourth = [message async for message in stub.Generate(SHORT, metadata=_auth(capped), timeout=30)]
        assert fourth[-1].HasField("receipt")  # a normal end gives it back too
        while not (await second.read()).HasField("receipt"):
            pass
        # A stream ending in an error (no region answers) gives it back as well.
        for region in stub_fleet.regions.values():
            region.settings.fail_status = 503
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            [message async for message in stub.Generate(SHORT, metadata=_auth(capped), timeout=30)]
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert slots.held("acme") == 0 and slots.held("globex") == 0
    print(f"slots refused: {slots.refused}")


async def _list_regions(target: str, key: NewKey, calls: int) -> list[grpc.StatusCode]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]
        codes = []
        for _ in range(calls):
            try:
                await stub.ListRegions(router_pb2.ListRegionsRequest(), metadata=_auth(key), timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        return codes


@pytest.mark.timeout(60)
async def test_two_routers_share_one_tenants_rate_through_redis(stub_fleet: Fleet,
                                                                make_router: RouterFactory) -> None:
    namespace = f"test-rate-{uuid.uuid4().hex[:8]}"
    key = create_key("acme", rate_limit_rps=1.0)  # burst: 2 s worth, 2 requests
    ring = _ring(key)
    router_a = await make_router(stub_fleet.configs, keys=ring, store=RedisStore.from_url(REDIS_URL, namespace))
    router_b = await make_router(stub_fleet.configs, keys=ring, store=RedisStore.from_url(REDIS_URL, namespace))
    try:
        started = time.monotonic()
        codes_a = await _list_regions(f"127.0.0.1:{router_a.port}", key, 6)
        codes_b = await _list_regions(f"127.0.0.1:{router_b.port}", key, 6)
        elapsed = time.monotonic() - started
        admitted = (codes_a + codes_b).count(grpc.StatusCode.OK)
        print(f"12 calls in {elapsed:.2f} s over two routers at 1 rps, burst 2: admitted {admitted} "
              f"(A {codes_a.count(grpc.StatusCode.OK)}, B {codes_b.count(grpc.StatusCode.OK)})")
        # One bucket: the burst plus what refilled meanwhile; per-router buckets would admit 4+.
        assert admitted <= 2 + int(elapsed * 1.0) + 1
        assert codes_b.count(grpc.StatusCode.OK) <= 1 + int(elapsed * 1.0)
        assert set(codes_a + codes_b) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert router_a.deps.limiter.shared and router_b.deps.limiter.shared
    finally:
        store = RedisStore.from_url(REDIS_URL, namespace)
        await store.delete(bucket_key("acme"))
        await store.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
async def test_an_unreachable_store_falls_back_to_the_routers_own_bucket(stub_fleet: Fleet,
                                                                         make_router: RouterFactory) -> None:
    key = create_key("acme", rate_limit_rps=1.0)
    dead = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0", "dead", connect_timeout_s=0.2)
    router = await make_router(stub_fleet.configs, keys=_ring(key), store=dead)
    codes = await _list_regions(f"127.0.0.1:{router.port}", key, 5)
    limiter = router.deps.limiter
    print(f"store down: {codes.count(grpc.StatusCode.OK)} of 5 admitted, fallbacks {limiter.fallbacks}")
    # Still limited (the local bucket: burst 2), not open, and the fallback is visible.
    assert codes[:2] == [grpc.StatusCode.OK, grpc.StatusCode.OK]
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert not limiter.shared and limiter.fallbacks >= 1
    samples = {name: value for name, _, value in limiter.samples()}
    assert samples["scheduler_rate_limit_shared"] == 0.0
    assert samples["scheduler_rate_limit_store_fallbacks_total"] >= 1


@pytest.mark.timeout(60)
async def test_a_revoked_key_is_refused_after_reload_without_a_restart(
        tmp_path: Path, stub_fleet: Fleet, make_router: RouterFactory, caplog: pytest.LogCaptureFixture) -> None:
    kept, revoked = create_key("acme"), create_key("globex")
    keys_file = tmp_path / "keys.yaml"
    _write_keys(keys_file, kept, revoked)
    router = await make_router(stub_fleet.configs, keys=KeyRing.load(keys_file))
    deps = router.deps
    reloader = KeysReloader(keys_file, lambda ring: setattr(deps, "keys", ring), interval_s=0.05)
    await reloader.start()
    target = f"127.0.0.1:{router.port}"
    try:
        assert await _list_regions(target, revoked, 1) == [grpc.StatusCode.OK]
        # A bad file keeps the keys in use and says what is wrong.
        keys_file.write_text("keys:\n  - id: nothex\n    tenant: acme\n")
        for _ in range(100):
            if reloader.failures:
                break
            await asyncio.sleep(0.02)
        assert reloader.failures >= 1 and reloader.reloads == 0
        assert str(keys_file) in caplog.text and "nothex" in caplog.text
        assert await _list_regions(target, revoked, 1) == [grpc.StatusCode.OK]
        # The key is removed from the file: refused from the next call on, same process.
        _write_keys(keys_file, kept)
        for _ in range(100):
            if reloader.reloads:
                break
            await asyncio.sleep(0.02)
        assert await _list_regions(target, revoked, 1) == [grpc.StatusCode.UNAUTHENTICATED]
        assert await _list_regions(target, kept, 1) == [grpc.StatusCode.OK]
    finally:
        await reloader.stop()


@pytest.mark.timeout(60)
async def test_a_key_bound_to_jurisdictions_narrows_where_requests_run(stub_fleet: Fleet,
                                                                       make_router: RouterFactory) -> None:
    eu_only = create_key("acme", jurisdictions=["EU"])
    router = await make_router(stub_fleet.configs, keys=_ring(eu_only))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        stub = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]

        async def route(*jurisdictions: str) -> set[str]:
            request = pb.GenerateRequest()
            request.CopyFrom(GENERATE)
            request.compliance.allowed_jurisdictions.extend(jurisdictions)
            answer = await stub.Route(request, metadata=_auth(eu_only), timeout=10)
            return {candidate.region for candidate in answer.decision.ranked}

        assert await route() <= {"eu-north", "eu-central"}  # none asked: the key's
        assert await route("EU", "US") <= {"eu-north", "eu-central"}  # intersected
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await route("US")
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "may only run in EU" in (denied.value.details() or "")
        assert "allows only US" in (denied.value.details() or "")


@pytest.mark.timeout(60)
def test_the_router_cli_refuses_to_start_without_keys_unless_insecure(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "scheduler.cli", "router", "--port", "0", "--insecure-no-tickets"]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=45)
    assert refused.returncode == 2
    assert "pass --insecure" in refused.stderr
    insecure = subprocess.Popen([*base, "--insecure", "--no-carbon-pollers"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        assert insecure.stdout is not None
        lines = []
        for line in insecure.stdout:
            lines.append(line)
            if "router listening on" in line:
                break
        output = "".join(lines)
        assert "router listening on 127.0.0.1:" in output  # loopback by default
        assert "--insecure: authentication is OFF" in output
    finally:
        insecure.terminate()
        insecure.wait(timeout=15)
