"""Publishing a region's live state to the shared store about once a second.

``RegionStatePublisher`` takes a *source* (an async callable returning the region's
``RegionLiveState``, or None when it cannot tell) and writes each value under
``keys.region_state(region)`` with a TTL, so that dead regions eventually vanish; freshness
is judged by readers from ``observed_at``, never from the TTL.

Two sources exist: the gateway's own ``live_state`` (production: the region writes to Redis
itself) and ``HttpStateSource``, which reads a gateway's ``GET /state`` (a single-process
stack on the in-memory store, where the region cannot reach the router's memory). A source
that fails publishes nothing: the region's state then ages and the router's health filter
treats it as the policy says for stale regions.

Each publication also writes the region's last-seen record, ``keys.region_seen(region)``: the
state's ``observed_at``, kept ``SEEN_TTL_S`` (30 days, far past the state's 60 s). After the
state key expired, that record is how a router (one that restarted, or that started later)
tells "was here and stopped publishing: stale, down" from "never seen". The region writes it,
not the routers: it is the one writer that knows when it published, the record is written
exactly as often as the state (no extra writer per router), and it holds even when no router
was running to see the region.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from scheduler.datalayer.refresher import encode_seen
from scheduler.state import codec, keys
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.types import RegionLiveState

log = logging.getLogger(__name__)

StateSource = Callable[[], Awaitable[RegionLiveState | None]]
# A region that stopped publishing a month ago counts as never seen again (a region removed from
# the fleet leaves no key behind for ever).
SEEN_TTL_S = 30 * 86400.0



@dataclass
class RegionStatePublisher:
    region: str
    source: StateSource
    store: StateStore
    interval_s: float = 1.0
    ttl_s: float = 60.0
    published: int = field(default=0, init=False)
    _store_down: bool = field(default=False, init=False)

    async def publish_once(self) -> RegionLiveState | None:
        state = await self.source()
        if state is None:
            return None
        try:
            await self.store.set(keys.region_state(self.region), codec.encode_region_state(state), ttl_s=self.ttl_s)
            await self.store.set(keys.region_seen(self.region), encode_seen(state.observed_at), ttl_s=SEEN_TTL_S)
        except StateUnavailable as exc:
            if not self._store_down:
                log.warning("region %s: state store unavailable (%s); retrying every %.1f s",
                            self.region, exc, self.interval_s)
            self._store_down = True
            return None
        if self._store_down:
            log.info("region %s: state store reachable again", self.region)
            self._store_down = False
        self.published += 1
        return state

    async def run(self) -> None:
        """Publish until cancelled; a failing source or store never ends the loop."""
        await run_every(self.interval_s, self.publish_once, f"region {self.region}: publishing live state")


@dataclass(frozen=True)
class HttpStateSource:
    """Reads a region gateway's ``GET {endpoint}/state``; None when it does not answer."""

    endpoint: str
    client: httpx.AsyncClient
    timeout_s: float = 1.0

    async def __call__(self) -> RegionLiveState | None:
        try:
            response = await self.client.get(f"{self.endpoint.rstrip('/')}/state", timeout=self.timeout_s)
            response.raise_for_status()
            return codec.decode_region_state(response.content)
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("state of %s unavailable: %s", self.endpoint, exc)
            return None


@dataclass
class StateBridge:
    """Publishes, from this process, the state every listed region serves at ``GET /state``.

    For a single-process stack on the in-memory store (the regions, in their Ray workers,
    cannot write into this process's memory). Has the router's ``BackgroundTask`` shape.
    """

    endpoints: dict[str, str]
    store: StateStore
    interval_s: float = 1.0
    ttl_s: float = 60.0
    _client: httpx.AsyncClient | None = field(default=None, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)

    async def start(self) -> None:
        self._client = httpx.AsyncClient()
        for region, endpoint in self.endpoints.items():
            publisher = RegionStatePublisher(
                region=region, source=HttpStateSource(endpoint, self._client), store=self.store,
                interval_s=self.interval_s, ttl_s=self.ttl_s,
            )
            self._tasks.append(start_loop(publisher.run, f"state-bridge:{region}"))

    async def stop(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
