"""The ledger counts each (decision, region, pool) once, an engine's count over a router's, and a
failing store never drops what was handed to it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from scheduler.ledger.ledger import ENGINE_COUNTED, ROUTER_COUNTED, Ledger, LedgerEntry
from scheduler.ledger.service import LedgerService
from scheduler.state.memory_store import MemoryStore

NOW = 1_790_000_000.0


def entry(decision_id: str, energy_j: float = 10.0, region: str = "eu-north", pool: str = "h200-long",
          completion_tokens: int = 0, counted_by: int = ENGINE_COUNTED) -> LedgerEntry:
    return LedgerEntry(tenant="acme", region=region, energy_j=energy_j, carbon_g=1.0, rule_version="model-v1",
                       at=NOW, decision_id=decision_id, pool=pool, prompt_tokens=40,
                       completion_tokens=completion_tokens, counted_by=counted_by)


@dataclass
class FlakyStore(MemoryStore):
    """A memory store whose ``ledger_add`` fails with a plain error (not StateUnavailable) while
    ``failing`` is set: a bug-shaped failure, which must not lose entries either."""

    failing: bool = False

    async def ledger_add(self, key: str, fields: Mapping[str, float], entry_key: str | None,
                         entry_ttl_s: float, rank: int = 0) -> bool:
        if self.failing:
            raise RuntimeError("the store answered something unexpected")
        return await super().ledger_add(key, fields, entry_key, entry_ttl_s, rank)


def test_a_retried_entry_counts_once() -> None:
    async def scenario() -> tuple[float, float]:
        ledger = Ledger(MemoryStore(), clock=lambda: NOW)
        for decision_id in ("d1", "d1", "d2", "d1"):
            await ledger.record(entry(decision_id))
        usage, _ = await ledger.usage("acme")
        return usage.requests, usage.energy_j

    assert asyncio.run(scenario()) == (2.0, 20.0)


def test_every_target_of_one_decision_is_billed_once() -> None:
    """One Route hands out tickets for three targets; each used target is an entry of its own,
    and a retry of any of them counts once."""

    async def scenario() -> tuple[float, float]:
        ledger = Ledger(MemoryStore(), clock=lambda: NOW)
        targets = [("eu-north", "h200-long"), ("eu-north", "a100-batch"), ("us-east", "h100-chat")]
        for region, pool in [*targets, targets[0], targets[2]]:
            await ledger.record(entry("d1", region=region, pool=pool))
        usage, _ = await ledger.usage("acme")
        return usage.requests, usage.energy_j

    assert asyncio.run(scenario()) == (3.0, 30.0)


@pytest.mark.parametrize("order", [("router", "engine"), ("engine", "router")])
def test_the_engines_count_replaces_a_routers_whichever_comes_first(order: tuple[str, str]) -> None:
    """A cancelled proxied stream: the router books what it counted (2 tokens relayed), the
    region its engine's count (5 generated); the ledger holds the engine's, once."""
    booked = {"router": entry("d1", energy_j=4.0, completion_tokens=2, counted_by=ROUTER_COUNTED),
              "engine": entry("d1", energy_j=9.0, completion_tokens=5, counted_by=ENGINE_COUNTED)}

    async def scenario() -> tuple[float, float, float]:
        ledger = Ledger(MemoryStore(), clock=lambda: NOW)
        for name in order:
            await ledger.record(booked[name])
        usage, _ = await ledger.usage("acme")
        return usage.requests, usage.energy_j, usage.completion_tokens

    assert asyncio.run(scenario()) == (1.0, 9.0, 5.0)


def test_an_unexpected_store_failure_keeps_the_batch_queued() -> None:
    async def scenario() -> tuple[int, int, float]:
        store = FlakyStore(failing=True)
        service = LedgerService(Ledger(store, clock=lambda: NOW))
        for k in range(3):
            service._inbox.append(entry(f"d{k}"))  # what ``sink`` queues for a receipt
        with pytest.raises(RuntimeError):  # the background loop logs it and tries again
            await service._drain()
        pending_while_failing = service.pending
        store.failing = False
        await service._drain()
        usage, _ = await service.ledger.usage("acme")
        return pending_while_failing, service.pending, usage.requests

    assert asyncio.run(scenario()) == (3, 0, 3.0)


def test_receipts_that_finish_together_are_written_in_one_pass_and_budgets_read_per_interval() -> None:
    from scheduler.ledger.budget import TenantBudget
    from scheduler.server.audit import AuditLog
    from scheduler.types import EnergyReceipt

    def receipt(decision_id: str) -> EnergyReceipt:
        return EnergyReceipt(decision_id=decision_id, request_id=f"r-{decision_id}", tenant="acme",
                             model="llama-3.1-8b", region="eu-north", pool="h200-long", pue=1.1,
                             measurement_source="model", attribution_method="model-v1", energy_j=10.0,
                             carbon_g=1.0, carbon_basis="signal")

    async def scenario() -> tuple[int, int, float, int, int]:
        store = MemoryStore()
        ledger = Ledger(store, {"acme": TenantBudget(hard_energy_j=1e9)}, clock=lambda: NOW)
        service = LedgerService(ledger, interval_s=60.0, linger_s=0.05)
        audit = AuditLog(store, linger_s=0.05)
        passes = {"flush": 0, "usage": 0, "audit": 0}
        flush, usage, audit_flush = ledger.flush, ledger.usage, audit.flush

        async def counted_flush() -> None:
            passes["flush"] += 1
            await flush()

        async def counted_usage(*args: object) -> object:
            passes["usage"] += 1
            return await usage(*args)  # type: ignore[arg-type]

        async def counted_audit() -> None:
            passes["audit"] += 1
            await audit_flush()

        ledger.flush, ledger.usage, audit.flush = counted_flush, counted_usage, counted_audit  # type: ignore[method-assign]
        await service.start()
        await audit.start()
        try:
            for k in range(20):  # twenty streams end within a few milliseconds
                service.sink(receipt(f"d{k}"))
                audit.record(receipt(f"d{k}"))
                await asyncio.sleep(0.001)
            for _ in range(100):
                if service.pending == 0 and audit.pending == 0:
                    break
                await asyncio.sleep(0.02)
        finally:
            await audit.stop()
            await service.stop()
        used, _ = await usage("acme")
        return passes["flush"], passes["usage"], used.requests, audit.written, passes["audit"]

    flushes, usage_reads, requests, audited, audit_passes = asyncio.run(scenario())
    assert requests == 20 and audited == 20
    # One pass for the burst (at start and stop the service writes too), not one per receipt.
    assert flushes <= 4 and audit_passes <= 3, (flushes, audit_passes)
    # Budgets re-read once per interval (60 s here): once at start, once in the first pass.
    assert usage_reads <= 2, usage_reads
