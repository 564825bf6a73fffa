"""The durable deferral queue: held requests in the shared store (Redis in production), so
that none is lost when a router restarts, and any router of the fleet can release them.

Keys (relative; the store prefixes ``sched:{namespace}:``):

    deferred:{id}         the held request (``HeldRequest`` as JSON), written before the client
                          is answered; kept until its answer is stored, at most
                          ``keep_after_deadline_s`` past its deadline (by then it was released
                          long ago, or no router ran for that long)
    deferred_claim:{id}   the router releasing it (SET NX with ``claim_ttl_s``): one router runs
                          it; when that router dies mid-run the claim lapses and another (or the
                          same, restarted) runs it again: at least once, never lost
    deferred_result:{id}  its answer (bytes the caller chose, e.g. a serialized result
                          message), kept ``result_ttl_s`` for the client to fetch
    deferred_submission:{id}  who submitted it and what they were answered (``Submission``),
                          SET NX before the hold: a retried submission gets the first one's
                          answer, and only its tenant sees the request; kept as long as the
                          request and its answer (``_ttl`` + ``result_ttl_s``)

The queue only uses the store's generic verbs (get, mget, set, set_nx, delete, keys), so
``MemoryStore`` and ``RedisStore`` both carry it. ``DeferralWorker`` is the release loop a
router runs: every ``interval_s`` it claims each due request and runs it with the router's own
``run`` callable (up to ``max_running`` at once), renewing the claim while it runs, and stores
the answer. When to release is decided once, at hold time, by
``scheduler.deferral.window.choose_release``; an operator can release one early
(``release_now``, ``scheduler deferred release``).

The request itself is opaque bytes to the queue (the router stores its serialized
``GenerateRequest``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

HELD_PREFIX = "deferred:"
OPERATOR = "operator"  # the release reason of ``release_now``

# A held request's state, as ``status`` reads it.
HELD, RUNNING, DONE, UNKNOWN = "held", "running", "done", "unknown"


class Store(Protocol):
    """The verbs of ``scheduler.state.store.StateStore`` the queue uses."""

    async def get(self, key: str) -> bytes | None: ...

    async def mget(self, keys: list[str]) -> list[bytes | None]: ...

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None: ...

    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool: ...

    async def delete(self, key: str) -> None: ...

    async def keys(self, prefix: str) -> list[str]: ...


def held_key(request_id: str) -> str:
    return f"{HELD_PREFIX}{request_id}"


def claim_key(request_id: str) -> str:
    return f"deferred_claim:{request_id}"


def result_key(request_id: str) -> str:
    return f"deferred_result:{request_id}"


def submission_key(request_id: str) -> str:
    return f"deferred_submission:{request_id}"


@dataclass(frozen=True)
class Submission:
    """The submission of a request id that stands: its tenant and the answer it was given
    (opaque bytes, e.g. the router's serialized ``DeferResponse``)."""

    tenant: str
    ack: bytes

    def to_json(self) -> bytes:
        return json.dumps({"tenant": self.tenant, "ack": base64.b64encode(self.ack).decode("ascii")}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Submission:
        body = json.loads(raw)
        return cls(str(body["tenant"]), base64.b64decode(body["ack"]))


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
    # The request as the router will send it (opaque to the queue).
    payload: bytes = b""

    def to_json(self) -> bytes:
        body: dict[str, Any] = asdict(self)
        body["payload"] = base64.b64encode(self.payload).decode("ascii")
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> HeldRequest:
        body = json.loads(raw)
        body["payload"] = base64.b64decode(body.get("payload", ""))
        return cls(**body)


class DeferralQueue:
    def __init__(self, store: Store, *, claim_ttl_s: float = 600.0, result_ttl_s: float = 7 * 86400.0,
                 keep_after_deadline_s: float = 7 * 86400.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.claim_ttl_s = claim_ttl_s
        self.result_ttl_s = result_ttl_s
        self.keep_after_deadline_s = keep_after_deadline_s
        self.clock = clock

    def _ttl(self, item: HeldRequest) -> float:
        return max(0.0, item.deadline - self.clock()) + self.keep_after_deadline_s

    async def hold(self, item: HeldRequest) -> bool:
        """Store ``item``; False when a request with its id is already held (a retried
        submission: the first one stands). Raises what the store raises (unreachable: the
        caller must not acknowledge the request)."""
        return await self.store.set_nx(held_key(item.request_id), item.to_json(), self._ttl(item))

    async def submit(self, item: HeldRequest, ack: bytes) -> Submission:
        """Hold ``item`` unless its id was submitted before; the submission that stands.

        A first submission: its record (SET NX), then the hold, and ``Submission(item.tenant,
        ack)`` back. A retry (the record exists): the first submission, and the hold again in
        case a crash cut the first one short before it (a no-op while the request is held, none
        once it is answered). Another tenant's id: that tenant's submission, nothing held (the
        caller refuses). Raises what the store raises: the caller must not acknowledge then.
        """
        first = Submission(item.tenant, ack)
        if not await self.store.set_nx(submission_key(item.request_id), first.to_json(),
                                       self._ttl(item) + self.result_ttl_s):
            stored = await self.submission(item.request_id)
            # None: it lapsed between the two reads (days after its answer); this one stands.
            first = stored if stored is not None else first
            if first.tenant != item.tenant:
                return first
        if await self.store.get(result_key(item.request_id)) is None:
            await self.hold(item)
        return first

    async def submission(self, request_id: str) -> Submission | None:
        raw = await self.store.get(submission_key(request_id))
        return None if raw is None else Submission.from_json(raw)

    async def get(self, request_id: str) -> HeldRequest | None:
        raw = await self.store.get(held_key(request_id))
        return None if raw is None else HeldRequest.from_json(raw)

    async def held(self) -> list[HeldRequest]:
        """Every held request, by release time."""
        names = [k for k in await self.store.keys(HELD_PREFIX) if k.startswith(HELD_PREFIX)]
        items = []
        for raw in await self.store.mget(names) if names else []:
            if raw is None:
                continue  # answered between the listing and the read
            try:
                items.append(HeldRequest.from_json(raw))
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("skipping an unreadable held request: %s", exc)
        return sorted(items, key=lambda item: (item.release_at, item.enqueued_at, item.request_id))

    async def due(self, now: float | None = None) -> list[HeldRequest]:
        t = self.clock() if now is None else now
        return [item for item in await self.held() if item.release_at <= t]

    async def claim(self, request_id: str, owner: str) -> bool:
        """Take the release of ``request_id``; False when another router holds it."""
        return await self.store.set_nx(claim_key(request_id), owner.encode(), self.claim_ttl_s)

    async def renew(self, request_id: str, owner: str) -> bool:
        """Extend ``owner``'s claim by ``claim_ttl_s`` (a run in progress); False when the claim
        is another router's now (it lapsed: both run it, at least once) or gone."""
        if await self.store.get(claim_key(request_id)) != owner.encode():
            return False
        await self.store.set(claim_key(request_id), owner.encode(), self.claim_ttl_s)
        return True

    async def unclaim(self, request_id: str) -> None:
        """Give the release back (a failed run: the next tick tries again)."""
        await self.store.delete(claim_key(request_id))

    async def release_now(self, request_id: str, reason: str = OPERATOR) -> HeldRequest | None:
        """Move a held request's release to now (None: no such request is held)."""
        item = await self.get(request_id)
        if item is None:
            return None
        now = self.clock()
        moved = replace(item, release_at=min(item.release_at, now), reason=reason,
                        detail=f"released early ({reason}); was: {item.detail}")
        await self.store.set(held_key(request_id), moved.to_json(), self._ttl(moved))
        return moved

    async def finish(self, request_id: str, answer: bytes) -> None:
        """Store the answer, then drop the held request and its claim (in that order: a crash
        in between leaves a request that runs again, never one without an answer)."""
        await self.store.set(result_key(request_id), answer, self.result_ttl_s)
        await self.store.delete(held_key(request_id))
        await self.store.delete(claim_key(request_id))

    async def answer(self, request_id: str) -> bytes | None:
        return await self.store.get(result_key(request_id))

    async def status(self, request_id: str) -> str:
        if await self.store.get(result_key(request_id)) is not None:
            return DONE
        if await self.store.get(held_key(request_id)) is None:
            return UNKNOWN
        return RUNNING if await self.store.get(claim_key(request_id)) is not None else HELD


class DeferralWorker:
    """The release loop: each tick, claim every due request, run it and store its answer.

    ``run(item)`` returns the answer's bytes. When it raises, the claim is given back and the
    next tick tries again; when the next tick would come after the deadline,
    ``give_up(item, error)`` makes the answer (e.g. a failure status) and the request is
    finished with it.

    Up to ``max_running`` runs at once (1: one after the other); while one runs its claim is
    renewed every ``claim_ttl_s / 3``, so a run may outlast the claim's TTL and a router that
    dies lets its claims lapse within that TTL. ``run_forever`` starts runs as they fall due
    and keeps ticking meanwhile; when ``stop`` is set it cancels the runs in progress, which
    give their claims back (another router, or this one restarted, runs them again).
    """

    def __init__(self, queue: DeferralQueue, run: Callable[[HeldRequest], Awaitable[bytes]], owner: str,
                 give_up: Callable[[HeldRequest, BaseException], bytes], interval_s: float = 1.0,
                 max_running: int = 1) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        self.queue = queue
        self.run = run
        self.owner = owner
        self.give_up = give_up
        self.interval_s = interval_s
        self.max_running = max_running
        # Request id -> its run in progress here (True once answered).
        self._running: dict[str, asyncio.Task[bool]] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    async def tick(self) -> int:
        """Release what is due, ``max_running`` at a time, each once; the number answered."""
        answered = 0
        tried: set[str] = set()
        while started := await self._start_due(tried):
            tried.update(task.get_name() for task in started)
            answered += sum(await asyncio.gather(*started))
        return answered

    async def _start_due(self, skip: set[str] | frozenset[str] = frozenset()) -> list[asyncio.Task[bool]]:
        """Claim and start the due requests not running here (nor in ``skip``), up to the limit."""
        started = []
        for item in await self.queue.due():
            if len(self._running) >= self.max_running:
                break
            if (item.request_id in self._running or item.request_id in skip
                    or not await self.queue.claim(item.request_id, self.owner)):
                continue
            task = asyncio.create_task(self._release(item), name=item.request_id)
            self._running[item.request_id] = task
            started.append(task)
        return started

    async def _keep_claim(self, request_id: str) -> None:
        while True:
            await asyncio.sleep(self.queue.claim_ttl_s / 3.0)
            try:
                if not await self.queue.renew(request_id, self.owner):
                    log.warning("deferred request %s: its claim lapsed mid-run; another router may run it too",
                                request_id)
                    return
            except Exception as exc:  # the store may be down: try again, the claim may still hold
                log.warning("deferred request %s: renewing its claim failed (%s)", request_id, exc)

    async def _release(self, item: HeldRequest) -> bool:
        """Run one claimed request and finish it (True), or give its claim back (False)."""
        try:
            return await self._run_claimed(item)
        finally:
            self._running.pop(item.request_id, None)

    async def _run_claimed(self, item: HeldRequest) -> bool:
        request_id = item.request_id
        heartbeat = asyncio.create_task(self._keep_claim(request_id))
        failure: Exception | None = None
        try:
            answer = await self.run(item)
        except asyncio.CancelledError:
            await _stopped(heartbeat)
            with contextlib.suppress(Exception):
                await self.queue.unclaim(request_id)
            raise
        except Exception as exc:  # any failure of a run: retry or give up, never drop
            failure = exc
        # Stopped before the claim is dropped, so that it cannot set the claim again.
        await _stopped(heartbeat)
        try:
            if failure is not None:
                # Retried while the next tick is before the deadline; else answered with this
                # failure (what kept it from running), not with the deadline passing.
                if self.queue.clock() + self.interval_s < item.deadline:
                    log.warning("deferred request %s: release failed (%s); retrying", request_id, failure)
                    await self.queue.unclaim(request_id)
                    return False
                answer = self.give_up(item, failure)
            await self.queue.finish(request_id, answer)
        except Exception as exc:  # the store is down: the claim lapses, the request runs again
            log.warning("deferred request %s: storing its outcome failed (%s); it will run again", request_id, exc)
            return False
        return True

    async def run_forever(self, stop: asyncio.Event) -> None:
        failing = False  # logged once per outage, not every tick
        try:
            while not stop.is_set():
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
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            runs = list(self._running.values())
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
