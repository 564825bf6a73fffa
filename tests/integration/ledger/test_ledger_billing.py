"""Honest billing against a real Redis: a receipt booked twice counts once (a retry, a direct-mode
batch re-read by the next ingest holder), and a Redis that answers errors (OOM, READONLY,
NOSCRIPT) loses no receipt and kills neither the ledger nor the audit writer."""

from __future__ import annotations

import asyncio

import pytest
import redis

from scheduler.ledger.ledger import Ledger, month_of
from scheduler.ledger.service import LedgerService
from scheduler.server.audit import AuditLog
from scheduler.server.region_receipt_ingest import CURSOR, LOCK, RegionReceiptIngest
from scheduler.signed_region_receipt import STREAM, STREAM_MAXLEN, receipt_claims, sign_receipt
from scheduler.state import keys
from scheduler.state.factory import open_store
from scheduler.state.store import StateUnavailable
from scheduler.tickets import RegionKeys, Ticket, TicketKeyRing
from scheduler.types import EnergyReceipt
from tests.integration.ledger.conftest import SHARED_REDIS
from tests.integration.ledger.redis_server import OwnRedis, _free_port

pytestmark = pytest.mark.integration

NOW = 1_790_000_000.0  # 2026-09-21, UTC
RING = TicketKeyRing({"eu-north": RegionKeys.generate("eu-north", kid="eu-north-k1")})


def receipt(decision_id: str, energy_j: float = 100.0) -> EnergyReceipt:
    return EnergyReceipt(decision_id=decision_id, request_id=f"r-{decision_id}", tenant="acme",
                         model="llama-3.1-8b", region="eu-north", pool="h200-long", pue=1.1,
                         measurement_source="model", attribution_method="model-v1", energy_j=energy_j,
                         carbon_g=energy_j / 3.6e6 * 100.0 * 1.1, carbon_basis="signal")


def direct_entry(decision_id: str) -> dict[str, str]:
    ticket = Ticket(decision_id=decision_id, request_id=f"r-{decision_id}", tenant="acme", region="eu-north",
                    pool="h200-long", model="llama-3.1-8b", max_tokens=16, prompt_tokens_max=10,
                    body_sha256="x", expires_at=0.0, mode="direct", carbon_g_per_kwh=100.0,
                    carbon_zone="NO", carbon_observed_at=NOW, carbon_source="csv")
    claims = receipt_claims(ticket, pue=1.1, energy={"energy_j": 36.0, "measurement_source": "model",
                                                     "attribution_method": "model-v1"},
                            usage={"prompt_tokens": 10, "completion_tokens": 16, "cached_tokens": 0},
                            at=NOW, ttft_ms=12.0, duration_ms=80.0)
    return sign_receipt(RING.of("eu-north"), claims)


async def wait_for(condition: object, what: str, timeout_s: float = 15.0) -> None:
    assert callable(condition)
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_same_receipt_booked_twice_counts_once(namespace: str) -> None:
    store = open_store(SHARED_REDIS, namespace)
    ledger = Ledger(store, clock=lambda: NOW)
    service = LedgerService(ledger)
    try:
        # A retry: the router books decision d1 a second time.
        service.sink(receipt("d1"))
        service.sink(receipt("d1"))
        service.sink(receipt("d2", energy_j=50.0))
        await service._drain()
        # Direct mode: a holder books a batch and dies before moving the cursor; the next
        # holder reads the same batch again.
        for decision_id in ("d3", "d4"):
            await store.xadd(STREAM, direct_entry(decision_id), STREAM_MAXLEN)
        first = RegionReceiptIngest(store, RING, service.sink, owner="a")
        assert await first.ingest_once() == 2
        await store.delete(CURSOR)
        await store.release_lock(LOCK, "a")
        second = RegionReceiptIngest(store, RING, service.sink, owner="b")
        assert await second.ingest_once() == 2
        await service._drain()
        usage, _ = await ledger.usage("acme", month_of(NOW))
        print(f"\n6 bookings of 4 decisions: stored {usage.requests:.0f} requests, {usage.energy_j:.1f} J")
        assert usage.requests == 4
        assert usage.energy_j == pytest.approx(100.0 + 50.0 + 36.0 + 36.0)
    finally:
        await store.close()


async def test_error_answers_keep_receipts_queued_and_the_writers_alive(own_redis: OwnRedis) -> None:
    store = open_store(own_redis.url, "errors")
    ledger = Ledger(store, clock=lambda: NOW, retry_initial_s=0.05, retry_max_s=0.2)
    service = LedgerService(ledger, interval_s=0.1)
    audit = AuditLog(store, retry_s=0.05)
    admin = redis.Redis(port=own_redis.port, socket_timeout=2)
    await service.start()
    await audit.start()
    try:
        # OOM: every write refused.
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        with pytest.raises(StateUnavailable, match="OutOfMemoryError"):
            await store.set("probe", b"x")
        for k in range(5):
            r = receipt(f"oom{k}")
            audit.record(r)
            service.sink(r)
        await asyncio.sleep(0.5)
        print(f"\nOOM: ledger pending {service.pending}, audit pending {audit.pending}")
        assert service.pending == 5 and audit.pending == 5
        # READONLY: the server became a replica (of a master that is not there).
        admin.config_set("maxmemory", "0")
        admin.execute_command("REPLICAOF", "127.0.0.1", str(_free_port()))
        with pytest.raises(StateUnavailable, match="ReadOnlyError"):
            await store.set("probe", b"x")
        for k in range(5):
            r = receipt(f"ro{k}")
            audit.record(r)
            service.sink(r)
        await asyncio.sleep(0.5)
        print(f"READONLY: ledger pending {service.pending}, audit pending {audit.pending}")
        assert service.pending == 10 and audit.pending == 10
        # Back to normal, scripts flushed (the next script call meets NOSCRIPT and reloads).
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.script_flush()
        await wait_for(lambda: service.pending == 0 and audit.pending == 0, "the queues to drain")
        usage, _ = await ledger.usage("acme", month_of(NOW))
        entries = await store.xrange(keys.AUDIT, 100)
        print(f"recovered: {usage.requests:.0f} requests booked, {len(entries)} audit entries")
        assert usage.requests == 10 and usage.energy_j == pytest.approx(1000.0)
        assert sorted(e["decision_id"] for _, e in entries) == sorted(
            [f"oom{k}" for k in range(5)] + [f"ro{k}" for k in range(5)])
        assert audit._task is not None and not audit._task.done()
        assert service._task is not None and not service._task.done()
    finally:
        admin.close()
        await audit.stop()
        await service.stop()
        await store.close()
