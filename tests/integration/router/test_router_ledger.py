"""The ledger inside the router: every receipt lands in the tenant's month; a hard budget
refuses new work with RESOURCE_EXHAUSTED, of every class unless the policy exempts one explicitly."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import grpc
import pytest
import redis.asyncio

from scheduler.client import AsyncSchedulerClient, SchedulerRpcError
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.ledger.budget import TenantBudget
from scheduler.ledger.ledger import Ledger, entry_key, month_of
from scheduler.server.app import build_deps, start_router, with_services
from scheduler.state import keys
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration


async def test_receipts_fill_the_ledger_and_a_hard_budget_refuses_batch_work(
    stub_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    # Any request costs more than a microjoule: the first one uses the budget up.
    router = await make_router(stub_fleet.configs, store=store, budgets={"local": TenantBudget(hard_energy_j=1e-6)})
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        first = client.generate("hello", model="llama-3.1-8b", max_tokens=3, workload_class="batch")
        assert await first.text()
        receipt = first.receipt
        assert receipt is not None and receipt.energy_j > 0
        # The background task records it and re-reads the month (interval 1 s).
        usage = None
        for _ in range(40):
            usage, _ = await Ledger(store).usage("local")
            if usage.requests:
                break
            await asyncio.sleep(0.1)
        assert usage is not None and usage.requests == 1
        assert usage.energy_j == pytest.approx(receipt.energy_j)
        assert usage.month == month_of(time.time())

        refused = None
        for _ in range(40):
            try:
                await client.generate("hello again", model="llama-3.1-8b", max_tokens=3, workload_class="batch").text()
            except SchedulerRpcError as exc:
                refused = exc
                break
            await asyncio.sleep(0.1)
        assert refused is not None and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "hard energy_j budget" in refused.message

        # The default policy exempts no class: interactive work is refused too.
        with pytest.raises(SchedulerRpcError) as caught:
            await client.generate("urgent", model="llama-3.1-8b", max_tokens=2, workload_class="interactive").text()
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")


async def test_the_idempotency_window_sets_how_long_entries_and_markers_live(stub_fleet: Fleet) -> None:
    """``--idempotency-window`` (here 900 s): the ledger's entry and the audit's marker of a
    request are kept that long, not the default day; the month's hash is kept."""
    namespace = f"idem-{uuid.uuid4().hex[:8]}"
    store = RedisStore.from_url(REDIS_URL, namespace)
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    deps = build_deps(SnapshotBuilder(compile_fleet(stub_fleet.configs),
                                      compile_policy(load_fleet().policy("default"))), store, "redis",
                      rate_limit_rps=1000.0)
    with_services(deps, carbon_pollers=False, budgets={}, idempotency_window_s=900.0)
    router = await start_router("127.0.0.1:0", deps)
    try:
        async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as sdk:
            generation = sdk.generate("hello", model="llama-3.1-8b", max_tokens=3)
            assert await generation.text()
            receipt = generation.receipt
            assert receipt is not None
        await router.stop(grace_s=1.0)  # its ledger and audit flush
        prefix = f"sched:{namespace}:"
        entry = prefix + entry_key(receipt.decision_id, receipt.region, receipt.pool)
        marker = prefix + keys.audit_once(f"{receipt.decision_id}:{receipt.region}:{receipt.pool}")
        for key in (entry, marker):
            ttl_ms = await client.pttl(key)
            assert 890_000 <= ttl_ms <= 900_000, (key, ttl_ms)
        assert await client.pttl(prefix + keys.ledger("local", month_of(time.time()))) == -1
    finally:
        await router.stop(grace_s=0.5)
        async for key in client.scan_iter(match=f"sched:{namespace}:*"):
            await client.delete(key)
        await client.aclose()
        await store.close()
