"""The audit trail: one stream entry per answered request, written off the request path.

``record`` only appends to an in-memory queue; a background task ``xadd``s to the store's
audit stream (MAXLEN ~ 100000). While the store is down, entries wait (bounded: beyond
``max_pending`` the oldest are dropped and counted) and are flushed when it is back. The
writer survives any failure (an error answer such as OOM or READONLY included): the entry
stays queued and is retried. Each entry is appended once per (decision id, region, pool)
(``xadd_once``): a write that timed out on our side but reached Redis is not appended again
by the retry.
Fields (shared format): decision_id, tenant, region, pool, energy_j, carbon_g, fallbacks
(JSON), partial ("1" / "0"), end_reason, carbon_basis, config_version (the config the request
was decided on; scheduler.server.config_reload), canary_arm (control | canary; empty without a
canary), released_at and deferral (when the deferral queue released the request and why it
waited; empty when it was not deferred). Never the prompt text. The canary's rollbacks and an admin's enable and disable are
entries of the same stream with an ``event`` field (scheduler.canary.runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from dataclasses import dataclass, field

from scheduler.state import keys
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import WRITE_LINGER_S, start_loop, stop_task
from scheduler.types import EnergyReceipt

log = logging.getLogger(__name__)

AUDIT_MAXLEN = 100_000
# How long an appended entry's marker is kept: far longer than any retry of the same entry.
AUDIT_ONCE_TTL_S = 86_400.0


def audit_fields(receipt: EnergyReceipt) -> dict[str, str]:
    return {
        "decision_id": receipt.decision_id,
        "request_id": receipt.request_id,
        "tenant": receipt.tenant,
        "region": receipt.region,
        "pool": receipt.pool,
        "energy_j": "" if receipt.energy_j is None else repr(receipt.energy_j),
        "carbon_g": "" if receipt.carbon_g is None else repr(receipt.carbon_g),
        "fallbacks": json.dumps(
            [{"signal": f.signal, "scorer": f.scorer, "age_s": f.age_s} for f in receipt.fallbacks]
            + [{"failover": a.region, "pool": a.pool, "error": a.error} for a in receipt.failovers]
        ),
        "partial": "1" if receipt.partial else "0",
        "end_reason": receipt.end_reason,
        "carbon_basis": receipt.carbon_basis,
        "config_version": receipt.config_version,
        "canary_arm": receipt.canary_arm,
        "released_at": "" if receipt.released_at is None else repr(receipt.released_at),
        "deferral": receipt.deferral,
    }


@dataclass
class AuditLog:
    store: StateStore
    max_pending: int = 10_000
    retry_s: float = 1.0
    linger_s: float = WRITE_LINGER_S
    # How long an entry's once-marker is kept (the router's --idempotency-window).
    once_ttl_s: float = AUDIT_ONCE_TTL_S
    dropped: int = field(default=0, init=False)
    written: int = field(default=0, init=False)
    _pending: deque[dict[str, str]] = field(default_factory=deque, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def record(self, receipt: EnergyReceipt) -> None:
        """Queue the receipt's audit entry (no I/O; safe on the request path)."""
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(audit_fields(receipt))
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Write what is queued; on ``StateUnavailable`` leave the rest queued and re-raise. One
        flush at a time (the writer's, a region receipt batch's): each pops what it wrote."""
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        while self._pending:
            entry = self._pending[0]
            # Once per (decision, region, pool), as the ledger books them: an append that timed
            # out on our side may still have landed, and the router's and the region's receipt
            # of one proxied stream are one entry (the first to arrive).
            once = keys.audit_once(f"{entry['decision_id']}:{entry['region']}:{entry['pool']}")
            await self.store.xadd_once(keys.AUDIT, entry, AUDIT_MAXLEN, once, self.once_ttl_s)
            self._pending.popleft()
            self.written += 1

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            # The entries that arrive together are written in one pass (a group commit).
            await asyncio.sleep(self.linger_s)
            self._wake.clear()
            try:
                await self.flush()
            except StateUnavailable as exc:
                log.warning("audit: store unavailable, %d entries queued: %s", len(self._pending), exc)
                await asyncio.sleep(self.retry_s)
                self._wake.set()
            except Exception:
                # Never let one failure end the writer: the entry stays queued and is retried.
                log.exception("audit: write failed, %d entries queued; retrying", len(self._pending))
                await asyncio.sleep(self.retry_s)
                self._wake.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = start_loop(self._run, "audit-writer")

    async def stop(self, flush_timeout_s: float = 2.0) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        with contextlib.suppress(StateUnavailable, TimeoutError):
            async with asyncio.timeout(flush_timeout_s):
                await self.flush()
        if self._pending:
            log.warning("audit: %d entries not written at shutdown", len(self._pending))
