"""Per-tenant request rates shared by every router through the state store.

Each tenant's rate is one token bucket in the store (``StateStore.take_tokens``: a Lua script
on Redis, atomic, on Redis's clock), so N routers together admit the tenant's rate, not N
times it. To keep the store off the request path a router leases a few tokens at a time
(``lease_s`` worth of the rate, at least one) into a local purse and spends them; when the
purse runs below half a lease it leases the next batch in the background, and only a request
that finds the purse empty waits for one store round trip. Leased tokens unused for
``purse_ttl_s`` are dropped (a tenant idle on this router does not keep a private burst).

When the store cannot be reached (or answers slower than ``store_timeout_s``) the router falls
back to its per-process bucket (``TenantRateLimiter``: each router then admits the whole rate
on its own), logs it once per outage, counts it (``scheduler_rate_limit_store_fallbacks_total``,
gauge ``scheduler_rate_limit_shared`` 0), and probes the store in the background every
``retry_s`` until it answers again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from scheduler import errors
from scheduler.server.auth import Principal, TenantRateLimiter
from scheduler.server.metrics import Sample
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import stop_task

log = logging.getLogger(__name__)


def bucket_key(tenant: str) -> str:
    """The store key of a tenant's shared bucket (relative: the store adds its namespace)."""
    return f"ratelimit:{tenant}"


@dataclass
class SharedRateLimiter:
    store: StateStore
    local: TenantRateLimiter = field(default_factory=TenantRateLimiter)
    lease_s: float = 0.1
    purse_ttl_s: float = 1.0
    store_timeout_s: float = 0.5
    retry_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    # False while the store is unreachable and the per-process bucket decides.
    shared: bool = field(default=True, init=False)
    fallbacks: int = field(default=0, init=False)
    _purses: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _leased_at: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _refilling: set[str] = field(default_factory=set, init=False, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    _next_probe: float = field(default=0.0, init=False, repr=False)

    def _rate(self, principal: Principal) -> tuple[float, float, int]:
        """(rate per s, bucket capacity, lease size) for the principal's tenant."""
        rate = principal.rate_limit_rps or self.local.default_rps
        capacity = max(1.0, rate * self.local.burst_s)
        return rate, capacity, max(1, min(math.floor(capacity), math.ceil(rate * self.lease_s)))

    async def check(self, principal: Principal) -> None:
        """Take one token for the tenant, or raise ``RateLimited`` with when to retry."""
        if not self.shared:
            self._probe_when_due(principal)
            self.local.check(principal)
            return
        tenant = principal.tenant
        rate, _, lease = self._rate(principal)
        now = self.clock()
        if now - self._leased_at.get(tenant, now) > self.purse_ttl_s:
            self._purses.pop(tenant, None)
        if self._purses.get(tenant, 0.0) < 1.0:
            taken = await self._lease(principal)
            if taken is None:
                self.local.check(principal)
                return
            if self._purses.get(tenant, 0.0) < 1.0:
                raise errors.RateLimited(tenant, rate, retry_after_s=max(0.0, 1.0 - taken[1]) / rate)
        self._purses[tenant] -= 1.0
        if self._purses[tenant] < lease / 2 and tenant not in self._refilling:
            self._refilling.add(tenant)
            self._spawn(self._refill(principal))

    async def _lease(self, principal: Principal) -> tuple[int, float] | None:
        """Lease tokens into the tenant's purse; None (and fall back) if the store is unreachable."""
        rate, capacity, lease = self._rate(principal)
        try:
            granted, left = await asyncio.wait_for(
                self.store.take_tokens(bucket_key(principal.tenant), lease, rate, capacity), self.store_timeout_s)
        except (StateUnavailable, TimeoutError) as exc:
            self._fall_back(exc)
            return None
        if granted:
            self._purses[principal.tenant] = self._purses.get(principal.tenant, 0.0) + granted
            self._leased_at[principal.tenant] = self.clock()
        return granted, left

    async def _refill(self, principal: Principal) -> None:
        try:
            await self._lease(principal)
        finally:
            self._refilling.discard(principal.tenant)

    def _fall_back(self, exc: BaseException) -> None:
        self.fallbacks += 1
        self._next_probe = self.clock() + self.retry_s
        if self.shared:
            self.shared = False
            log.warning("rate limits: the state store is unreachable (%s); each router now limits "
                        "tenants on its own (a tenant may get N routers times its rate) until it answers",
                        exc or type(exc).__name__)

    def _probe_when_due(self, principal: Principal) -> None:
        if self.clock() < self._next_probe or principal.tenant in self._refilling:
            return
        self._next_probe = self.clock() + self.retry_s
        self._refilling.add(principal.tenant)
        self._spawn(self._probe(principal))

    async def _probe(self, principal: Principal) -> None:
        rate, capacity, _ = self._rate(principal)
        try:
            await asyncio.wait_for(self.store.take_tokens(bucket_key(principal.tenant), 0, rate, capacity),
                                   self.store_timeout_s)
        except (StateUnavailable, TimeoutError) as exc:
            self._fall_back(exc)
        else:
            self.shared = True
            log.warning("rate limits: the state store answers again; tenants' rates are shared by all routers")
        finally:
            self._refilling.discard(principal.tenant)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def samples(self) -> Iterable[Sample]:
        yield ("scheduler_rate_limit_shared", {}, float(self.shared))
        yield ("scheduler_rate_limit_store_fallbacks_total", {}, float(self.fallbacks))

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for task in list(self._tasks):
            await stop_task(task)
