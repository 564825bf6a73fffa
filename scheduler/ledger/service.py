"""The ledger as a router runs it: nothing of it on the request path.

- ``sink(receipt)`` (a router receipt sink) queues the receipt's joules, grams and tokens as the
  entry of its (decision, region, pool); a background task writes them (``Ledger.record``: in
  order, queued while the store is down). A receipt whose tokens a router counted itself
  (``tokens_estimated``) books below one on the engine's counts (``ledger.ROUTER_COUNTED``).
- ``admit(request)`` (a router admission check) compares the tenant's month with its budget
  using usage that the same background task re-reads every ``interval_s``: a hard budget
  holds across routers to within what they spend in one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.ledger.budget import BudgetStatus
from scheduler.ledger.idle import IdleWindow
from scheduler.ledger.ledger import ENGINE_COUNTED, ROUTER_COUNTED, Ledger, LedgerEntry, MonthUsage, month_of
from scheduler.tasks import WRITE_LINGER_S, start_loop, stop_task
from scheduler.types import EnergyReceipt, Request

log = logging.getLogger(__name__)


@dataclass
class LedgerService:
    ledger: Ledger
    interval_s: float = 1.0
    linger_s: float = WRITE_LINGER_S
    clock: Callable[[], float] = time.monotonic
    _refreshed_at: float | None = field(default=None, init=False, repr=False)
    _usage: dict[str, tuple[MonthUsage, bool]] = field(default_factory=dict, init=False, repr=False)
    _inbox: list[LedgerEntry] = field(default_factory=list, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def pending(self) -> int:
        """Receipts not yet in the store (waiting here or in the ledger's outage queue)."""
        return len(self._inbox) + self.ledger.pending

    def sink(self, receipt: EnergyReceipt) -> None:
        self._inbox.append(
            LedgerEntry(
                tenant=receipt.tenant,
                region=receipt.region,
                energy_j=receipt.energy_j or 0.0,
                carbon_g=receipt.carbon_g or 0.0,
                rule_version=receipt.attribution_method,
                at=self.ledger.clock(),
                decision_id=receipt.decision_id,
                pool=receipt.pool,
                prompt_tokens=receipt.prompt_tokens or 0,
                completion_tokens=receipt.completion_tokens or 0,
                counted_by=ROUTER_COUNTED if receipt.tokens_estimated else ENGINE_COUNTED,
            )
        )
        self._wake.set()

    def sink_idle(self, window: IdleWindow) -> None:
        """A pool's idle energy of one billing window, a line per tenant that used the pool."""
        self._inbox.extend(window.entries())
        self._wake.set()

    def admit(self, request: Request) -> BudgetStatus | None:
        """Raises ``BudgetExhausted`` past a hard limit (unless the class is critical)."""
        if request.tenant not in self.ledger.budgets:
            return None
        month = month_of(self.ledger.clock())
        cached = self._usage.get(request.tenant)
        used, stale = cached if cached is not None and cached[0].month == month else (
            MonthUsage(request.tenant, month, 0.0, 0.0, 0.0, {}), True)
        # What this router spent since the last read counts at once.
        energy = used.energy_j + sum(e.energy_j for e in self._inbox if e.tenant == request.tenant)
        carbon = used.carbon_g + sum(e.carbon_g for e in self._inbox if e.tenant == request.tenant)
        current = dataclasses.replace(used, energy_j=energy, carbon_g=carbon)
        return self.ledger.evaluate(current, request.workload_class, stale)

    def budget_samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Gauges of each budgeted tenant's month (as last read from the store, shared by the
        routers) and its limits: ``scheduler_tenant_budget_used{tenant, kind}`` and
        ``scheduler_tenant_budget_limit{tenant, kind, level}``; kind: energy_j | carbon_g."""
        samples: list[tuple[str, dict[str, str], float]] = []
        for tenant, budget in sorted(self.ledger.budgets.items()):
            cached = self._usage.get(tenant)
            if cached is not None:
                used = cached[0]
                samples += [("scheduler_tenant_budget_used", {"tenant": tenant, "kind": "energy_j"}, used.energy_j),
                            ("scheduler_tenant_budget_used", {"tenant": tenant, "kind": "carbon_g"}, used.carbon_g)]
            for kind, level, limit in (("energy_j", "soft", budget.soft_energy_j),
                                       ("energy_j", "hard", budget.hard_energy_j),
                                       ("carbon_g", "soft", budget.soft_carbon_g),
                                       ("carbon_g", "hard", budget.hard_carbon_g)):
                if limit is not None:
                    samples.append(("scheduler_tenant_budget_limit",
                                    {"tenant": tenant, "kind": kind, "level": level}, limit))
        return samples

    async def start(self) -> None:
        await self._refresh()
        self._task = start_loop(self._run, "ledger")

    async def stop(self) -> None:
        await stop_task(self._task)
        await self._drain()
        await self.ledger.flush()
        if self.ledger.pending:
            log.error("ledger: %d receipts could not be written before shutdown", self.ledger.pending)

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that arrives
            # as the wait completes, and this loop then never ends (a router's stop hung on it).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
                    await asyncio.sleep(self.linger_s)
            self._wake.clear()
            try:
                await self._drain()
                # The budgets' usage every interval_s, however many passes the receipts wake.
                now = self.clock()
                if self._refreshed_at is None or now - self._refreshed_at >= self.interval_s:
                    await self._refresh()
                    self._refreshed_at = now
            except Exception:
                log.exception("ledger: background pass failed; retrying")

    async def write(self) -> bool:
        """Write every receipt handed to it until now; True when all of them are in the store."""
        await self._drain()
        return self.ledger.pending == 0

    async def _drain(self) -> None:
        # Every entry moves to the ledger's queue before anything is written: a write that
        # fails (however) leaves them queued there, never dropped with this batch.
        entries, self._inbox = self._inbox, []
        for entry in entries:
            self.ledger.enqueue(entry)
        await self.ledger.flush()

    async def _refresh(self) -> None:
        for tenant in self.ledger.budgets:
            self._usage[tenant] = await self.ledger.usage(tenant)
