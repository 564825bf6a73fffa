"""The event loop: arrivals from the workload, completions and scripted outages from a heap.

For each arrival: refresh the snapshot if it is older than ``refresh_s`` (the router's
cadence), ask ``Scheduler.schedule(request, snapshot)``, and send the request down the
ranked list: the first pool that is up takes it (starting it or queueing it); a pool that is
down is skipped (failover before the first token). When a region goes down, the requests
queued in it fail over the same way; those already running finish (simplification).

The simulator measures each request itself: TTFT and energy from the pool physics
(``scheduler.sim.pools``), grams from the true grid intensity of the hour it ran in times
the region's PUE, and compliance from the request's own rules and the region it ran in.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.filters.slo_reachable import ttft_budget_s
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.datalayer import SimDataLayer
from scheduler.sim.pools import VLLM_MAX_NUM_SEQS, BatchPerfTable, Job, PoolSim
from scheduler.sim.report import PolicyResult, summarize
from scheduler.sim.workload import RequestFactory, Workload

_DONE, _DOWN, _UP = 0, 1, 2
J_PER_KWH = 3.6e6
PROGRESS_EVERY = 5000


@dataclass(frozen=True)
class RegionOutage:
    """``region`` is down from ``start`` to ``end`` (epoch seconds)."""

    region: str
    start: float
    end: float


@dataclass(frozen=True)
class Scenario:
    refresh_s: float = 1.0
    region_outages: tuple[RegionOutage, ...] = ()
    max_seqs: int = VLLM_MAX_NUM_SEQS


class Simulation:
    def __init__(
        self,
        regions: Sequence[RegionConfig],
        policy: PolicyConfig,
        workload: Workload,
        carbon: CarbonReplay,
        scenario: Scenario = Scenario(),
        seed: int = 0,
        scheduler: Scheduler | None = None,
    ) -> None:
        """``scheduler``: the decision function (default: every registered plugin, with a
        tie-break RNG seeded from ``seed``, as in the router)."""
        self.regions = tuple(regions)
        self.policy = policy
        self.workload = workload
        self.carbon = carbon
        self.scenario = scenario
        self.seed = seed
        self.scheduler = scheduler
        known = {r.name for r in self.regions}
        for outage in scenario.region_outages:
            if outage.region not in known:
                raise ValueError(f"region outage names unknown region {outage.region!r} (known: {sorted(known)})")

    def run(self, progress: bool = True) -> PolicyResult:
        started_wall = time.perf_counter()
        w = self.workload
        n = len(w)
        builder = SnapshotBuilder(self.regions, self.policy)
        table = BatchPerfTable(SnapshotBuilder(self.regions, self.policy))
        scheduler = self.scheduler or Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(self.seed))
        factory = RequestFactory(w)

        # One simulated pool per (region, pool) serving the workload's model.
        pool_of: dict[int, PoolSim] = {}
        by_pool: dict[tuple[str, str], PoolSim] = {}
        for c in builder.candidates:
            if c.deployment.name != w.model:
                continue
            key = (c.region.name, c.pool.name)
            if key not in by_pool:
                by_pool[key] = PoolSim(c, self.scenario.max_seqs)
            pool_of[c.index] = by_pool[key]
        region_pools: dict[str, list[PoolSim]] = {}
        for (region, _), pool in by_pool.items():
            region_pools.setdefault(region, []).append(pool)
        data = SimDataLayer(builder, self.carbon, region_pools, self.scenario.refresh_s)

        region_names = [r.name for r in self.regions]
        region_index = {name: i for i, name in enumerate(region_names)}
        pool_region = {id(p): region_index[p.candidate.region.name] for p in by_pool.values()}

        # Per-request outcomes (-1 / NaN: never ran); lists, as the loop writes one item at a time.
        ran_in = [-1] * n
        ttft = [math.nan] * n
        budget = [0.0] * n
        energy = [0.0] * n
        grams = [0.0] * n
        start_hour = w.arrival_s[0] if n else 0.0
        hours = int((w.arrival_s[-1] - start_hour) // 3600) + 1 if n else 1
        hourly = [[0] * len(region_names) for _ in range(hours)]
        intensity = self.carbon.intensity
        counters: Counter[str] = Counter()
        fallbacks: Counter[str] = Counter()
        unschedulable_by: Counter[str] = Counter()
        sched_ns = 0
        snapshot_ns = 0

        heap: list[tuple[float, int, int, object, int]] = []
        seq = 0
        for outage in self.scenario.region_outages:
            heapq.heappush(heap, (outage.start, seq, _DOWN, outage.region, 0))
            heapq.heappush(heap, (outage.end, seq + 1, _UP, outage.region, 0))
            seq += 2

        def begin(pool: PoolSim, job: Job, now: float) -> None:
            nonlocal seq
            started = pool.start(job, now, table)
            row = job.row
            request = job.request
            region = pool.candidate.region
            r = pool_region[id(pool)]
            ran_in[row] = r
            ttft[row] = started.ttft_s
            energy[row] = started.energy_j
            grams[row] = started.energy_j / J_PER_KWH * intensity(region.grid_zone, now) * region.pue
            hourly[int((job.arrived - start_hour) // 3600)][r] += 1
            if request.allowed_jurisdictions and region.jurisdiction not in request.allowed_jurisdictions:
                counters["violations"] += 1
            if request.required_certifications and not request.required_certifications.issubset(region.certifications):
                counters["violations"] += 1
            if started.cached_tokens:
                counters["prefix_hits"] += 1
                counters["reused_tokens"] += started.cached_tokens
            heapq.heappush(heap, (started.done_at, seq, _DONE, pool, started.kv_tokens))
            seq += 1

        def dispatch(job: Job, now: float) -> None:
            decision = job.decision
            fleet, survivors, order = decision.fleet, decision.survivor_index, decision.order
            first = job.rank
            for k in range(first, len(order)):
                pool = pool_of[fleet[survivors[order[k]]].index]
                if pool.down:
                    continue
                job.rank = k
                counters["failovers"] += k - first
                request = job.request
                if not pool.queue and pool.has_room(request.prompt_tokens + request.max_tokens):
                    job.enqueued = now
                    begin(pool, job, now)
                else:
                    counters["queued"] += 1
                    pool.enqueue(job, now)
                return
            counters["failed"] += 1

        def handle(event: tuple[float, int, int, object, int]) -> None:
            now, _, kind, subject, kv_tokens = event
            if kind == _DONE:
                assert isinstance(subject, PoolSim)
                subject.finish(kv_tokens)
                while (job := subject.next_startable()) is not None:
                    begin(subject, job, now)
                return
            region = str(subject)
            down = kind == _DOWN
            for pool in region_pools.get(region, ()):
                pool.down = down
            if down:
                data.down.add(region)
                for pool in region_pools.get(region, ()):
                    for job in pool.drain():
                        job.rank += 1
                        dispatch(job, now)
            else:
                data.down.discard(region)

        arrival = w.arrival_s
        prefix_tokens = w.prefix_tokens
        bar = tqdm(total=n, unit="req", desc=self.policy.name, disable=not progress, mininterval=0.5)
        clock = time.perf_counter_ns
        i = 0
        while i < n:
            t = arrival[i]
            while heap and heap[0][0] <= t:
                handle(heapq.heappop(heap))
            mark = clock()
            snap = data.snapshot(t)
            request = factory.request(i)
            budget[i] = ttft_budget_s(request, snap)
            mid = clock()
            decision = scheduler.schedule(request, snap)
            done = clock()
            snapshot_ns += mid - mark
            sched_ns += done - mid
            for fallback in decision.fallbacks:
                fallbacks[fallback.signal] += 1
            if decision.schedulable:
                dispatch(Job(i, request, t, prefix_tokens[i], decision), t)
            else:
                counters["unschedulable"] += 1
                if decision.rejected:
                    unschedulable_by[decision.rejected[-1].plugin] += 1
            i += 1
            if i % PROGRESS_EVERY == 0:
                bar.update(PROGRESS_EVERY)
        while heap:
            handle(heapq.heappop(heap))
        bar.update(n - bar.n)
        bar.close()

        return summarize(
            policy=self.policy.name,
            regions=region_names,
            ran_in=np.asarray(ran_in, dtype=np.int64),
            ttft_s=np.asarray(ttft),
            budget_s=np.asarray(budget),
            energy_j=np.asarray(energy),
            grams=np.asarray(grams),
            hourly=np.asarray(hourly, dtype=np.int64).reshape(hours, len(region_names)),
            start=start_hour,
            counters=counters,
            fallbacks=fallbacks,
            unschedulable_by=unschedulable_by,
            timings_s={
                "total": time.perf_counter() - started_wall,
                "schedule": sched_ns / 1e9,
                "snapshot_and_request": snapshot_ns / 1e9,
            },
        )
