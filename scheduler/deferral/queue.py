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

The queue only uses the store's generic verbs (get, mget, set, set_nx, delete, keys), so
``MemoryStore`` and ``RedisStore`` both carry it. ``DeferralWorker`` is the release loop a
router runs: every ``interval_s`` it claims each due request, runs it with the router's own
``run`` callable and stores the answer. When to release is decided once, at hold time, by
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
    next tick tries again; once the deadline has passed, ``give_up(item, error)`` makes the
    answer (e.g. a failure status) and the request is finished with it.
    """

    def __init__(self, queue: DeferralQueue, run: Callable[[HeldRequest], Awaitable[bytes]], owner: str,
                 give_up: Callable[[HeldRequest, BaseException], bytes], interval_s: float = 1.0) -> None:
        self.queue = queue
        self.run = run
        self.owner = owner
        self.give_up = give_up
        self.interval_s = interval_s

    async def tick(self) -> int:
        """Release what is due; the number of requests answered."""
        answered = 0
        for item in await self.queue.due():
            if not await self.queue.claim(item.request_id, self.owner):
                continue
            try:
                answer = await self.run(item)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self.queue.unclaim(item.request_id)
                raise
            except Exception as exc:  # any failure of a run: retry or give up, never drop
                if self.queue.clock() < item.deadline:
                    log.warning("deferred request %s: release failed (%s); retrying", item.request_id, exc)
                    await self.queue.unclaim(item.request_id)
                    continue
                answer = self.give_up(item, exc)
            await self.queue.finish(item.request_id, answer)
            answered += 1
        return answered

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception as exc:  # the store may be down: keep the loop
                log.warning("deferral queue tick failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
