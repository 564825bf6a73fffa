"""``Ledger``: each receipt adds joules and gCO2e to its tenant's month in the shared store.

Store format (docs: shared_formats.md): hash ``keys.ledger(tenant, "YYYY-MM")`` with fields
``{region}|{rule_version}|energy_j``, ``...|carbon_g``, ``...|requests``, ``...|prompt_tokens``
and ``...|completion_tokens``, each added with HINCRBYFLOAT, so any number of routers add to
the same hash. The month is the UTC month the receipt is booked in.

One entry per (decision, region, pool): every ticket a decision hands out that reaches an
engine is billed (a direct-mode client may use all the targets of one ``Route``), and a
receipt booked twice (a retry after a lost reply, a direct-mode batch re-read by the next
ingest holder, the router's and the region's receipt of one proxied stream) counts once. The
store's ``ledger_add`` (one Lua script on Redis) writes the entry's fields and remembers them
under ``entry_key(decision, region, pool)`` (kept ``ENTRY_TTL_S``), all or nothing. An entry
resting on the engine's own token counts (``ENGINE_COUNTED``: the region's signed receipt, or
a router's receipt carrying the region's usage) replaces one resting on a router's count
(``ROUTER_COUNTED``: a proxied stream cut before the region's usage came); never the other
way round, and an entry as good as the one booked is not counted again.

Receipts recorded while the store is unreachable or answers errors (OOM, READONLY: all
``StateUnavailable``) wait in a bounded queue, in order, and are written when it returns (the
next ``record`` or ``flush`` after a back-off). When the queue is full, its oldest entries are
folded into per-field sums (memory stays bounded by the number of distinct
tenant/month/region/rule fields; no joule is dropped, but folded sums carry no decision id,
so they are written without an entry key).

``check(tenant, workload_class)`` reads the tenant's month (plus this router's unwritten
queue) and compares it with the tenant's budget: soft -> a warning, counted in
``soft_limit_warnings`` and passed to ``on_soft_limit``; hard -> ``BudgetExhausted`` unless
the workload class is critical. With the store down it uses the last usage it read, plus
the queue, and says so (``stale``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from scheduler.errors import BudgetExhausted
from scheduler.ledger.budget import BudgetStatus, TenantBudget
from scheduler.state import keys
from scheduler.state.store import StateStore, StateUnavailable

log = logging.getLogger(__name__)

FIELDS = ("energy_j", "carbon_g", "requests", "prompt_tokens", "completion_tokens")
# How long a booked entry is remembered: the idempotency window, not the billing month (the
# month's totals live in its hash). A second booking of one (decision, region, pool) comes
# within minutes: a retry after a lost reply, a re-read of the region receipts stream, the
# region's receipt of a proxied stream after the router's; only receipts queued on both sides
# through a store outage longer than this would be booked twice. At 100 requests/s a day of
# entries is ~8.6 M keys (docs/state-keys.md has the measured bytes).
ENTRY_TTL_S = 86400.0
# Whose token counts an entry rests on (the rank ``ledger_add`` compares): a router's own
# count (content events relayed, the prompt's bytes) or the engine's.
ROUTER_COUNTED = 1
ENGINE_COUNTED = 2


def entry_key(decision_id: str, region: str, pool: str) -> str:
    """The ledger entry of one dispatch target: a decision's receipts for one region and pool."""
    return f"ledger_entry:{decision_id}:{region}:{pool}"


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """What the ledger needs from one receipt (never prompt text)."""

    tenant: str
    region: str
    energy_j: float
    carbon_g: float
    rule_version: str
    at: float  # epoch seconds (UTC) of the receipt
    workload_class: str = "interactive"
    decision_id: str = ""
    pool: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted_by: int = ENGINE_COUNTED
    # Requests it counts: 1 for a request's receipt, 0 for a line that bills no request (idle).
    requests: float = 1.0

    @property
    def month(self) -> str:
        return month_of(self.at)

    @property
    def key(self) -> str | None:
        """Its ``entry_key``; None without a decision id (nothing to tell a retry by)."""
        return entry_key(self.decision_id, self.region, self.pool) if self.decision_id else None

    def writes(self) -> tuple[tuple[str, str, float], ...]:
        key, prefix = keys.ledger(self.tenant, self.month), f"{self.region}|{self.rule_version}|"
        return (
            (key, prefix + "energy_j", self.energy_j),
            (key, prefix + "carbon_g", self.carbon_g),
            (key, prefix + "requests", self.requests),
            (key, prefix + "prompt_tokens", float(self.prompt_tokens)),
            (key, prefix + "completion_tokens", float(self.completion_tokens)),
        )


@dataclass(frozen=True, slots=True)
class MonthUsage:
    tenant: str
    month: str
    energy_j: float
    carbon_g: float
    requests: float
    # (region, rule_version) -> {"energy_j": .., "carbon_g": .., "requests": .., "prompt_tokens": .., ...}
    by_region: Mapping[tuple[str, str], Mapping[str, float]]
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0


def month_of(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m")


def parse_month(tenant: str, month: str, fields_: Mapping[str, str]) -> MonthUsage:
    by_region: dict[tuple[str, str], dict[str, float]] = {}
    for name, value in fields_.items():
        region, rule, kind = name.rsplit("|", 2)
        if kind in FIELDS:
            by_region.setdefault((region, rule), {k: 0.0 for k in FIELDS})[kind] = float(value)
    total = {k: sum(v[k] for v in by_region.values()) for k in FIELDS}
    return MonthUsage(tenant, month, total["energy_j"], total["carbon_g"], total["requests"], by_region,
                      total["prompt_tokens"], total["completion_tokens"])


@dataclass
class Ledger:
    store: StateStore
    budgets: Mapping[str, TenantBudget] = field(default_factory=dict)
    critical_workload_classes: Collection[str] = ()
    clock: Callable[[], float] = time.time
    max_pending: int = 100_000
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0
    on_soft_limit: Callable[[BudgetStatus], None] | None = None
    # How long an entry is kept: receipts of one target booked further apart are counted twice.
    entry_ttl_s: float = ENTRY_TTL_S
    soft_limit_warnings: int = field(default=0, init=False)
    _queue: deque[LedgerEntry] = field(default_factory=deque, init=False, repr=False)
    # Oldest entries folded into per-field sums when the queue overflowed: (key, field) -> amount.
    _folded: dict[tuple[str, str], float] = field(default_factory=dict, init=False, repr=False)
    _retry_at: float = field(default=0.0, init=False, repr=False)
    _retry_s: float = field(default=0.0, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _last_usage: dict[tuple[str, str], MonthUsage] = field(default_factory=dict, init=False, repr=False)

    @property
    def pending(self) -> int:
        """Entries (and folded fields) not yet in the store."""
        return len(self._queue) + len(self._folded)

    def enqueue(self, entry: LedgerEntry) -> None:
        """Queue ``entry`` (no I/O); the next ``flush`` writes it."""
        self._queue.append(entry)
        if len(self._queue) > self.max_pending and not self._lock.locked():
            # (While a flush runs it owns the head of the queue; it is draining anyway.)
            self._fold_oldest()

    async def record(self, entry: LedgerEntry) -> bool:
        """Queue ``entry`` and write what the store takes now; True when nothing is left waiting."""
        self.enqueue(entry)
        if self._lock.locked() or self.clock() < self._retry_at:
            return False
        await self.flush()
        return self.pending == 0

    async def flush(self) -> int:
        """Write queued entries in order until the queue is empty or the store fails; the
        number of entries written."""
        async with self._lock:
            written = 0
            try:
                for (key, name), amount in list(self._folded.items()):
                    await self.store.ledger_add(key, {name: amount}, None, self.entry_ttl_s)
                    del self._folded[(key, name)]
                while self._queue:
                    entry = self._queue[0]
                    writes = entry.writes()
                    if not await self.store.ledger_add(writes[0][0], {n: a for _, n, a in writes}, entry.key,
                                                       self.entry_ttl_s, entry.counted_by):
                        log.info("ledger: %s already booked on counts as good; not counted again", entry.key)
                    self._queue.popleft()
                    written += 1
            except StateUnavailable as exc:
                self._retry_s = min(self.retry_max_s, max(self.retry_initial_s, self._retry_s * 2))
                self._retry_at = self.clock() + self._retry_s
                log.warning("ledger: store unavailable (%s); %d entries queued, retry in %.1f s",
                            exc, self.pending, self._retry_s)
                return written
            self._retry_s, self._retry_at = 0.0, 0.0
            return written

    async def usage(self, tenant: str, month: str | None = None) -> tuple[MonthUsage, bool]:
        """The tenant's month as stored plus this ledger's unwritten entries; True if the store
        could not be read (then the last value read is used)."""
        month = month or month_of(self.clock())
        stale = False
        try:
            stored = parse_month(tenant, month, await self.store.hgetall(keys.ledger(tenant, month)))
            self._last_usage[(tenant, month)] = stored
        except StateUnavailable:
            stale = True
            stored = self._last_usage.get((tenant, month)) or parse_month(tenant, month, {})
        energy, carbon = stored.energy_j, stored.carbon_g
        key = keys.ledger(tenant, month)
        for (folded_key, name), amount in self._folded.items():
            if folded_key == key:
                energy += amount if name.endswith("|energy_j") else 0.0
                carbon += amount if name.endswith("|carbon_g") else 0.0
        for entry in self._queue:
            if entry.tenant == tenant and entry.month == month:
                energy, carbon = energy + entry.energy_j, carbon + entry.carbon_g
        return dataclasses.replace(stored, energy_j=energy, carbon_g=carbon), stale

    async def check(self, tenant: str, workload_class: str) -> BudgetStatus:
        """Before dispatch: raise ``BudgetExhausted`` when the tenant is past its hard limit and
        the workload class is not critical; otherwise the status (soft limits warn)."""
        month = month_of(self.clock())
        if tenant not in self.budgets:
            return BudgetStatus(tenant, month, 0.0, 0.0, "ok", "", 0.0, 0.0, False, False)
        used, stale = await self.usage(tenant, month)
        return self.evaluate(used, workload_class, stale)

    def evaluate(self, used: MonthUsage, workload_class: str, stale: bool) -> BudgetStatus:
        """``check`` on usage already read (the router's background-refreshed copy)."""
        tenant, month = used.tenant, used.month
        budget = self.budgets.get(tenant)
        if budget is None:
            return BudgetStatus(tenant, month, used.energy_j, used.carbon_g, "ok", "", 0.0, 0.0, False, stale)
        level, what, amount, limit = budget.level(used.energy_j, used.carbon_g)
        exempt = workload_class in self.critical_workload_classes
        status = BudgetStatus(tenant, month, used.energy_j, used.carbon_g, level, what, amount, limit, exempt, stale)
        if level == "hard" and not exempt:
            raise BudgetExhausted(tenant, month, what, amount, limit)
        if level != "ok":
            self.soft_limit_warnings += 1
            log.warning("tenant %s: %s budget %s reached (%.0f of %.0f)%s", tenant, level, what, amount, limit,
                        f"; {workload_class} is critical, not blocked" if level == "hard" else "")
            if self.on_soft_limit is not None:
                self.on_soft_limit(status)
        return status

    def _fold_oldest(self) -> None:
        if not self._folded:
            log.error("ledger: more than %d receipts queued; folding the oldest into per-field sums",
                      self.max_pending)
        entry = self._queue.popleft()
        for key, name, amount in entry.writes():
            self._folded[(key, name)] = self._folded.get((key, name), 0.0) + amount
