"""The ledger against real Redis: a hard budget two routers share, no entry lost across a
Redis restart, a bounded queue that loses nothing, and ``scheduler ledger show``."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from scheduler.cli import main
from scheduler.errors import BudgetExhausted
from scheduler.ledger.budget import TenantBudget
from scheduler.ledger.ledger import FIELDS, Ledger, LedgerEntry, month_of
from scheduler.state import keys
from scheduler.state.factory import open_store
from tests.integration.ledger.conftest import SHARED_REDIS
from tests.integration.ledger.redis_server import OwnRedis

pytestmark = pytest.mark.integration

NOW = 1_790_000_000.0  # 2026-09-21, UTC


def entry(tenant: str, energy_j: float, region: str = "eu-north", k: int = 0, at: float = NOW) -> LedgerEntry:
    return LedgerEntry(tenant=tenant, region=region, energy_j=energy_j, carbon_g=energy_j / 3.6e6 * 120,
                       rule_version="shared-v1", at=at, workload_class="batch", decision_id=f"d{k}")


async def test_hard_budget_is_enforced_across_two_routers(namespace: str) -> None:
    budgets = {"acme": TenantBudget(soft_energy_j=500.0, hard_energy_j=1000.0)}
    store_a, store_b = open_store(SHARED_REDIS, namespace), open_store(SHARED_REDIS, namespace)
    router_a = Ledger(store_a, budgets, critical_workload_classes=("interactive",), clock=lambda: NOW)
    router_b = Ledger(store_b, budgets, critical_workload_classes=("interactive",), clock=lambda: NOW)
    try:
        assert (await router_b.check("acme", "batch")).level == "ok"
        assert await router_a.record(entry("acme", 600.0))
        soft = await router_b.check("acme", "batch")
        print(f"\nafter 600 J on router A, router B sees {soft.energy_j:.0f} J: {soft.level}")
        assert soft.level == "soft" and router_b.soft_limit_warnings == 1
        assert await router_b.record(entry("acme", 450.0, region="us-west", k=1))
        with pytest.raises(BudgetExhausted) as refused:
            await router_a.check("acme", "batch")
        print(f"router A after router B's 450 J: {refused.value}")
        with pytest.raises(BudgetExhausted):
            await router_b.check("acme", "deferrable")
        critical = await router_b.check("acme", "interactive")
        assert critical.level == "hard" and critical.exempt and critical.energy_j == pytest.approx(1050.0)
        assert (await router_a.check("other-tenant", "batch")).level == "ok"
        stored = await store_a.hgetall(keys.ledger("acme", month_of(NOW)))
        assert float(stored["eu-north|shared-v1|energy_j"]) == pytest.approx(600.0)
        assert float(stored["us-west|shared-v1|requests"]) == 1.0
    finally:
        await store_a.close()
        await store_b.close()


@pytest.mark.timeout(120)
async def test_no_entry_lost_when_redis_restarts_mid_run(own_redis: OwnRedis) -> None:
    store = open_store(own_redis.url, "restart")
    ledger = Ledger(store, clock=lambda: NOW, retry_initial_s=0.05, retry_max_s=0.2)
    rng = random.Random(3)
    amounts = [round(rng.uniform(1, 500), 3) for _ in range(300)]
    queued_while_down: list[int] = []

    async def producer() -> None:
        for k, amount in enumerate(amounts):
            await ledger.record(entry("acme", amount, k=k))
            await asyncio.sleep(0.005)

    async def restart() -> None:
        await asyncio.sleep(0.4)
        await asyncio.to_thread(own_redis.shutdown_saving)
        await asyncio.sleep(1.0)  # down: the producer keeps recording
        queued_while_down.append(ledger.pending)
        await asyncio.to_thread(own_redis.start)

    try:
        await asyncio.gather(producer(), restart())
        for _ in range(100):
            if ledger.pending == 0:
                break
            await asyncio.sleep(0.05)
            await ledger.flush()
        usage, stale = await ledger.usage("acme")
        print(f"\n{len(amounts)} receipts, {queued_while_down[0]} queued while Redis was down; "
              f"stored {usage.requests:.0f} requests, {usage.energy_j:.3f} J (sent {sum(amounts):.3f} J)")
        assert queued_while_down[0] > 0
        assert not stale and ledger.pending == 0
        assert usage.requests == len(amounts)
        assert usage.energy_j == pytest.approx(sum(amounts), abs=1e-6)
    finally:
        await store.close()


async def test_bounded_queue_folds_and_loses_nothing(own_redis: OwnRedis) -> None:
    store = open_store(own_redis.url, "bounded")
    ledger = Ledger(store, clock=lambda: NOW, max_pending=10, retry_initial_s=0.0, retry_max_s=0.0)
    try:
        own_redis.stop()
        for k in range(50):
            assert not await ledger.record(entry("acme", 10.0 + k, region=("a", "b")[k % 2], k=k))
        print(f"\n50 receipts with the store down, max_pending 10: {ledger.pending} pending items")
        assert ledger.pending <= 10 + 2 * len(FIELDS)  # the queue plus one folded sum per region and field
        own_redis.start()
        await ledger.flush()
        usage, _ = await ledger.usage("acme")
        assert ledger.pending == 0
        assert usage.requests == 50
        assert usage.energy_j == pytest.approx(sum(10.0 + k for k in range(50)))
        assert usage.by_region[("a", "shared-v1")]["requests"] == 25
    finally:
        await store.close()


def test_ledger_show_cli(namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def fill() -> None:
        store = open_store(SHARED_REDIS, namespace)
        ledger = Ledger(store, clock=lambda: NOW)
        for k, (region, joules) in enumerate([("eu-north", 3.6e6), ("us-west", 1.8e6), ("eu-north", 1.0)]):
            await ledger.record(entry("acme", joules, region=region, k=k))
        await store.close()

    asyncio.run(fill())
    args = ["ledger", "show", "--tenant", "acme", "--month", month_of(NOW), "--state", SHARED_REDIS,
            "--namespace", namespace]
    assert main([*args, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["energy_j"] == pytest.approx(5.4e6 + 1.0) and shown["requests"] == 3
    assert {r["region"] for r in shown["by_region"]} == {"eu-north", "us-west"}
    assert main(args) == 0
    text = capsys.readouterr().out
    print("\n" + text)
    assert "eu-north" in text and "1.5000" in text  # 5.4 MJ = 1.5 kWh
