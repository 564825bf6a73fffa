"""Booking the receipts regions write for their dispatches.

In direct mode the client streams from the region, so no router sees the answer; in proxy
mode the router that relayed the stream may have died, or seen it cut before the region's
usage came. So the region signs a receipt of every dispatch with a ticket, on its engine's
counts (``scheduler.signed_region_receipt``), and appends it to the store's ``receipts`` stream.
One router at a time (the store lock ``region-receipts``; another takes over within the
lock's TTL when it dies) reads the stream after the cursor it keeps in the store, verifies
each entry with the region's ticket key, and hands the receipt to the same audit log and
receipt sinks (the ledger) as a proxied stream's receipt: budgets and audit behave alike in
both modes. The ledger keeps one entry per (decision, region, pool), so a proxied stream's
two receipts are one entry, on the engine's counts. An entry that fails verification is
logged and counted, never booked.

Booking a receipt only queues it (the ledger and the audit write in the background), so the
cursor moves past a batch only once ``written`` says the ledger and the audit hold it: a
router that dies, SIGKILLed or not, before they wrote it leaves the cursor where it was, and
the next holder books that batch again (each receipt counts once: the ledger keeps one entry
per (decision, region, pool), the audit one entry). Delivery is at least once.

The same stream carries each pool's idle energy per billing window (claims with ``kind``
"idle", ``scheduler.ledger.idle``), signed alike: those go to ``book_idle``, which shares them
among the tenants that used the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scheduler.ledger.idle import KIND as IDLE_KIND
from scheduler.ledger.idle import IdleWindow
from scheduler.signed_region_receipt import STREAM, RegionReceipt, verify_receipt
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import start_loop, stop_task
from scheduler.tickets import TicketKeyRing, TicketKeysError, TicketRejected
from scheduler.types import EnergyReceipt

log = logging.getLogger(__name__)

LOCK = "region-receipts"
CURSOR = "receipts:cursor"


async def _at_once() -> bool:
    return True


def _unbooked(window: IdleWindow) -> None:
    log.warning("region %s pool %s: an idle-energy record, and no ledger to book it", window.region, window.pool)


@dataclass
class RegionReceiptIngest:
    store: StateStore
    keys: TicketKeyRing
    book: Callable[[EnergyReceipt], None]
    # Whether what ``book`` was handed until now is in the store (the router's: it writes the
    # ledger's and the audit's queues); the default is for a ``book`` that writes at once.
    written: Callable[[], Awaitable[bool]] = _at_once
    # Where a pool's idle energy of a billing window goes (the router's ledger).
    book_idle: Callable[[IdleWindow], None] = _unbooked
    interval_s: float = 0.5
    lock_ttl_s: float = 5.0
    batch: int = 500
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    booked: int = field(default=0, init=False)
    rejected: int = field(default=0, init=False)
    # The last entry of a batch booked but not yet written: the cursor waits for it.
    _unwritten: str | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def ingest_once(self) -> int:
        """Book what the stream holds after the cursor, if this router holds the lock and
        wrote the last batch it booked; the number of entries read."""
        if not await self.store.acquire_lock(LOCK, self.owner, self.lock_ttl_s) or not await self._advance():
            return 0
        cursor_raw = await self.store.get(CURSOR)
        cursor = cursor_raw.decode() if cursor_raw else None
        entries = await self.store.xrange(STREAM, self.batch, after=cursor)
        for entry_id, fields in entries:
            try:
                keys = self.keys.of(fields.get("region", ""))
                claims = verify_receipt(keys, fields)
                if claims.get("kind") == IDLE_KIND:
                    self.book_idle(IdleWindow.from_claims(claims))
                else:
                    self.book(RegionReceipt(claims).energy_receipt())
            except (TicketKeysError, TicketRejected, ValueError) as exc:
                self.rejected += 1
                log.error("region receipt %s rejected, not booked: %s", entry_id, exc)
                continue
            self.booked += 1
        if entries:
            self._unwritten = entries[-1][0]
            await self._advance()
        return len(entries)

    async def _advance(self) -> bool:
        """Move the cursor past the booked batch once it is written; False while it is not."""
        if self._unwritten is None:
            return True
        if not await self.written():
            return False
        await self.store.set(CURSOR, self._unwritten.encode())
        self._unwritten = None
        return True

    async def _run(self) -> None:
        while True:
            try:
                read = await self.ingest_once()
            except StateUnavailable as exc:
                log.warning("region receipts: store unavailable (%s); retrying", exc)
                read = 0
            except Exception:
                log.exception("region receipts: ingest failed; retrying")
                read = 0
            if read < self.batch:
                await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        self._task = start_loop(self._run, "region-receipts")

    async def stop(self) -> None:
        await stop_task(self._task)
        # Book what arrived until now, so a clean shutdown leaves nothing for the next holder
        # (a batch the store did not take stays behind the cursor for it).
        with contextlib.suppress(StateUnavailable):
            while await self.ingest_once() == self.batch:
                pass
            await self.store.release_lock(LOCK, self.owner)
