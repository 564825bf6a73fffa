"""The router's edge: API keys, the admin role, rate limits, health, reflection, TLS and mTLS."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from scheduler.client import (
    AsyncSchedulerClient,
    InvalidArgumentError,
    PermissionDeniedError,
    RateLimitedError,
    TlsConfig,
    UnauthenticatedError,
    UnavailableError,
)
from scheduler.server.app import TlsFiles

from .conftest import Certs, Fleet, Keys, RouterFactory

pytestmark = pytest.mark.integration


async def test_missing_or_wrong_key_is_unauthenticated(stub_fleet: Fleet, make_router: RouterFactory,
                                                       keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    target = f"127.0.0.1:{router.port}"
    wrong = keys.tenant.key[:-4] + "AAAA"
    for api_key in (None, wrong, "not-a-key"):
        async with AsyncSchedulerClient(target, api_key=api_key) as client:
            with pytest.raises(UnauthenticatedError):
                await client.list_regions()
            with pytest.raises(UnauthenticatedError):
                await client.generate("hi", model="llama-3.1-8b", max_tokens=2).text()
    async with AsyncSchedulerClient(target, api_key=keys.tenant.key) as client:
        assert len(await client.list_regions()) == 3
        generation = client.generate("hi", model="llama-3.1-8b", max_tokens=2)
        assert await generation.text() == "lorem ipsum "
    body = stub_fleet.regions[generation.receipt.region].log.bodies[-1]  # type: ignore[union-attr]
    assert body["x_scheduler"]["tenant"] == "acme"


async def test_admin_api_needs_the_admin_role(stub_fleet: Fleet, make_router: RouterFactory, keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    target = f"127.0.0.1:{router.port}"
    async with AsyncSchedulerClient(target, api_key=keys.tenant.key) as tenant:
        with pytest.raises(PermissionDeniedError):
            await tenant.set_energy_routing(False)
        with pytest.raises(PermissionDeniedError):
            await tenant.status()
        # A tenant key cannot act for another tenant.
        with pytest.raises(PermissionDeniedError):
            await tenant.route("hi", model="llama-3.1-8b", max_tokens=2, tenant="globex")
    async with AsyncSchedulerClient(target, api_key=keys.admin.key) as admin:
        # The reason is logged and stored: a sentence, not a payload.
        with pytest.raises(InvalidArgumentError):
            await admin.set_energy_routing(False, reason="x" * 100_000)
        assert (await admin.status()).energy_routing
        response = await admin.set_energy_routing(False, reason="test")
        assert not response.enabled and response.updated_by.startswith("ops@")
        status = await admin.status()
        assert not status.energy_routing and status.regions == 3 and status.state_reachable
        decision = await admin.route("hi", model="llama-3.1-8b", max_tokens=2)
        assert not decision.energy_ranking
        assert "energy_routing_disabled" in {f.signal for f in decision.fallbacks}


async def test_tenant_rate_limit_is_resource_exhausted(stub_fleet: Fleet, make_router: RouterFactory,
                                                       keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    # globex may send 2 requests/s (bursts of 4); acme has the router's default.
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.other_tenant.key) as client:
        for _ in range(4):
            await client.list_regions()
        with pytest.raises(RateLimitedError) as caught:
            await client.list_regions()
    assert caught.value.retry_after_s is not None and 0 < caught.value.retry_after_s <= 0.5
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        await client.list_regions()


async def test_health_is_serving_and_reflection_lists_the_services(stub_fleet: Fleet, make_router: RouterFactory,
                                                                   keys: Keys) -> None:
    router = await make_router(stub_fleet.configs, keys=keys.ring)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "scheduler.v1.GlobalRouter", "scheduler.v1.RouterAdmin"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = [r async for r in reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
        names = {s.name for s in responses[0].list_services_response.service}
    assert {"scheduler.v1.GlobalRouter", "scheduler.v1.RouterAdmin", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names


async def test_health_goes_not_serving_on_shutdown(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    await router.health.enter_graceful_shutdown()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_tls(stub_fleet: Fleet, make_router: RouterFactory, certs: Certs) -> None:
    router = await make_router(stub_fleet.configs, tls=TlsFiles(certs.server_cert, certs.server_key))
    target = f"localhost:{router.port}"
    async with AsyncSchedulerClient(target, tls=TlsConfig(ca_cert=certs.ca)) as client:
        assert await client.generate("hi", model="llama-3.1-8b", max_tokens=1).text() == "lorem "
    # A plaintext client cannot talk to a TLS router.
    async with AsyncSchedulerClient(target, timeout_s=5) as plain:
        with pytest.raises(UnavailableError):
            await plain.list_regions()


async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(stub_fleet: Fleet, make_router: RouterFactory,
                                                                        certs: Certs) -> None:
    router = await make_router(stub_fleet.configs,
                               tls=TlsFiles(certs.server_cert, certs.server_key, client_ca=certs.ca))
    target = f"localhost:{router.port}"
    trusted = TlsConfig(ca_cert=certs.ca, client_cert=certs.client_cert, client_key=certs.client_key)
    async with AsyncSchedulerClient(target, tls=trusted) as client:
        assert await client.generate("hi", model="llama-3.1-8b", max_tokens=1).text() == "lorem "
    rogue = TlsConfig(ca_cert=certs.ca, client_cert=certs.rogue_cert, client_key=certs.rogue_key)
    for refused in (TlsConfig(ca_cert=certs.ca), rogue):
        async with AsyncSchedulerClient(target, tls=refused, timeout_s=5) as client:
            with pytest.raises(UnavailableError):
                await client.list_regions()


async def test_metrics_and_healthz_over_plain_http(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    import httpx

    from scheduler.client import AsyncSchedulerClient, UnschedulableError

    router = await make_router(stub_fleet.configs, metrics_port=0)
    assert router.metrics_endpoint is not None
    base = f"http://127.0.0.1:{router.metrics_endpoint.port}"
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        assert await client.generate("hi", model="llama-3.1-8b", max_tokens=2).text()
        with pytest.raises(UnschedulableError):
            await client.generate("hi", model="llama-3.1-8b", max_tokens=2, jurisdictions=["CH"]).text()
    async with httpx.AsyncClient() as http:
        health = await http.get(f"{base}/healthz")
        metrics = await http.get(f"{base}/metrics")
        missing = await http.get(f"{base}/nothing")
    assert health.status_code == 200 and health.text == "SERVING\n"
    assert missing.status_code == 404
    text = metrics.text
    assert 'scheduler_router_requests_total{code="OK",method="Generate"} 1' in text
    assert 'scheduler_router_requests_total{code="FAILED_PRECONDITION",method="Generate"} 1' in text
    assert 'scheduler_router_decisions_total{mode="unschedulable",policy="default"} 1' in text
    assert "scheduler_router_energy_routing_enabled 1" in text
    assert 'scheduler_router_region_healthy{region="eu-north"} 1' in text
    await router.stop(grace_s=0)
    assert not router.serving
