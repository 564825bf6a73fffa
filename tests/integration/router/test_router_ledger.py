"""The ledger inside the router: every receipt lands in the tenant's month; a hard budget
refuses new work with RESOURCE_EXHAUSTED, of every class unless the policy exempts one explicitly."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from scheduler.client import AsyncSchedulerClient, SchedulerRpcError
from scheduler.ledger.budget import TenantBudget
from scheduler.ledger.ledger import Ledger, month_of
from scheduler.state.memory_store import MemoryStore

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
