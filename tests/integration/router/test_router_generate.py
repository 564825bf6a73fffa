"""Generate end to end: SDK -> router (gRPC, port 0) -> stub regions (HTTP/SSE, port 0)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from scheduler.client import (
    AsyncSchedulerClient,
    InvalidArgumentError,
    SchedulerClient,
    UnavailableError,
    UnschedulableError,
)
from scheduler.server.app import RunningRouter
from scheduler.state import keys as store_keys
from scheduler.state.memory_store import MemoryStore
from scheduler.v1.messages_pb2 import Decision

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox asks where to run this request"


async def test_tokens_stream_through_the_router_with_a_receipt(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=6)
        chunks = [text async for text in generation]
    assert "".join(chunks) == "lorem ipsum dolor sit amet consectetur "
    decision, receipt = generation.decision, generation.receipt
    assert decision is not None and receipt is not None
    chosen = decision.ranked[0]
    assert receipt.region == chosen.region and receipt.pool == chosen.pool
    assert receipt.decision_id == decision.decision_id
    assert len(receipt.failovers) == 0
    # Usage and the measured energy come from the region's final event.
    assert receipt.completion_tokens == 6 and receipt.HasField("prompt_tokens")
    assert receipt.measurement_source == "node-share" and receipt.attribution_method == "stub-v1"
    assert receipt.energy_j_low < receipt.energy_j < receipt.energy_j_high
    assert receipt.HasField("decode_j") and not receipt.HasField("padding_ratio")  # unmeasured stays absent
    assert receipt.pue > 1.0 and receipt.HasField("ttft_ms")
    # The region saw the decision's extension fields, and no more than the request's text.
    body = stub_fleet.regions[receipt.region].log.bodies[-1]
    # The prefix key the router derived from the prompt goes along (the region reports its cache hits by it).
    x_scheduler = dict(body["x_scheduler"])
    assert x_scheduler.pop("prefix_key").startswith("auto:")
    assert x_scheduler == {"decision_id": decision.decision_id, "tenant": "local", "pool": receipt.pool}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_a_stream_carries_the_decision_it_asks_for(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    """Generate defaults to a summary (the chosen candidate); full detail on request; Route in full."""
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        summary = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=2)
        await summary.text()
        full = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=2, decision_detail="full",
                               jurisdictions=["EU"])
        await full.text()
        routed = await client.route(PROMPT, model="llama-3.1-8b", max_tokens=2, jurisdictions=["EU"])
    assert summary.decision is not None and full.decision is not None
    assert len(summary.decision.ranked) == 1 and summary.decision.ranked_total > 1
    assert summary.decision.ranked[0].quantities and summary.decision.ranked[0].HasField("energy")
    assert not summary.decision.rejected and not summary.decision.plugin_timings_ns
    assert summary.decision.rejected_total == 0  # every region allowed: nothing rejected
    eu_summary = await _eu_summary(router)
    assert not eu_summary.rejected and eu_summary.rejected_total > 0  # counted, not listed
    for decision in (full.decision, routed):
        assert len(decision.ranked) == decision.ranked_total > 1
        assert decision.rejected_total == len(decision.rejected) == eu_summary.rejected_total  # us-east: residency


async def _eu_summary(router: RunningRouter) -> Decision:
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=2, jurisdictions=["EU"])
        await generation.text()
    assert generation.decision is not None
    return generation.decision


async def test_chat_and_model_energy_when_the_region_reports_none(stub_fleet: Fleet,
                                                                  make_router: RouterFactory) -> None:
    for stub in stub_fleet.regions.values():
        stub.settings.report_energy = False
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate(messages=[{"role": "user", "content": "hi"}], model="llama-3.1-8b",
                                     max_tokens=3)
        assert await generation.text() == "lorem ipsum dolor "
    receipt = generation.receipt
    assert receipt is not None
    assert receipt.measurement_source == "model" and receipt.attribution_method == "model-v1"
    assert receipt.energy_j > 0 and receipt.energy_j_low < receipt.energy_j < receipt.energy_j_high
    assert not receipt.HasField("confidence")
    # No carbon signal in the store: the receipt makes no signal up, and books the grams at the
    # marked upper bound (never 0).
    assert not receipt.HasField("carbon_signal") and receipt.carbon_basis == "upper-bound"
    assert receipt.carbon_g == pytest.approx(receipt.energy_j / 3.6e6 * 1100.0 * receipt.pue)


async def test_carbon_uses_the_fresh_signal_times_pue(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    import time

    from scheduler.state import codec
    from scheduler.types import Signal

    store = MemoryStore()
    now = time.time()
    for region in stub_fleet.configs:
        signal = Signal("carbon_intensity", region.carbon.zone, 200.0, "gCO2eq/kWh", now - 60, now, "test")
        await store.set(store_keys.signal("carbon_intensity", region.carbon.zone), codec.encode_signal(signal))
    router = await make_router(stub_fleet.configs, store=store)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=4)
        await generation.text()
    receipt = generation.receipt
    assert receipt is not None and generation.decision is not None
    assert generation.decision.energy_ranking
    assert receipt.carbon_signal.value == 200.0 and not receipt.carbon_signal.stale
    assert receipt.carbon_g == pytest.approx(receipt.energy_j / 3.6e6 * 200.0 * receipt.pue)
    assert receipt.carbon_basis == "signal" and not receipt.partial and receipt.end_reason == "complete"
    # The audit entry is written in the background, with no prompt text.
    for _ in range(100):
        entries = await store.xrange(store_keys.AUDIT, 10)
        if entries:
            break
        await asyncio.sleep(0.02)
    assert len(entries) == 1
    fields = entries[0][1]
    assert fields["decision_id"] == receipt.decision_id and fields["region"] == receipt.region
    assert float(fields["carbon_g"]) == pytest.approx(receipt.carbon_g)
    assert PROMPT not in str(fields)


async def test_failover_when_the_first_choice_region_is_down(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        decision = await client.route(PROMPT, model="llama-3.1-8b", max_tokens=4, jurisdictions=["EU"])
        first = decision.ranked[0].region
        assert {c.region for c in decision.ranked} == {"eu-north", "eu-central"}
        await stub_fleet.regions[first].stop()
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=4, jurisdictions=["EU"])
        assert await generation.text() == "lorem ipsum dolor sit "
    receipt = generation.receipt
    assert receipt is not None
    assert receipt.region != first and receipt.region in {"eu-north", "eu-central"}
    assert receipt.failovers and {f.region for f in receipt.failovers} == {first}
    assert receipt.failovers[0].http_status == 0 and "Connect" in receipt.failovers[0].error


async def test_failover_on_5xx_then_unavailable_when_every_region_fails(stub_fleet: Fleet,
                                                                         make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    for stub in stub_fleet.regions.values():
        stub.settings.fail_status = 503
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        client.retry = type(client.retry)(attempts=2, initial_backoff_s=0.01)
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=4, jurisdictions=["EU"])
        with pytest.raises(UnavailableError) as caught:
            await generation.text()
    error = caught.value
    assert error.retryable and generation.attempts == 2  # retried once: nothing had streamed
    assert {a["region"] for a in error.attempts} == {"eu-north", "eu-central"}
    assert all(a["http_status"] == 503 for a in error.attempts)


async def test_failure_after_the_first_token_is_unavailable_and_not_retried(stub_fleet: Fleet,
                                                                              make_router: RouterFactory) -> None:
    for stub in stub_fleet.regions.values():
        stub.settings.token_interval_s = 0.2
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=50, jurisdictions=["US"])
        received = []
        with pytest.raises(UnavailableError) as caught:
            async for text in generation:
                received.append(text)
                await stub_fleet.regions["us-east"].stop()
    assert received == ["lorem "]
    assert not caught.value.retryable and generation.attempts == 1
    assert "after the first token" in caught.value.message


async def test_bad_request_is_invalid_argument_naming_the_field(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        with pytest.raises(InvalidArgumentError) as caught:
            await client.generate(PROMPT, model="llama-3.1-8b", max_tokens=0, temperature=3.5).text()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field for v in caught.value.field_violations}
    assert fields == {"sampling.max_tokens", "sampling.temperature"}


async def test_no_region_satisfies_compliance_is_failed_precondition(stub_fleet: Fleet,
                                                                     make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        with pytest.raises(UnschedulableError) as caught:
            await client.route(PROMPT, model="llama-3.1-8b", max_tokens=4, jurisdictions=["JP"])
    violations = caught.value.violations
    assert violations and all(v.type == "residency-filter" for v in violations)
    assert {v.subject.split("/")[0] for v in violations} == set(stub_fleet.regions)


async def test_sync_client_streams_and_lists_regions(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)

    def use_sync_client() -> None:
        with SchedulerClient(f"127.0.0.1:{router.port}") as client:
            generation = client.generate(PROMPT, model="llama-3.1-8b", max_tokens=2)
            # Tokens that reach the router together are relayed as one chunk.
            assert "".join(generation) == "lorem ipsum "
            assert generation.receipt is not None and generation.receipt.completion_tokens == 2
            regions = client.list_regions()
            assert {r.name for r in regions} == set(stub_fleet.regions)
            assert all(r.endpoint.startswith("http://127.0.0.1:") for r in regions)

    # The blocking client runs in a thread while the router and regions serve on this loop.
    await asyncio.to_thread(use_sync_client)
