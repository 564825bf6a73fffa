"""The router's parts as its servicers and handlers take them: one Protocol per concern, so that
each module depends on the parts it uses, never on the assembly of them all
(``scheduler.server.app.RouterDeps``, which satisfies every one) and never on the modules that
assemble it (an import circle: app imports the servicers, which would import app back).

    Deciding       the current snapshot, the scheduler and the canary beside it
    Dispatching    admitting a decided request, sending it to a region or signing its tickets
    Booking        where a receipt goes (audit, metrics, the ledger)
    TenantLimits   who a caller is and what it may hold (keys, shared rate, stream slots)
    SharedState    the store the routers share, and the wall clock its records are stamped by
    Proxying       all three of the first: what ``scheduler.server.core.RouterCore`` takes

A module with a part of its own (the deferral queue, the config reloader) adds it in a Protocol
of its own, built from these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from scheduler.canary.runtime import CanaryRuntime
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.framework.scheduler import Scheduler
from scheduler.server.auth import KeyRing
from scheduler.server.dispatch import RegionDispatcher
from scheduler.server.issuer import TicketIssuer
from scheduler.server.metrics import RouterMetrics
from scheduler.server.rate_limit import SharedRateLimiter
from scheduler.server.stream_slots import StreamSlots
from scheduler.state.store import StateStore
from scheduler.types import EnergyReceipt, Request


class Deciding(Protocol):
    refresher: SnapshotRefresher
    scheduler: Scheduler
    # The policy's canary (None: no canary support): counts each proxied stream per arm.
    canary: CanaryRuntime | None
    metrics: RouterMetrics

    @property
    def monotonic(self) -> Callable[[], float]: ...


class Dispatching(Protocol):
    dispatcher: RegionDispatcher
    # Signs a dispatch ticket per region (None: regions run without tickets, development only).
    tickets: TicketIssuer | None
    # How many ranked candidates a Route answer carries tickets for (direct mode).
    direct_targets: int
    # Called before a request is dispatched (the tenant's energy budget); may raise a SchedulerError.
    admission: list[Callable[[Request], object]]
    # Streams open on this router now (a stopping router waits for them to book their receipts).
    active_streams: int


class Booking(Protocol):
    def book(self, receipt: EnergyReceipt) -> None:
        """Audit and every receipt sink (the ledger): the end of every answered request."""


class TenantLimits(Protocol):
    # None: no authentication. Replaced when the keys are reloaded: read it per call.
    keys: KeyRing | None
    limiter: SharedRateLimiter
    slots: StreamSlots


class SharedState(Protocol):
    store: StateStore

    @property
    def clock(self) -> Callable[[], float]: ...


class Proxying(Deciding, Dispatching, Booking, Protocol):
    """Deciding a request, dispatching it and booking its receipt."""
