"""``CarbonPollers``: the router's one entry point to carbon signals.

    pollers = CarbonPollers.from_regions(regions, store)
    await pollers.start()      # background tasks; returns at once
    ...
    await pollers.stop()       # cancels, releases the locks, closes the HTTP clients

One ``ZonePoller`` per distinct (provider, zone) of the regions' ``carbon`` sources, polling
at the shortest interval any of those regions asks for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.datalayer.carbon.base import CarbonProvider
from scheduler.datalayer.carbon.http import Clock
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.providers import ProviderOptions, make_provider
from scheduler.datalayer.carbon.zone_poller import LockTiming, ZonePoller
from scheduler.fleet import Region
from scheduler.state.store import StateStore
from scheduler.tasks import start_loop, stop_task
from scheduler.wire.retry import Sleep

log = logging.getLogger(__name__)


def default_owner() -> str:
    """Unique per process start: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class CarbonPollers:
    pollers: tuple[ZonePoller, ...]
    providers: tuple[CarbonProvider, ...]
    counters: Counters
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)

    @classmethod
    def from_regions(
        cls,
        regions: Sequence[Region],
        store: StateStore,
        *,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        counters: Counters | None = None,
        options: ProviderOptions | None = None,
        providers: Mapping[str, CarbonProvider] | None = None,
        owner: str | None = None,
        lock: LockTiming | None = None,
    ) -> CarbonPollers:
        """``providers`` overrides the provider made for a name (``options`` configures the
        rest: base URL, credentials, timeouts, retries)."""
        intervals: dict[tuple[str, str], float] = {}
        for region in regions:
            key = (region.carbon.provider, region.carbon.zone)
            intervals[key] = min(intervals.get(key, float("inf")), region.carbon.poll_interval_s)
        made = dict(providers or {})
        for name in sorted({name for name, _ in intervals} - made.keys()):
            made[name] = make_provider(name, options)
        counters = counters if counters is not None else Counters()
        owner = owner or default_owner()
        pollers = tuple(
            ZonePoller(made[name], zone, interval, store, owner, counters, clock, sleep, lock or LockTiming())
            for (name, zone), interval in sorted(intervals.items())
        )
        return cls(pollers, tuple(made.values()), counters)

    async def start(self) -> None:
        if self._tasks:
            return
        for poller in self.pollers:
            self._tasks.append(start_loop(poller.run, f"poller {poller.lock_name}"))
        log.info("carbon pollers started: %s", ", ".join(p.lock_name for p in self.pollers) or "none")

    async def stop(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks.clear()
        for provider in self.providers:
            await provider.aclose()

    def holding(self) -> list[str]:
        """The locks this process holds now (the (provider, zone) pairs it polls)."""
        return [p.lock_name for p in self.pollers if p.held]
