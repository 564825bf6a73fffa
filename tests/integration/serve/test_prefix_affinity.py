"""Prefix and workflow affinity on a real vLLM CPU region (docs/affinity.md): the steps of a
workflow sharing a long system prompt, routed with affinity, are served from the engine's
prefix cache; the same steps moved to the other pool between steps (what a router without
affinity does when its ranking moves a workflow) get close to none. The hits reach the
router's snapshot through the store. Counts are printed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from scheduler.client import AsyncSchedulerClient
from scheduler.region.stack import LocalStack
from tests.integration.serve.conftest import REGION, ticket_headers

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODEL = "llama-3.1-8b"
POOLS = ("h200-long", "a100-batch")
WORKFLOWS = 3


def system_prompt(tag: str) -> str:
    """~300 tokens of the tiny model's tokenizer (both pools' engines take it: 512 and 2048),
    over two CPU cache blocks (128 tokens); distinct per workflow."""
    return f"[{tag}] You plan batch jobs for the hours when the grid is cleanest and cheapest. " * 8


async def cached_tokens_direct(stack: LocalStack, client: httpx.AsyncClient, prompt: str, pool: str,
                               tenant: str = "test") -> int:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
    headers = ticket_headers(stack, body, pool=pool, tenant=tenant)
    body["x_scheduler"] = {"pool": pool}
    cached = -1
    async with client.stream("POST", f"{stack.endpoint(REGION)}/v1/completions", json=body,
                             headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    assert cached >= 0, "no usage event"
    return cached


@pytest.mark.timeout(300)
async def test_affinity_keeps_a_workflow_on_its_warm_replica_and_moving_it_loses_the_cache(stack: LocalStack) -> None:
    with_affinity: list[tuple[str, int]] = []
    async with AsyncSchedulerClient(stack.router_target) as client:
        for w in range(WORKFLOWS):
            system = system_prompt(f"affinity-{w}")
            for step in range(2):
                generation = client.generate(system + f" Step {step}: which hour?", model=MODEL, max_tokens=2,
                                             workflow_id=f"wf-affinity-{w}")
                await generation.text()
                receipt = generation.receipt
                assert receipt is not None
                with_affinity.append((receipt.pool, receipt.reused_tokens))
    moved: list[tuple[str, int]] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for w in range(WORKFLOWS):
            system = system_prompt(f"moved-{w}")
            for step in range(2):
                pool = POOLS[step % 2]  # the workflow moves to the other pool for its next step
                moved.append((pool, await cached_tokens_direct(stack, http, system + f" Step {step}: which hour?",
                                                               pool)))
    print(f"\nwith affinity (pool, cached prompt tokens per step): {with_affinity}")
    print(f"moved between steps:                                {moved}")
    first_steps, next_steps = with_affinity[0::2], with_affinity[1::2]
    assert all(a[0] == b[0] for a, b in zip(first_steps, next_steps, strict=True)), "a workflow left its pool"
    assert all(cached >= 128 for _, cached in next_steps)
    assert sum(cached for _, cached in moved[1::2]) == 0
    # The region published the hits; the router's snapshot knows where the prefixes are warm.
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        warm = stack.router.deps.refresher.current().prefix_warm
        places = {w.place for entries in warm.values() for w in entries}
        if f"{REGION}/{next_steps[0][0]}" in places or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.5)
    print(f"snapshot: {len(warm)} warm prefix keys at {sorted(places)}")
    assert f"{REGION}/{next_steps[0][0]}" in places


@pytest.mark.timeout(300)
async def test_a_tenant_is_never_served_from_another_tenants_cached_prefix(stack: LocalStack) -> None:
    """Issue 26.7: the gateway salts each tenant's prefix cache (vLLM's ``cache_salt``), so a
    tenant that sends another's prompt learns nothing from its ``cached_tokens``, while each
    tenant's own repeats are still served from the cache."""
    prompt = system_prompt("tenant-salt") + " Which hour is cleanest?"
    pool = POOLS[0]
    async with httpx.AsyncClient(timeout=120) as http:
        victim = [await cached_tokens_direct(stack, http, prompt, pool, tenant="tenant-b") for _ in range(2)]
        prober = [await cached_tokens_direct(stack, http, prompt, pool, tenant="tenant-a") for _ in range(2)]
    print(f"\ncached prompt tokens, tenant B twice: {victim}; tenant A, the same prompt, twice: {prober}")
    assert victim[1] >= 128, "the victim's own repeat is not served from its cache"
    assert prober[0] == 0, "tenant A was served from tenant B's cached prefix"
    assert prober[1] >= 128, "tenant A's own repeat is not served from its cache"
