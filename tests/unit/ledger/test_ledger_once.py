"""The ledger counts a decision once, and a failing store never drops what was handed to it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from scheduler.ledger.ledger import Ledger, LedgerEntry
from scheduler.ledger.service import LedgerService
from scheduler.state.memory_store import MemoryStore

NOW = 1_790_000_000.0


def entry(decision_id: str, energy_j: float = 10.0) -> LedgerEntry:
    return LedgerEntry(tenant="acme", region="eu-north", energy_j=energy_j, carbon_g=1.0, rule_version="model-v1",
                       at=NOW, decision_id=decision_id)


@dataclass
class FlakyStore(MemoryStore):
    """A memory store whose ``ledger_add`` fails with a plain error (not StateUnavailable) while
    ``failing`` is set: a bug-shaped failure, which must not lose entries either."""

    failing: bool = False

    async def ledger_add(self, key: str, fields: Mapping[str, float], once_key: str | None,
                         once_ttl_s: float) -> bool:
        if self.failing:
            raise RuntimeError("the store answered something unexpected")
        return await super().ledger_add(key, fields, once_key, once_ttl_s)


def test_a_retried_entry_counts_once() -> None:
    async def scenario() -> tuple[float, float]:
        ledger = Ledger(MemoryStore(), clock=lambda: NOW)
        for decision_id in ("d1", "d1", "d2", "d1"):
            await ledger.record(entry(decision_id))
        usage, _ = await ledger.usage("acme")
        return usage.requests, usage.energy_j

    assert asyncio.run(scenario()) == (2.0, 20.0)


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
