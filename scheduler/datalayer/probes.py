"""``RegionProbes``: the router's own health probes of each region's endpoint.

Every ``interval_s`` it sends ``GET {endpoint}/health`` to every configured region at once
(the region gateway answers 200 while at least one pool's engine answers and 503 otherwise;
the stub region answers 200), with a short ``timeout_s``, and keeps each region's latest
``ProbeResult`` in memory. The refresher puts them in every snapshot (``FleetSnapshot.probes``);
the request path never probes.

Why: the regions' published live state reaches the router only through the shared store. When
the store cannot be read, or cannot be written (full, read-only after a failover, a region's
ACL user refused), that state ages past ``max_age.region_state`` and, without another source,
every region would count as down: a store fault would become a fleet outage. The probes are
that other source. They are judged whenever a region's state is not fresh
(scheduler.plugins.filters.region_health): a region last known healthy whose probe answers
stays up; one whose probe fails is down.

ok = HTTP 200 within ``timeout_s``; anything else (connection refused, timeout, 5xx) is a
failed probe with its reason in ``detail``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from scheduler.fleet import Region
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.types import ProbeResult

log = logging.getLogger(__name__)

HEALTH_PATH = "/health"


@dataclass
class RegionProbes:
    # region name -> its endpoint (base URL, as in regions/*.yaml)
    endpoints: Mapping[str, str]
    clock: Callable[[], float] = time.time
    interval_s: float = 1.0
    timeout_s: float = 0.5
    _results: dict[str, ProbeResult] = field(default_factory=dict, init=False, repr=False)
    _client: httpx.AsyncClient | None = field(default=None, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, regions: Sequence[Region], clock: Callable[[], float] = time.time,
           interval_s: float = 1.0, timeout_s: float = 0.5) -> RegionProbes:
        return cls({r.name: r.endpoint for r in regions}, clock=clock, interval_s=interval_s, timeout_s=timeout_s)

    def results(self) -> Mapping[str, ProbeResult]:
        """The latest probe of each region probed so far (no I/O)."""
        return dict(self._results)

    async def probe_all(self) -> Mapping[str, ProbeResult]:
        """Probe every region once, concurrently, and keep the results."""
        client = self._client
        if client is None:
            client = self._client = httpx.AsyncClient()
        names = list(self.endpoints)
        results = await asyncio.gather(*(self._probe(client, self.endpoints[name]) for name in names))
        for name, result in zip(names, results, strict=True):
            previous = self._results.get(name)
            if previous is not None and previous.ok != result.ok:
                log.info("region %s probe: %s", name, "answers again" if result.ok else f"failed ({result.detail})")
            self._results[name] = result
        return self.results()

    async def _probe(self, client: httpx.AsyncClient, endpoint: str) -> ProbeResult:
        url = endpoint.rstrip("/") + HEALTH_PATH
        try:
            response = await client.get(url, timeout=self.timeout_s)
        except httpx.TimeoutException:
            return ProbeResult(False, self.clock(), f"no answer within {self.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return ProbeResult(False, self.clock(), f"{type(exc).__name__}: {exc}"[:200])
        if response.status_code != 200:
            return ProbeResult(False, self.clock(), f"HTTP {response.status_code}")
        return ProbeResult(True, self.clock())

    async def start(self) -> None:
        """Probe now and every ``interval_s``, in the background (start-up does not wait on a
        region that does not answer)."""
        if self._task is not None:
            return
        self._task = start_loop(self._run, "region-probes")

    async def _run(self) -> None:
        # (A bug in one round does not stop the probes; the results age instead.)
        await run_every(self.interval_s, self.probe_all, "region probes")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
