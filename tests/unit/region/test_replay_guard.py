"""Single use of dispatch tickets at the gateway: in the shared store, and in the replica's
memory while the store is down (the documented trade-off)."""

from __future__ import annotations

import asyncio

from scheduler.region.gateway import ReplayGuard
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import StateUnavailable
from scheduler.tickets import Ticket

NOW = 1_780_000_000.0


def ticket(decision_id: str = "d1", pool: str = "h200-long") -> Ticket:
    return Ticket(decision_id=decision_id, request_id="r", tenant="t", region="eu-north", pool=pool,
                  model="llama-3.1-8b", max_tokens=8, prompt_tokens_max=8, body_sha256="x", expires_at=NOW + 30)


class DeadStore:
    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool:
        raise StateUnavailable("connection refused")


def test_a_ticket_is_used_once_across_replicas_sharing_the_store() -> None:
    async def scenario() -> list[bool]:
        store = MemoryStore()
        one, other = ReplayGuard(store), ReplayGuard(store)
        return [await one.first_use(ticket(), NOW), await other.first_use(ticket(), NOW),
                await one.first_use(ticket(), NOW),
                # Failover: the same decision on another pool is another use.
                await other.first_use(ticket(pool="a100-batch"), NOW)]

    assert asyncio.run(scenario()) == [True, False, False, True]


def test_with_the_store_down_the_replica_still_refuses_its_own_replays() -> None:
    async def scenario() -> list[bool]:
        guard = ReplayGuard(DeadStore())
        return [await guard.first_use(ticket(), NOW), await guard.first_use(ticket(), NOW + 1),
                await guard.first_use(ticket("d2"), NOW + 1),
                # Long after the ticket's expiry the replica forgets it (the ticket itself is dead).
                await guard.first_use(ticket(), NOW + 3600)]

    assert asyncio.run(scenario()) == [True, False, True, True]
