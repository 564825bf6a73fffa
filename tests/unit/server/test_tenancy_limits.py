"""Per-tenant stream slots, the shared rate limiter's leasing over a store, and key-bound
jurisdictions (table-driven)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import scheduler
from scheduler import errors
from scheduler.server.auth import Principal, TenantRateLimiter, scope_jurisdictions
from scheduler.server.rate_limit import SharedRateLimiter
from scheduler.server.stream_slots import DEFAULT_MAX_STREAMS, GATEWAY_MAX_ONGOING, StreamSlots
from scheduler.state.memory_store import MemoryStore


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_default_stream_cap_is_a_quarter_of_one_gateway_replica() -> None:
    # Read from the gateway's source: importing it would import Ray.
    source = (Path(scheduler.__file__).parent / "region" / "gateway.py").read_text()
    declared = re.search(r"@serve\.deployment\([^)]*max_ongoing_requests=(\d+)", source)
    assert declared is not None and int(declared.group(1)) == GATEWAY_MAX_ONGOING
    assert DEFAULT_MAX_STREAMS == 64 == GATEWAY_MAX_ONGOING // 4


def test_stream_slots_cap_each_tenant_and_give_back() -> None:
    slots = StreamSlots(max_streams=2)
    acme, vip, globex = Principal("acme", False), Principal("acme", False, max_concurrent_streams=3), \
        Principal("globex", False)
    slots.acquire(acme)
    slots.acquire(acme)
    with pytest.raises(errors.StreamLimited, match="2 concurrent"):
        slots.acquire(acme)
    slots.acquire(globex)  # another tenant: its own slots
    slots.acquire(vip)  # a key with a higher cap for the same tenant
    assert slots.held("acme") == 3 and slots.refused == 1
    for principal in (acme, acme, vip, globex):
        slots.release(principal)
    assert slots.held("acme") == 0 and slots.held("globex") == 0
    with pytest.raises(ValueError, match="max_streams"):
        StreamSlots(max_streams=0)


async def test_shared_limiter_leases_a_few_tokens_and_refills_in_the_background() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    calls = 0
    take = store.take_tokens

    async def counted(*args: object, **kwargs: object) -> tuple[int, float]:
        nonlocal calls
        calls += 1
        return await take(*args, **kwargs)  # type: ignore[arg-type]

    store.take_tokens = counted  # type: ignore[method-assign]
    limiter = SharedRateLimiter(store, TenantRateLimiter(default_rps=100.0, burst_s=1.0), clock=clock)
    acme = Principal("acme", False)
    for _ in range(100):  # the whole burst, no time passing
        await limiter.check(acme)
        await asyncio.sleep(0)  # let background leases run
    with pytest.raises(errors.RateLimited):
        await limiter.check(acme)
    print(f"100 admitted requests took {calls} store calls (lease of 10)")
    assert calls <= 100 // 10 + 3


async def test_two_limiters_on_one_store_share_a_rate() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    a, b = (SharedRateLimiter(store, TenantRateLimiter(default_rps=5.0, burst_s=2.0), clock=clock) for _ in "ab")
    acme = Principal("acme", False)
    admitted = 0
    for limiter in (a, b) * 10:
        try:
            await limiter.check(acme)
            admitted += 1
        except errors.RateLimited:
            pass
    assert admitted == 10  # capacity 10, shared: per-router buckets would admit 20


@pytest.mark.parametrize(("bound", "requested", "allowed"), [
    ((), (), ()),
    ((), ("US",), ("US",)),
    (("EU",), (), ("EU",)),
    (("EU",), ("EU", "US"), ("EU",)),
    (("EU", "UK"), ("UK",), ("UK",)),
])
def test_scope_jurisdictions(bound: tuple[str, ...], requested: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    assert scope_jurisdictions(Principal("acme", False, jurisdictions=bound), requested) == allowed


def test_scope_jurisdictions_outside_the_key_is_denied_by_name() -> None:
    with pytest.raises(errors.PermissionDenied, match="may only run in EU; the request allows only JP, US"):
        scope_jurisdictions(Principal("acme", False, jurisdictions=("EU",)), ("US", "JP"))
