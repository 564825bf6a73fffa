"""Ray Serve + vLLM (CPU build, tiny model) + the router, end to end through the SDK.

Runs in file order on one session stack (conftest.py); the region is taken down last.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from scheduler.client import AsyncSchedulerClient, UnschedulableError
from scheduler.region.stack import LocalStack
from scheduler.sim.vs_real import QUICK_SWEEP, compare
from scheduler.state import codec, keys
from scheduler.state.factory import open_store
from scheduler.types import Request
from tests.integration.serve.conftest import REGION, ticket_headers

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

# Over 512 tokens of the tiny model's tokenizer (so only the long pool, max_model_len 2048,
# fits it) and over 128 (the CPU block size), shared by two requests.
LONG_PREFIX = "The grid's carbon intensity changes through the day as wind and sun come and go. " * 40
POOLS = {"h200-long", "a100-batch"}


@pytest.mark.timeout(300)
async def test_streams_a_completion_with_a_receipt(stack: LocalStack) -> None:
    async with AsyncSchedulerClient(stack.router_target) as client:
        generation = client.generate("Hello! How are you today?", model="llama-3.1-8b", max_tokens=8)
        text = await generation.text()
    receipt = generation.receipt
    assert receipt is not None and text
    assert receipt.region == REGION and receipt.pool in POOLS
    assert receipt.prompt_tokens > 0 and receipt.completion_tokens > 0
    assert receipt.measurement_source == "model" and receipt.energy_j > 0


@pytest.mark.timeout(120)
async def test_a_repeated_long_prefix_reuses_cached_tokens(stack: LocalStack) -> None:
    receipts = []
    async with AsyncSchedulerClient(stack.router_target) as client:
        for suffix in (" First question?", " Second question?"):
            generation = client.generate(LONG_PREFIX + suffix, model="llama-3.1-8b", max_tokens=4)
            await generation.text()
            receipts.append(generation.receipt)
    first, second = receipts
    assert first is not None and second is not None
    assert first.pool == second.pool == "h200-long"  # the only pool whose engine fits the prompt
    assert first.prompt_tokens > 512
    assert second.reused_tokens > 0
    assert second.avoided_j > 0


@pytest.mark.timeout(60)
async def test_region_publishes_engine_stats_through_the_stat_logger_hook(stack: LocalStack) -> None:
    """The private path scheduler.region.engine.attach_live_stats relies on still works: the
    published prefix-cache hit rate comes only from the hook (after the cached request above)."""
    store = open_store(stack.state_url, stack.namespace)
    try:
        deadline = time.monotonic() + 10
        while True:
            raw = await store.get(keys.region_state(REGION))
            state = codec.decode_region_state(raw) if raw is not None else None
            pool = state.pools.get("h200-long") if state is not None else None  # where the cached prompt ran
            if (pool is not None and pool.prefix_cache_hit_rate > 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await store.close()
    assert state is not None and state.healthy
    assert time.time() - state.observed_at < 5
    assert pool is not None and 0 < pool.prefix_cache_hit_rate <= 1


@pytest.mark.timeout(60)
async def test_direct_region_call_answers_openai_format(stack: LocalStack) -> None:
    body = {"model": "llama-3.1-8b", "prompt": "Hello", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    url = f"{stack.endpoint(REGION)}/v1/completions"
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("POST", url, json=body, headers=ticket_headers(stack, body)) as response:
            assert response.status_code == 200
            assert response.headers["x-scheduler-pool"] == "h200-long"
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        other = {**body, "model": "llama-3.2-3b"}  # a model of a100-batch, not of h200-long
        missing = await client.post(url, json=other, headers=ticket_headers(stack, other))
        unserved = await client.post(url, json=body, headers=ticket_headers(stack, body, pool="h100-chat"))
    assert lines[-1] == "data: [DONE]"
    assert '"energy"' in lines[-2] and '"choices":[]' in lines[-2]
    assert '"receipt"' not in lines[-2]  # proxy mode: the router writes the receipt
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert unserved.status_code == 404 and unserved.json()["error"]["code"] == "pool_not_served"


@pytest.mark.timeout(300)
async def test_sim_vs_real_replays_the_trace_through_the_region_over_http(stack: LocalStack) -> None:
    """``scheduler bench sim-vs-real --endpoint``: calibrated on an in-process engine, replayed
    through this region's HTTP API (the quick sweep, six requests); the figures are in
    docs/simulation.md, this checks the plumbing."""
    report = await compare("conv", 6, 4.0, 0.25, 0, QUICK_SWEEP, "region", stack.endpoint(REGION),
                           ticket_keys=stack.ticket_keys)
    assert report.scenario["through"] == "region" and report.scenario["requests"] == 6
    for figures in (report.real, report.sim):
        assert 0 < figures["ttft_p50_ms"] <= figures["ttft_p99_ms"] < 5000
        assert figures["ttft_p50_ms"] < figures["done_p50_ms"] <= figures["done_p99_ms"]
    assert report.sim["ttft_p50_ms"] == pytest.approx(report.real["ttft_p50_ms"], rel=3.0)
    assert "through a local region" in report.table() and "in-engine" not in report.table()


@pytest.mark.timeout(60)
async def test_a_client_that_goes_away_is_no_longer_in_flight(stack: LocalStack) -> None:
    body = {"model": "llama-3.1-8b", "prompt": "Tell me a long story.", "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("POST", f"{stack.endpoint(REGION)}/v1/completions", json=body,
                                 headers=ticket_headers(stack, body)) as response:
            lines = response.aiter_lines()
            async for line in lines:
                if line.startswith("data:"):
                    # Still reading the stream: the request is in flight.
                    busy = codec.decode_region_state((await client.get(f"{stack.endpoint(REGION)}/state")).content)
                    break
            await lines.aclose()
        # The stream is closed here, long before 1500 tokens.
        deadline = time.monotonic() + 10
        while True:
            state = codec.decode_region_state((await client.get(f"{stack.endpoint(REGION)}/state")).content)
            pool = state.pools["h200-long"]
            if pool.running + pool.queue_depth == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert busy.pools["h200-long"].running + busy.pools["h200-long"].queue_depth == 1
    assert pool.running + pool.queue_depth == 0


@pytest.mark.timeout(120)
async def test_a_region_taken_down_is_unhealthy_within_the_limit_and_gets_no_requests(stack: LocalStack) -> None:
    refresher = stack.router.deps.refresher
    limit = refresher.current().policy.max_age.region_state
    assert refresher.current().fresh_live(REGION) is not None

    scheduler = stack.router.deps.scheduler
    probe = Request(request_id="probe", model="llama-3.1-8b", prompt_tokens=16, max_tokens=4)
    assert scheduler.schedule(probe, refresher.current()).schedulable

    killed_at = time.time()
    await stack.delete_region(REGION)
    deadline = time.monotonic() + limit + 10
    while True:
        snapshot = refresher.current()
        decision = scheduler.schedule(probe, snapshot)
        if not decision.schedulable or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    marked_at = time.time()
    rejected = [r for r in decision.rejected if r.plugin == "region-health"]
    assert not decision.schedulable and rejected
    assert all(r.candidate.region.name == REGION for r in rejected)
    # Either its gateway outlived its engines long enough to publish "unhealthy" (no pool
    # answers), or it stopped publishing and its state aged past the limit.
    assert rejected[0].reason == "region reports unhealthy" or "old > limit" in rejected[0].reason
    # The region published until it was taken down, and the router noticed within the
    # policy's limit of its last publication (plus one refresh period and some slack).
    last_seen = snapshot.live[REGION].observed_at
    assert last_seen >= killed_at - 2 * stack.options.publish_interval_s
    assert marked_at - last_seen <= limit + refresher.interval_s + 1.0

    async with AsyncSchedulerClient(stack.router_target) as client:
        with pytest.raises(UnschedulableError):
            await client.generate("Anyone there?", model="llama-3.1-8b", max_tokens=4).text()
