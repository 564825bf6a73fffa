"""A plain vLLM region (kind ``vllm``, docs/byo-vllm.md) behind the router, its servers stub
regions (real HTTP on port 0): the router sends them the OpenAI request alone (the served model
name, no ticket, no scheduling hints), keeps a prefix on one server, prices the energy with the
model even when the server sends an energy object, says ``tickets_enforced: false`` in the
decision and the receipt, and never hands such a region out as a direct-mode target."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.client import AsyncSchedulerClient, SchedulerRpcError
from scheduler.client.common import build_request
from scheduler.config.loader import EMBEDDED_POLICIES, load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.tickets import HEADER as TICKET_HEADER
from scheduler.tickets import TicketKeyRing

from .conftest import RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SERVED_NAME = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class MixedFleet:
    """eu-north as a plain vLLM region on two servers (its h200-long pool on both, its a100-batch
    pool on the second), us-east a ray-serve region (a stub with tickets)."""

    servers: tuple[StubRegion, StubRegion]
    gateway: StubRegion
    configs: tuple[RegionConfig, ...]


def vllm_region(shipped: RegionConfig, urls: tuple[str, str]) -> RegionConfig:
    raw = shipped.model_dump(mode="json")
    raw.update(kind="vllm", local=None, endpoint=urls[0])
    pool_urls = {"h200-long": list(urls), "a100-batch": [urls[1]]}
    for pool in raw["pools"]:
        pool["vllm"] = {"urls": pool_urls[pool["name"]], "served_model_names": {"llama-3.1-8b": SERVED_NAME}}
    return RegionConfig.model_validate(raw)


@pytest.fixture
async def mixed_fleet() -> AsyncIterator[MixedFleet]:
    shipped = {r.name: r for r in load_fleet().regions}
    # The servers send an energy object, as a gateway would: a plain vLLM region's is ignored.
    servers = (await StubRegion(StubRegionSettings(name="vllm-a", report_energy=True)).start(),
               await StubRegion(StubRegionSettings(name="vllm-b", report_energy=True)).start())
    gateway = await StubRegion(StubRegionSettings(name="us-east")).start()
    try:
        configs = (vllm_region(shipped["eu-north"], (servers[0].endpoint, servers[1].endpoint)),
                   shipped["us-east"].model_copy(update={"endpoint": gateway.endpoint}))
        yield MixedFleet(servers, gateway, configs)
    finally:
        for stub in (*servers, gateway):
            await stub.stop()


async def test_a_plain_vllm_region_gets_the_openai_request_alone_and_a_modelled_receipt(
        mixed_fleet: MixedFleet, make_router: RouterFactory) -> None:
    # Ticket keys for the ray-serve region only: a plain vLLM region needs none.
    router = await make_router(mixed_fleet.configs, ticket_keys=TicketKeyRing.generate(["us-east"]))
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate("Explain PUE in one line.", model="llama-3.1-8b", max_tokens=4,
                                     jurisdictions=["EU"], decision_detail="full")
        assert await generation.text()
        decision, receipt = generation.decision, generation.receipt
        assert decision is not None and receipt is not None
        assert decision.ranked[0].region == "eu-north" and not decision.ranked[0].tickets_enforced
        assert receipt.region == "eu-north" and receipt.HasField("tickets_enforced") and not receipt.tickets_enforced
        # The server sent an energy object (node-share); the router billed the model's estimate.
        assert receipt.measurement_source == "model" and receipt.attribution_method == "model-v1"
        assert receipt.energy_j > 0 and receipt.completion_tokens == 4

        bodies = [b for s in mixed_fleet.servers for b in s.log.bodies]
        headers = [h for s in mixed_fleet.servers for h in s.log.headers]
        assert len(bodies) == 1
        assert bodies[0]["model"] == SERVED_NAME and "x_scheduler" not in bodies[0]
        assert bodies[0]["stream"] is True and bodies[0]["stream_options"] == {"include_usage": True}
        assert TICKET_HEADER not in headers[0]

        # The same prompt (the same prefix key) goes to the same server of the pool.
        chosen = next(s for s in mixed_fleet.servers if s.log.bodies)
        for _ in range(3):
            again = client.generate("Explain PUE in one line.", model="llama-3.1-8b", max_tokens=2,
                                    jurisdictions=["EU"])
            assert await again.text()
            assert again.receipt is not None and again.receipt.pool == receipt.pool
        assert len(chosen.log.bodies) == 4

        # The ray-serve region: its ticket, its measured energy, tickets_enforced true.
        us = client.generate("Explain PUE in one line.", model="llama-3.1-8b", max_tokens=3, jurisdictions=["US"])
        assert await us.text()
        assert us.receipt is not None and us.receipt.region == "us-east" and us.receipt.tickets_enforced
        assert us.receipt.measurement_source == "node-share"
        assert TICKET_HEADER in mixed_fleet.gateway.log.headers[0]


async def test_direct_mode_lists_no_plain_vllm_region(mixed_fleet: MixedFleet, make_router: RouterFactory) -> None:
    router = await make_router(mixed_fleet.configs, ticket_keys=TicketKeyRing.generate(["us-east"]))
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        anywhere = await client._route(build_request(prompt="hello", model="llama-3.1-8b", max_tokens=2), None)
        ranked = [c.region for c in anywhere.decision.ranked]
        assert {"eu-north", "us-east"} <= set(ranked)
        assert anywhere.targets and {t.region for t in anywhere.targets} == {"us-east"}
        eu_only = await client._route(build_request(prompt="hello", model="llama-3.1-8b", max_tokens=2,
                                                    jurisdictions=["EU"]), None)
        assert eu_only.decision.ranked and not eu_only.targets


async def test_the_openai_front_doors_receipt_says_so_too(mixed_fleet: MixedFleet, make_router: RouterFactory) -> None:
    router = await make_router(mixed_fleet.configs, ticket_keys=TicketKeyRing.generate(["us-east"]), http=True)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.http_port}", timeout=30) as http:
        answers = {}
        for jurisdiction in ("EU", "US"):
            answer = await http.post("/v1/chat/completions", headers={"x-scheduler-jurisdictions": jurisdiction}, json={
                "model": "llama-3.1-8b", "max_tokens": 2, "messages": [{"role": "user", "content": "Explain PUE."}]})
            assert answer.status_code == 200, answer.text
            answers[jurisdiction] = answer.json()["energy_receipt"]
    assert answers["EU"]["region"] == "eu-north" and answers["EU"]["tickets_enforced"] is False
    assert answers["EU"]["measurement_source"] == "model"
    assert answers["US"]["region"] == "us-east" and answers["US"]["tickets_enforced"] is True


async def test_the_servers_api_key_comes_from_the_routers_environment(
        mixed_fleet: MixedFleet, make_router: RouterFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = mixed_fleet.configs[0].model_dump(mode="json")
    for pool in raw["pools"]:
        pool["vllm"]["api_key_env"] = "BYO_TEST_VLLM_KEY"
    configs = (RegionConfig.model_validate(raw), mixed_fleet.configs[1])
    router = await make_router(configs, ticket_keys=TicketKeyRing.generate(["us-east"]))
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        monkeypatch.setenv("BYO_TEST_VLLM_KEY", "sk-byo-test")
        generation = client.generate("hello", model="llama-3.1-8b", max_tokens=2, jurisdictions=["EU"])
        assert await generation.text()
        headers = [h for s in mixed_fleet.servers for h in s.log.headers]
        assert [h.get("authorization") for h in headers] == ["Bearer sk-byo-test"]

        # Unset: the region is not tried without it, and the failure names the variable.
        monkeypatch.delenv("BYO_TEST_VLLM_KEY")
        with pytest.raises(SchedulerRpcError) as caught:
            await client.generate("hello", model="llama-3.1-8b", max_tokens=2, jurisdictions=["EU"]).text()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
        assert "$BYO_TEST_VLLM_KEY, the API key of eu-north/" in caught.value.message
        assert len([h for s in mixed_fleet.servers for h in s.log.headers]) == 1


def test_a_router_refuses_to_start_without_the_servers_api_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    regions = tmp_path / "regions"
    regions.mkdir()
    raw = vllm_region(next(r for r in load_fleet().regions if r.name == "eu-north"),
                      ("http://127.0.0.1:1", "http://127.0.0.1:2")).model_dump(mode="json")
    raw["pools"][0]["vllm"]["api_key_env"] = "BYO_TEST_UNSET_KEY"
    (regions / "eu-north.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("BYO_TEST_UNSET_KEY", raising=False)
    code = main(["router", "--regions", str(regions), "--policies", str(EMBEDDED_POLICIES), "--insecure",
                 "--insecure-no-tickets", "--port", "0"])
    assert code == exit_codes.CONFIG
    assert "not set in this router's environment: $BYO_TEST_UNSET_KEY (eu-north/h200-long)" in capsys.readouterr().err
