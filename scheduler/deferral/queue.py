"""The durable deferral queue: held requests in the shared store (Redis in production), so
that none is lost when a router restarts, and any router of the fleet can release them.

A request is named by its tenant and its id: another tenant's request with the same id is
another request. Keys (relative; the store prefixes ``sched:{namespace}:``; ``{t}`` is the
tenant, URL-quoted, ``{id}`` the request id):

    deferred_submission:{t}:{id}  the ``DeferResponse`` it was answered (a retry gets it again);
                          as long as the request, then as long as its answer (a cancellation
                          drops it)
    deferred:{t}:{id}     the held request's record (``HeldRequest`` as JSON, no payload);
                          until it is answered, at most ``grace_s`` past its deadline
    deferred_payload:{t}:{id}  the request as the router will send it (opaque bytes, the prompt
                          with it); read only by the router that claimed its release
    deferred_claim:{t}:{id}   the router releasing it (``claim_ttl_s``, renewed while it runs)
    deferred_result:{t}:{id}  its answer (``result_ttl_s``), or its cancellation (``CANCELLED_TTL_S``)
    deferred_due:{t}      the tenant's held requests by release time (sorted set)
    deferred_kept:{t}     the tenant's kept answers by expiry (sorted set)
    deferred_sizes:{t}    the bytes each of the tenant's requests keeps in the store (sorted set)
    deferred_tenants      tenants by their earliest due release (sorted set; +inf: answers only)
    deferred_bytes        tenants by the bytes they keep (sorted set)

Every write goes through one of the atomic operations of ``scheduler.deferral.ops`` (a Redis
script; the same steps on the in-process store), so the indexes always describe what is
stored, and the caps are checked against them: a tenant holds at most ``max_held`` requests
and keeps at most ``max_bytes`` (held requests and kept answers, each value plus
``KEY_OVERHEAD_BYTES`` per key); beyond, ``submit`` answers ``OverCap`` and stores nothing.

Nothing here lists keys: the release loop reads the tenants whose earliest release is due
(``ZRANGEBYSCORE``, at most ``max_tenants``), claims one request of a tenant at a time (the
claim moves its score to the end of a lease: another router's claim skips it, and a router
that dies lets the lease lapse: at least once, never lost) and reads a payload only after
claiming it. What one pass holds in memory is bounded by the number of runs it starts.

``DeferralWorker`` is the release loop: round-robin over the due tenants, one request per
tenant per round, each admitted by a ``Gate`` (the router's: the tenant's rate limit and
stream cap), up to ``max_running`` at once; when to release is decided once, at hold time, by
``scheduler.deferral.window.choose_release``; an operator can release one early
(``release_now``) or purge a tenant's (``purge_tenant``) or what expired (``purge_expired``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import quote

from scheduler.deferral import ops
from scheduler.state.store import Atomic, AtomicArg, StateStore

log = logging.getLogger(__name__)

OPERATOR = "operator"  # the release reason of ``release_now``

# A held request's state, as ``status`` reads it.
HELD, RUNNING, DONE, UNKNOWN = "held", "running", "done", "unknown"

TENANTS = "deferred_tenants"
USAGE = "deferred_bytes"
# What a key costs Redis beyond its value (its name, the dict entry, the expiry entry, its
# entries in the indexes: about 130 bytes each), counted against the tenant's bytes with each
# value. Measured (MEMORY USAGE, Redis 7.0): a held 1 KiB prompt's three keys and two index
# entries take 2,980 bytes, counted 2,901; an answer 4,764, counted 4,294 (the allocator's size
# classes).
KEY_OVERHEAD_BYTES = 300
# Expired answers a submission drops from its tenant's indexes at most, and lapsed holds a claim
# drops at most: the work of one call stays bounded whatever was left behind.
EXPIRED_PER_HOLD = 100
LAPSED_PER_CLAIM = 100
# Ids one operator read or purge call handles at a time.
PAGE = 500
# A cancellation is kept this long (at most ``result_ttl_s``): what a late retry of the cancelled
# submission gets instead of holding it again; a client retries within seconds or minutes.
CANCELLED_TTL_S = 900.0

# The per-request keys' prefixes, in the order the atomic operations take them.
_ITEM_PREFIXES = ("deferred_submission", "deferred", "deferred_payload", "deferred_claim", "deferred_result")


def _quoted(tenant: str) -> str:
    return quote(tenant, safe="")


def _item_key(prefix: str, tenant: str, request_id: str) -> str:
    return f"{prefix}:{_quoted(tenant)}:{request_id}"


def submission_key(tenant: str, request_id: str) -> str:
    return _item_key("deferred_submission", tenant, request_id)


def held_key(tenant: str, request_id: str) -> str:
    return _item_key("deferred", tenant, request_id)


def payload_key(tenant: str, request_id: str) -> str:
    return _item_key("deferred_payload", tenant, request_id)


def claim_key(tenant: str, request_id: str) -> str:
    return _item_key("deferred_claim", tenant, request_id)


def result_key(tenant: str, request_id: str) -> str:
    return _item_key("deferred_result", tenant, request_id)


def due_key(tenant: str) -> str:
    return f"deferred_due:{_quoted(tenant)}"


def kept_key(tenant: str) -> str:
    return f"deferred_kept:{_quoted(tenant)}"


def sizes_key(tenant: str) -> str:
    return f"deferred_sizes:{_quoted(tenant)}"


def _pages(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[start:start + PAGE] for start in range(0, len(ids), PAGE)]


def _tenant_keys(tenant: str) -> list[str]:
    return [due_key(tenant), kept_key(tenant), sizes_key(tenant), TENANTS, USAGE]


def _tenant_args(tenant: str, index_ms: int) -> list[AtomicArg]:
    return [tenant, index_ms, *(f"{prefix}:{_quoted(tenant)}:" for prefix in _ITEM_PREFIXES)]


@dataclass(frozen=True)
class HeldRequest:
    """A deferrable request waiting for its release."""

    request_id: str
    tenant: str
    enqueued_at: float
    deadline: float
    release_at: float
    # ``scheduler.deferral.window`` reason (window, now, deadline, no-forecast) or "operator".
    reason: str
    # One line for the decision and the receipt (``Release.describe()``).
    detail: str
    # The region ranked first at hold time, whose forecast chose the release.
    region: str = ""
    forecast_value: float | None = None
    now_value: float | None = None
    # The request as the router will send it (opaque to the queue; stored under its own key and
    # read only by the router that claimed the release: empty in what listings read).
    payload: bytes = field(default=b"", repr=False)

    def to_json(self) -> bytes:
        body: dict[str, Any] = asdict(self)
        del body["payload"]
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> HeldRequest:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Submitted:
    """The submission of the request's id that stands: this one, just held (``ack`` is the one
    given), or an earlier one (a retry: its ``ack``)."""

    ack: bytes


@dataclass(frozen=True)
class Cancelled:
    """The tenant cancelled its request with this id (``cancellation``: what ``cancel`` kept);
    nothing was held again."""

    cancellation: bytes


@dataclass(frozen=True)
class OverCap:
    """Refused: holding it would take the tenant past ``cap`` (``max_held`` requests or
    ``max_bytes``); nothing was stored."""

    cap: str
    limit: int
    held: int  # requests the tenant holds now
    held_bytes: int  # bytes its held requests and kept answers take now
    needs_bytes: int  # bytes this one would take


class DeferralQueue:
    """The queue over ``store``. A deadline may be at most ``max_deferral_s`` ahead; a held
    request is kept until ``grace_s`` past its deadline, an answer ``result_ttl_s``; the indexes
    as long as the longest of these. ``speed``: clock seconds per second of the store's TTLs
    (a fast-forwarded soak's clock; 1 otherwise), so a TTL expires when the clock says it should."""

    def __init__(self, store: StateStore, *, claim_ttl_s: float = 600.0, result_ttl_s: float = 86400.0,
                 grace_s: float = 900.0, max_deferral_s: float = 7 * 86400.0, max_held: int = 10_000,
                 max_bytes: int = 128 * 2**20, clock: Callable[[], float] = time.time, speed: float = 1.0) -> None:
        self.store = store
        self.claim_ttl_s = claim_ttl_s
        self.result_ttl_s = result_ttl_s
        self.grace_s = grace_s
        self.max_deferral_s = max_deferral_s
        self.max_held = max_held
        self.max_bytes = max_bytes
        self.clock = clock
        self.speed = speed
        self._index_ms = self.store_ms(max(max_deferral_s + grace_s, result_ttl_s, claim_ttl_s))

    def store_ms(self, seconds: float) -> int:
        """A TTL of ``seconds`` on the clock, in the store's milliseconds."""
        return max(1, round(seconds / self.speed * 1000.0))

    def _hold_ms(self, item: HeldRequest, now: float) -> int:
        """A held request is kept until its deadline, and ``grace_s`` more for a late release to
        be answered as failed; by then it ran, or no router ran for that long."""
        return self.store_ms(max(0.0, item.deadline - now) + self.grace_s)

    async def _atomic(self, op: Atomic, tenant: str, *args: AtomicArg) -> Any:
        return await self.store.run_atomic(op, _tenant_keys(tenant), [*_tenant_args(tenant, self._index_ms), *args])

    # --- submit ---------------------------------------------------------------------------------

    async def submit(self, item: HeldRequest, ack: bytes) -> Submitted | Cancelled | OverCap:
        """Hold ``item`` (its record, its payload, ``ack`` as its submission's answer) unless its
        tenant already submitted its id (held or answered: that submission stands; cancelled:
        it stays so) or holding it would pass a cap. Raises what the store raises: the caller
        must not acknowledge then."""
        now = self.clock()
        if item.deadline > now + self.max_deferral_s:
            raise ValueError(f"deferred request {item.request_id!r}: its deadline is more than "
                             f"{self.max_deferral_s:g} s ahead")
        record = item.to_json()
        # A tenant past its caps (a flood) is refused on a small read: its payload never travels.
        room = await self._atomic(ops.ROOM, item.tenant, item.request_id, repr(now), EXPIRED_PER_HOLD)
        held, used, submitted = int(room[0]), int(float(room[1])), bool(room[2])
        needs = len(ack) + len(record) + len(item.payload) + 3 * KEY_OVERHEAD_BYTES
        if not submitted and held >= self.max_held:
            return OverCap("max_held", self.max_held, held, used, needs)
        if not submitted and used + needs > self.max_bytes:
            return OverCap("max_bytes", self.max_bytes, held, used, needs)
        answer = await self._atomic(
            ops.HOLD, item.tenant, item.request_id, repr(now), repr(item.release_at), self._hold_ms(item, now), ack,
            record, item.payload, self.max_held, self.max_bytes, KEY_OVERHEAD_BYTES, EXPIRED_PER_HOLD)
        kind = answer[0]
        if kind in (ops.HELD, ops.RETRY):
            return Submitted(answer[1])
        if kind == ops.CANCELLED:
            return Cancelled(answer[1])
        held, used, needs = int(answer[1]), int(float(answer[2])), int(float(answer[3]))
        if kind == ops.OVER_COUNT:
            return OverCap("max_held", self.max_held, held, used, needs)
        return OverCap("max_bytes", self.max_bytes, held, used, needs)

    async def submission(self, tenant: str, request_id: str) -> bytes | None:
        """The answer of the tenant's submission of ``request_id`` that stands (None: none)."""
        return await self.store.get(submission_key(tenant, request_id))

    # --- read -----------------------------------------------------------------------------------

    async def get(self, tenant: str, request_id: str) -> HeldRequest | None:
        """The held request's record, without its payload (None: not held)."""
        raw = await self.store.get(held_key(tenant, request_id))
        return None if raw is None else HeldRequest.from_json(raw)

    async def fetch(self, tenant: str, request_id: str) -> HeldRequest | None:
        """The held request with its payload (the release reads it after claiming it)."""
        raw, payload = await self.store.mget([held_key(tenant, request_id), payload_key(tenant, request_id)])
        if raw is None or payload is None:
            return None
        return replace(HeldRequest.from_json(raw), payload=payload)

    async def answer(self, tenant: str, request_id: str) -> bytes | None:
        return await self.store.get(result_key(tenant, request_id))

    async def status(self, tenant: str, request_id: str) -> str:
        answer, held, claim = await self.store.mget([result_key(tenant, request_id), held_key(tenant, request_id),
                                                     claim_key(tenant, request_id)])
        if answer is not None:
            return DONE
        if held is None:
            return UNKNOWN
        return RUNNING if claim is not None else HELD

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(requests the tenant holds, bytes its held requests and kept answers take)."""
        return await self.store.zcard(due_key(tenant)), int(await self.store.zscore(USAGE, tenant) or 0)

    async def tenants(self) -> list[str]:
        """Every tenant with held requests or kept answers."""
        return [tenant for tenant, _ in await self.store.zrange_by_score(TENANTS)]

    async def held(self, tenant: str | None = None) -> list[HeldRequest]:
        """Every held request (or ``tenant``'s), by release time: an operator's listing, read
        from the indexes a page at a time, records without payloads."""
        items = []
        for name in [tenant] if tenant is not None else await self.tenants():
            ids = [request_id for request_id, _ in await self.store.zrange_by_score(due_key(name))]
            for page in _pages(ids):
                for raw in await self.store.mget([held_key(name, request_id) for request_id in page]):
                    if raw is not None:  # None: answered (or lapsed) between the two reads
                        items.append(HeldRequest.from_json(raw))
        return sorted(items, key=lambda i: (i.release_at, i.enqueued_at, i.tenant, i.request_id))

    async def due(self, now: float | None = None) -> list[HeldRequest]:
        """The held requests whose release time has come (an operator's view)."""
        t = self.clock() if now is None else now
        return [item for item in await self.held() if item.release_at <= t]

    async def due_tenants(self, limit: int) -> list[str]:
        """Up to ``limit`` tenants with a request due now, the longest due first."""
        return [tenant for tenant, _ in await self.store.zrange_by_score(TENANTS, high=self.clock(), count=limit)]

    # --- release ----------------------------------------------------------------------------------

    async def claim(self, tenant: str, owner: str) -> HeldRequest | None:
        """Take the release of the tenant's longest due request, with its payload; None when none
        is due (or it was cancelled as it was claimed)."""
        now = self.clock()
        claimed = await self._atomic(ops.CLAIM, tenant, repr(now), repr(now + self.claim_ttl_s),
                                     self.store_ms(self.claim_ttl_s), owner, LAPSED_PER_CLAIM)
        return None if claimed is None else await self.fetch(tenant, claimed.decode())

    async def renew(self, item: HeldRequest, owner: str) -> bool:
        """Extend ``owner``'s claim by ``claim_ttl_s`` (a run in progress); False when the claim
        is another router's now (it lapsed: both run it, at least once) or gone."""
        now = self.clock()
        renewed = await self._atomic(ops.RENEW, item.tenant, item.request_id, owner, repr(now + self.claim_ttl_s),
                                     self.store_ms(self.claim_ttl_s))
        return bool(renewed)

    async def unclaim(self, item: HeldRequest, owner: str, due_at: float) -> None:
        """Give the release back, due again at ``due_at`` (a failed run: retried then)."""
        await self._atomic(ops.GIVE_BACK, item.tenant, item.request_id, owner, repr(due_at))

    async def finish(self, item: HeldRequest, answer: bytes) -> bool:
        """Store the answer for ``result_ttl_s`` and drop the held request, its payload and its
        claim, at once. False: it is no longer held (cancelled, or it lapsed): the answer is
        not kept."""
        return await self._keep(item.tenant, item.request_id, answer, self.result_ttl_s, answering=True) is not None

    async def cancel(self, tenant: str, request_id: str, cancellation: bytes) -> str | None:
        """Drop the request (its record, payload, claim, submission, answer) and keep
        ``cancellation`` in its answer's place for ``CANCELLED_TTL_S`` (at most ``result_ttl_s``):
        a retry of the id gets it, nothing runs again. Its state before (held, running,
        answered, submitted), or None: unknown."""
        ttl_s = min(CANCELLED_TTL_S, self.result_ttl_s)
        was = await self._keep(tenant, request_id, cancellation, ttl_s, answering=False)
        return None if was is None else str(was.decode())

    async def _keep(self, tenant: str, request_id: str, answer: bytes, ttl_s: float, answering: bool) -> bytes | None:
        now = self.clock()
        was: bytes | None = await self._atomic(
            ops.ANSWER, tenant, request_id, answer, self.store_ms(ttl_s), repr(now + ttl_s), KEY_OVERHEAD_BYTES,
            1 if answering else 0)
        return was

    # --- operators ---------------------------------------------------------------------------------

    async def release_now(self, tenant: str, request_id: str, reason: str = OPERATOR) -> HeldRequest | None:
        """Move a held request's release to now (None: no such request is held)."""
        item = await self.get(tenant, request_id)
        if item is None:
            return None
        now = self.clock()
        moved = replace(item, release_at=min(item.release_at, now), reason=reason,
                        detail=f"released early ({reason}); was: {item.detail}")
        done = await self._atomic(ops.RELEASE_NOW, tenant, request_id, repr(now), moved.to_json(),
                                  self._hold_ms(moved, now))
        return moved if done else None

    async def purge(self, tenant: str, request_ids: Sequence[str]) -> int:
        """Delete every key of these requests of ``tenant`` (held, answered or cancelled)."""
        purged = 0
        for page in _pages(request_ids):
            purged += int(await self._atomic(ops.PURGE, tenant, *page))
        return purged

    async def purge_tenant(self, tenant: str) -> int:
        """Delete everything the tenant's deferrals keep: held requests, answers, cancellations."""
        purged = 0
        while True:
            ids = {request_id for key in (due_key(tenant), kept_key(tenant))
                   for request_id, _ in await self.store.zrange_by_score(key, count=PAGE)}
            if not ids:
                return purged
            purged += await self.purge(tenant, sorted(ids))

    async def purge_expired(self) -> int:
        """Delete, for every tenant, the held requests past their deadline (or whose record
        lapsed) and the kept answers past their time: what no release or fetch will need."""
        now = self.clock()
        purged = 0
        for tenant in await self.tenants():
            late = [request_id for request_id, _ in await self.store.zrange_by_score(kept_key(tenant), high=now)]
            due = [request_id for request_id, _ in await self.store.zrange_by_score(due_key(tenant), high=now)]
            for page in _pages(due):
                records = await self.store.mget([held_key(tenant, request_id) for request_id in page])
                late += [request_id for request_id, raw in zip(page, records, strict=True)
                         if raw is None or HeldRequest.from_json(raw).deadline < now]
            purged += await self.purge(tenant, late)
        return purged


class Gate(Protocol):
    """Whether a tenant may start one more release now (the router's: its rate limit and its
    stream cap, as live traffic); ``leave`` when that release ends."""

    async def enter(self, tenant: str) -> bool: ...

    def leave(self, tenant: str) -> None: ...


class OpenGate:
    """Every release may start (a queue without the router's limits)."""

    async def enter(self, tenant: str) -> bool:
        return True

    def leave(self, tenant: str) -> None:
        return None


class DeferralWorker:
    """The release loop: each pass, claim due requests round-robin over their tenants, run them
    and store their answers.

    A pass reads up to ``max_tenants`` tenants with a request due, puts the ones this worker
    served longest ago first, and takes one request of each in turn (admitted by ``gate``)
    until ``max_running`` run here at once or none is left: a tenant with a thousand due
    requests gets one per round like a tenant with one, so it cannot push another's release
    back by more than one round.

    ``run(item)`` returns the answer's bytes. When it raises, the claim is given back, due again
    at the next pass; when the next pass would come after the deadline, ``give_up(item,
    error)`` makes the answer (e.g. a failure status) and the request is finished with it.
    While a request runs its claim is renewed every third of ``claim_ttl_s``, so a run may
    outlast the claim's TTL and a router that dies lets its claims lapse within that TTL.
    ``run_forever`` passes every ``interval_s`` and when a run ends; when ``stop`` is set it
    cancels the runs in progress, which give their claims back (another router, or this one
    restarted, runs them again).
    """

    def __init__(self, queue: DeferralQueue, run: Callable[[HeldRequest], Awaitable[bytes]], owner: str,
                 give_up: Callable[[HeldRequest, BaseException], bytes], interval_s: float = 1.0,
                 max_running: int = 1, gate: Gate | None = None, max_tenants: int = 1024) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        self.queue = queue
        self.run = run
        self.owner = owner
        self.give_up = give_up
        self.interval_s = interval_s
        self.max_running = max_running
        self.gate: Gate = gate if gate is not None else OpenGate()
        self.max_tenants = max_tenants
        # (tenant, request id) -> its run in progress here (True once answered).
        self._running: dict[tuple[str, str], asyncio.Task[bool]] = {}
        # The turn each tenant with due requests was last served in (round-robin order).
        self._served: dict[str, int] = {}
        self._turns = itertools.count()
        # Set when a run ends: the loop passes again at once (a slot is free).
        self._freed = asyncio.Event()

    @property
    def running(self) -> int:
        return len(self._running)

    async def tick(self) -> int:
        """Pass until nothing more starts, waiting for each pass's runs; the number answered."""
        answered = 0
        while started := await self._start_due():
            answered += sum(await asyncio.gather(*started))
        return answered

    async def _start_due(self) -> list[asyncio.Task[bool]]:
        """Claim and start due requests, one per tenant per round, up to the limit."""
        free = self.max_running - len(self._running)
        if free <= 0:
            return []
        due = await self.queue.due_tenants(self.max_tenants)
        # Served longest ago (or never) first; a stable sort keeps the longest due first among equals.
        self._served = {tenant: self._served[tenant] for tenant in due if tenant in self._served}
        turn = sorted(due, key=lambda tenant: self._served.get(tenant, -1))
        started: list[asyncio.Task[bool]] = []
        while turn and free > 0:
            again = []
            for tenant in turn:
                if free == 0:
                    break
                if not await self.gate.enter(tenant):
                    continue
                item = await self.queue.claim(tenant, self.owner)
                if item is None or (tenant, item.request_id) in self._running:
                    self.gate.leave(tenant)
                    continue
                self._served[tenant] = next(self._turns)
                task = asyncio.create_task(self._release(item), name=f"deferred {item.request_id}")
                self._running[(tenant, item.request_id)] = task
                started.append(task)
                free -= 1
                again.append(tenant)
            turn = again
        return started

    async def _keep_claim(self, item: HeldRequest) -> None:
        while True:
            await asyncio.sleep(self.queue.claim_ttl_s / self.queue.speed / 3.0)
            try:
                if not await self.queue.renew(item, self.owner):
                    log.warning("deferred request %s (%s): its claim lapsed mid-run; another router may run it too",
                                item.request_id, item.tenant)
                    return
            except Exception as exc:  # the store may be down: try again, the claim may still hold
                log.warning("deferred request %s: renewing its claim failed (%s)", item.request_id, exc)

    async def _release(self, item: HeldRequest) -> bool:
        """Run one claimed request and finish it (True), or give its claim back (False)."""
        try:
            return await self._run_claimed(item)
        finally:
            self._running.pop((item.tenant, item.request_id), None)
            self.gate.leave(item.tenant)
            self._freed.set()

    async def _run_claimed(self, item: HeldRequest) -> bool:
        heartbeat = asyncio.create_task(self._keep_claim(item))
        failure: Exception | None = None
        try:
            answer = await self.run(item)
        except asyncio.CancelledError:
            await _stopped(heartbeat)
            with contextlib.suppress(Exception):
                await self.queue.unclaim(item, self.owner, self.queue.clock())
            raise
        except Exception as exc:  # any failure of a run: retry or give up, never drop
            failure = exc
        # Stopped before the claim is dropped, so that it cannot set the claim again.
        await _stopped(heartbeat)
        try:
            if failure is not None:
                # Retried while the next pass is before the deadline; else answered with this
                # failure (what kept it from running), not with the deadline passing.
                retry_at = self.queue.clock() + self.interval_s
                if retry_at < item.deadline:
                    log.warning("deferred request %s: release failed (%s); retrying", item.request_id, failure)
                    await self.queue.unclaim(item, self.owner, retry_at)
                    return False
                answer = self.give_up(item, failure)
            if not await self.queue.finish(item, answer):
                log.info("deferred request %s (%s) was cancelled while it ran: its answer is not kept",
                         item.request_id, item.tenant)
        except Exception as exc:  # the store is down: the claim lapses, the request runs again
            log.warning("deferred request %s: storing its outcome failed (%s); it will run again", item.request_id, exc)
            return False
        return True

    async def run_forever(self, stop: asyncio.Event) -> None:
        failing = False  # logged once per outage, not every pass
        try:
            while not stop.is_set():
                self._freed.clear()
                try:
                    await self._start_due()
                    if failing:
                        log.warning("deferral queue: reading the store works again")
                    failing = False
                except Exception as exc:  # the store may be down: keep the loop
                    if not failing:
                        log.warning("deferral queue: reading the store failed (%s); retrying every %g s",
                                    exc, self.interval_s)
                    failing = True
                await _first_of(stop, self._freed, self.interval_s)
        finally:
            runs = list(self._running.values())
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)


async def _first_of(stop: asyncio.Event, freed: asyncio.Event, timeout_s: float) -> None:
    """Wait until either event is set, at most ``timeout_s``."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(freed.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
