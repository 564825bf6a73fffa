"""The event loop: arrivals from the workload; replica step boundaries and scripted outages from a heap.

For each arrival: refresh the snapshot if it is older than ``refresh_s`` (the router's
cadence), ask ``Scheduler.schedule(request, snapshot)``, and send the request down the
ranked list: the first pool that is up takes it and hands it to one of its replicas
(``scheduler.sim.pools``); a pool that is down is skipped (failover before the first token).
When a region goes down, the requests waiting in it fail over the same way; those already
admitted finish (simplification). A replica's next step boundary is an event; one an arrival
made obsolete (a decode run cut short to admit it) is skipped by its version. An arrival of
the workload and a step boundary at the same instant, to within ``TIE_S`` (1 us): the arrival
comes first (it joins that step; ``scheduler.sim.replica``, "Ties"). Arrivals that are events
themselves (a held request's release, a workflow's next step) take the heap's order: time,
then the order they were pushed in.

The simulator measures each request itself, on the pool's true step costs and the true RTT
(``scheduler.sim.truth``): TTFT = true RTT + first-token time - arrival, queue wait = admission -
arrival, energy by the attribution rule of ``scheduler.sim.replica``, grams = energy x the
true grid intensity of the hour it was admitted in x the region's PUE, compliance from the
request's own rules and the region it ran in. Beside them it records what the scheduler
predicted (``scheduler.sim.predicted``) and the true age of every fallback's signal:

    age = the age the decision recorded + (request time - snapshot time)

(a snapshot is reused while a rebuild would decide the same, ``scheduler.sim.datalayer``).
Fleet idle energy: idle_w x (warm replica time - busy time) per pool, span from the first
arrival to the last event; with fixed sizes every replica is warm for the whole span.

Autoscaling (``Scenario.autoscaling``, ``scheduler.sim.autoscale``; each pool's settings from
its region file or the Ray Serve app's default, its cold start from the router's function):
ticks every shortest ``metrics_interval_s`` of the pools (at whole multiples of it in epoch
time, so that hours begin on one where it divides an hour); at a tick each pool that is up and
whose own interval has passed samples its ongoing requests and its autoscaler decides; replicas it
starts are events (``_READY``) after their cold start. A request sent to a pool with no warm
replica waits for one (and wakes a pool at zero at once, Ray Serve's cold-start fast path).

The whole fleet's energy (``scheduler.sim.report.PoolEnergy``): at every tick (hourly with fixed
sizes) each pool's idle energy since the last one, idle_w x (warm time - busy time), and its
cold starts' energy are booked to the hour they fall in, and priced at that hour's true
intensity x the region's PUE, as a request's joules are at the hour it was admitted in. A step
or decode run is booked as busy when the replica books it (a decode run at its end), so an
hour's idle energy can be off by the runs in progress at its boundary; the run's total is not.

Deferral (``Scenario.deferral``, ``scheduler.sim.deferral``): a deferrable request decided at
arrival is either dispatched at once or held until the release time that
``scheduler.deferral.window.choose_release`` picks on the forecast; its release is an event on
the heap (an arrival, for the ordering), decided afresh on the snapshot of that time. Runs
whose workload has no deferrable request take none of these paths. A request that may not
be held (``Request.holdable`` is False: a chain's or a DAG's step, on which the next steps
wait) is dispatched at once, whatever its class.

Workflows (``scheduler.sim.workflow``): a step that waits on others arrives when the last of
them has its last token at the client (done + RTT) plus its think time, an event on the heap
(an arrival, for the ordering); a step whose predecessor never ran never arrives.

Affinity (``Scenario.affinity``, docs/simulation.md "Workflows and affinity"): the snapshots
carry ``prefix_warm`` and ``workflows`` (``scheduler.sim.datalayer.SimAffinity``), requests
carry their workflow id, and pools choose a replica prefix-aware (``scheduler.sim.pools``).
Without it (the default) none of these: the replicas' own prefix caches still hit when a
request lands where its key is cached.
"""

from __future__ import annotations

import dataclasses
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
from scheduler.datalayer.snapshot import SnapshotBuilder, replicas_of
from scheduler.deferral.window import choose_release
from scheduler.framework.scheduler import Scheduler
from scheduler.framework.slo import ttft_budget_s
from scheduler.plan.schedule import DailySchedule, warm_replicas_at
from scheduler.plugins import default_scheduler_registry
from scheduler.sim.autoscale import AutoscalingSettings, PoolAutoscaler
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.datalayer import SimDataLayer
from scheduler.sim.deferral import Deferral, predicted_completion_s
from scheduler.sim.deferral import summary as deferral_summary
from scheduler.sim.forecast import CarbonForecast
from scheduler.sim.pools import Job, PoolSim
from scheduler.sim.predicted import Predictions
from scheduler.sim.replica import TIE_S, Replica, Seq
from scheduler.sim.report import FallbackAges, PolicyResult, PoolEnergy, RunOutcome
from scheduler.sim.truth import EXACT_TRUTH, HeldOutResiduals, TruthModel
from scheduler.sim.workflow import figures as workflow_figures
from scheduler.sim.workload import RequestFactory, Workload
from scheduler.types import WORKLOAD_CLASSES, Decision, FleetSnapshot, Request
from scheduler.units import J_PER_KWH

_STEP, _DOWN, _UP, _RELEASE, _ARRIVE, _TICK, _READY = 0, 1, 2, 3, 4, 5, 6
_DEFERRABLE = WORKLOAD_CLASSES.index("deferrable")
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
    # What the pools and the network really do (default: the rated costs exactly, the RTT as
    # predicted; ``scheduler simulate`` runs ``TruthModel()``, the model-form truth).
    truth: TruthModel = EXACT_TRUTH
    # The deferral queue for deferrable requests (None: they are decided and run at arrival).
    deferral: Deferral | None = None
    # The router's and the pools' prefix and workflow affinity (module docstring).
    affinity: bool = False
    # Every pool's replicas scale by Ray Serve's policy on its own settings (region file, else the
    # default), these overriding them where set (None: fixed sizes, every replica warm throughout).
    autoscaling: AutoscalingSettings | None = None
    # A capacity plan (``scheduler plan``): the pools it names keep its min and max replicas of
    # each hour as their autoscaler's bounds, applied by time of day (None: the settings' own).
    plan: DailySchedule | None = None


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
        hour_origin: float | None = None,
        span_until: float | None = None,
        first_row: int = 0,
    ) -> None:
        """``scheduler``: the decision function (default: every registered plugin, with a
        tie-break RNG seeded from ``seed``, as in the router); ``hour_origin``: the start of
        hour 0 of the hourly counts (default: the first arrival); ``span_until``: the fleet's
        idle energy counts until then at least (a shard: the next shard's first arrival);
        ``first_row``: the row of the workload's first request in the whole run (a shard's),
        which the truth's per-request draws are keyed on."""
        self.regions = tuple(regions)
        self.policy = policy
        self.workload = workload
        self.carbon = carbon
        self.scenario = scenario
        self.seed = seed
        self.scheduler = scheduler
        self.hour_origin = hour_origin
        self.span_until = span_until
        self.first_row = first_row
        known = {r.name for r in self.regions}
        for outage in scenario.region_outages:
            if outage.region not in known:
                raise ValueError(f"region outage names unknown region {outage.region!r} (known: {sorted(known)})")

    def run(self, progress: bool = True) -> PolicyResult:
        return self.outcome(progress).summary()

    def outcome(self, progress: bool = True) -> RunOutcome:
        """The run's per-request outcomes and totals (``run`` summarises them; shards of one
        workload merge theirs first, ``scheduler.sim.shards``)."""
        started_wall = time.perf_counter()
        w = self.workload
        n = len(w)
        # Every request asks for the workload's model: the predictions of the others, which
        # nothing reads, are not kept up to date (``SnapshotBuilder.models``).
        builder = SnapshotBuilder(self.regions, self.policy, models=frozenset((w.model,)))
        predictions = Predictions()
        scheduler = self.scheduler or Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(self.seed))
        affinity = self.scenario.affinity
        factory = RequestFactory(w, workflow_ids=affinity)
        flows = w.workflows
        roots: Sequence[int] = range(n) if flows is None else flows.roots
        region_names = [r.name for r in self.regions]
        region_index = {name: i for i, name in enumerate(region_names)}

        # Per-request outcomes (-1 / NaN: never ran); lists, as the loop writes one item at a time.
        ran_in = [-1] * n
        ttft = [math.nan] * n
        queue_wait = [math.nan] * n
        latency = [math.nan] * n
        budget = [0.0] * n
        energy = [0.0] * n
        grams = [0.0] * n
        predicted_j = [math.nan] * n
        predicted_ttft = [math.nan] * n
        # the pool each request ran in (its ``PoolSim.number``)
        ran_pool = [-1] * n
        arrival = list(w.arrival_s)
        first_arrival = arrival[roots[0]] if n else 0.0
        # Hour 0 of the hourly counts (a shard counts its hours from the whole run's start).
        start_hour = first_arrival if self.hour_origin is None else self.hour_origin
        # Deferrable requests: their deadlines and release times (None: the workload has none).
        classes = w.workload_class
        has_deferrable = _DEFERRABLE in classes
        deferral = self.scenario.deferral if has_deferrable else None
        deferring = deferral is not None
        deadline: list[float] = [math.nan] * n if has_deferrable else []
        released: list[float] = list(arrival) if has_deferrable else []
        reasons: Counter[str] = Counter()
        # row -> (the request as it arrived, its class's TTFT budget [s]) while held
        held: dict[int, tuple[Request, float]] = {}
        last_root = arrival[roots[-1]] if n else start_hour
        # Requests per hour (of arrival) and region; grown as later hours are reached (held
        # requests run until their deadline, a workflow's steps after its start).
        hourly = [[0] * len(region_names) for _ in range(int((last_root - start_hour) // 3600) + 1)]
        # Workflows: the parents each step still waits for, and when the last one's reached the client.
        waits_for = [len(parents) for parents in flows.after] if flows is not None else []
        ready_at = [-math.inf] * n if flows is not None else []
        intensity = self.carbon.intensity
        counters: Counter[str] = Counter()
        fallback_ages = FallbackAges()
        unschedulable_by: Counter[str] = Counter()
        sched_ns = 0
        snapshot_ns = 0

        # Events: (time, tie-break, kind, subject, version).
        heap: list[tuple[float, int, int, object, int]] = []
        seq_no = 0

        # Per simulated pool (``PoolSim.number``): its region's position, grid zone, PUE and config
        # (read at each request's end: attribute reads on a config model cost several times a
        # plain object's).
        pool_regions: list[tuple[int, str, float, RegionConfig]] = []

        def done(seq: Seq) -> None:
            nonlocal seq_no
            assert isinstance(seq, Job) and seq.pool is not None
            row = seq.row
            request = seq.request
            r, zone, pue, region = pool_regions[seq.pool.number]
            ran_in[row] = r
            ttft[row] = seq.rtt_s + seq.first_token - seq.arrived
            queue_wait[row] = seq.admitted - seq.arrived
            latency[row] = seq.rtt_s + seq.done - seq.arrived
            energy[row] = seq.energy_j
            grams[row] = seq.energy_j / J_PER_KWH * intensity(zone, seq.admitted) * pue
            predicted_j[row] = seq.predicted_j
            predicted_ttft[row] = seq.predicted_ttft_s
            ran_pool[row] = seq.pool.number
            hour = int((seq.arrived - start_hour) // 3600)
            while hour >= len(hourly):
                hourly.append([0] * len(region_names))
            hourly[hour][r] += 1
            if request.allowed_jurisdictions and region.jurisdiction not in request.allowed_jurisdictions:
                counters["violations"] += 1
            if request.required_certifications and not request.required_certifications.issubset(region.certifications):
                counters["violations"] += 1
            if seq.cached:
                counters["prefix_hits"] += 1
                counters["reused_tokens"] += seq.cached
                if data.affinity is not None and request.prefix_key is not None:
                    data.affinity.record_hit(region.name, seq.pool.candidate.pool.name, request.prefix_key,
                                             seq.cached, seq.done)
            if flows is not None:
                at_client = seq.done + seq.rtt_s
                for child in flows.children[row]:
                    ready_at[child] = max(ready_at[child], at_client)
                    waits_for[child] -= 1
                    if waits_for[child] == 0:
                        heapq.heappush(heap, (ready_at[child] + flows.think_s[child], seq_no, _ARRIVE, child, 0))
                        seq_no += 1

        # One simulated pool per (region, pool) serving the workload's model, at its true costs.
        truth = self.scenario.truth
        autoscaling = self.scenario.autoscaling
        plan = self.scenario.plan
        residuals = HeldOutResiduals.load() if truth.gpu_bias else None
        knee = truth.knee
        pool_of: dict[int, PoolSim] = {}
        by_pool: dict[tuple[str, str], PoolSim] = {}
        for c in builder.candidates:
            if c.deployment.name != w.model:
                continue
            key = (c.region.name, c.pool.name)
            if key not in by_pool:
                d = c.deployment
                rated = builder.energy_model.rated_costs(c.model, c.gpu, d.precision, d.tensor_parallel).costs
                costs = truth.costs(rated, c.gpu.name, self.seed, f"{key[0]}/{key[1]}", residuals)
                settings = None if autoscaling is None else autoscaling.for_pool(c, costs.max_num_seqs)
                if settings is not None and plan is not None and key in plan.replicas:
                    # The plan's hour at the start: its warm replicas are up from the first request.
                    low, high = warm_replicas_at(plan, *key, first_arrival)
                    settings = dataclasses.replace(settings, min_replicas=min(low, max(1, high)),
                                                   max_replicas=max(1, high), initial_replicas=low)
                by_pool[key] = PoolSim(c, costs, done, self.seed, prefix_aware=affinity, number=len(by_pool),
                                       knee=knee, autoscaling=settings, start=first_arrival)
            pool_of[c.index] = by_pool[key]
        for number, sim_pool in enumerate(by_pool.values()):
            assert sim_pool.number == number
            home = sim_pool.candidate.region
            pool_regions.append((region_index[home.name], home.grid_zone, home.pue, home))
        region_pools: dict[str, list[PoolSim]] = {}
        for (region, _), pool in by_pool.items():
            region_pools.setdefault(region, []).append(pool)
        data = SimDataLayer(builder, self.carbon, region_pools, self.scenario.refresh_s, affinity=affinity)

        for outage in self.scenario.region_outages:
            heapq.heappush(heap, (outage.start, seq_no, _DOWN, outage.region, 0))
            heapq.heappush(heap, (outage.end, seq_no + 1, _UP, outage.region, 0))
            seq_no += 2
        last_event = first_arrival
        forecast = (
            CarbonForecast(self.carbon, deferral.forecast_error, self.seed, deferral.horizon_h)
            if deferral is not None else None
        )

        def hold(row: int, request: Request, now: float, snap: FleetSnapshot, decision: Decision,
                 class_budget_s: float) -> None:
            """A deferrable request decided at arrival: dispatch now or hold until its window."""
            nonlocal seq_no
            assert deferral is not None and forecast is not None
            candidate = decision.fleet[decision.survivor_index[decision.order[0]]]
            needs = deferral.needs_s(predicted_completion_s(predictions, snap, request, candidate))
            release = choose_release(forecast.points(candidate.region.grid_zone, now), now, deadline[row], needs,
                                     min_gain=deferral.min_gain)
            reasons[release.reason] += 1
            if release.at <= now:
                dispatch(job(row, request, now, decision), now, snap)
                return
            held[row] = (request, class_budget_s)
            released[row] = release.at
            heapq.heappush(heap, (release.at, seq_no, _RELEASE, row, 0))
            seq_no += 1

        def release(row: int, now: float) -> None:
            """A held request's release: decided afresh, with the time left to its deadline."""
            nonlocal sched_ns, snapshot_ns
            request, class_budget = held.pop(row)
            mark = clock()
            snap = data.snapshot(now)
            slo_s = max(0.0, min(class_budget, deadline[row] - now))
            request = dataclasses.replace(request, ttft_slo_ms=slo_s * 1e3)
            budget[row] = slo_s
            mid = clock()
            decision = scheduler.schedule(request, snap)
            snapshot_ns += mid - mark
            sched_ns += clock() - mid
            if decision.fallbacks:
                fallback_ages.record(decision.fallbacks, now - snap.now)
            if decision.schedulable:
                dispatch(job(row, request, now, decision), now, snap)
            else:
                counters["unschedulable"] += 1
                if decision.rejected:
                    unschedulable_by[decision.rejected[-1].plugin] += 1

        # Per request row: the factor on its predicted RTT and the time added to it (None: the
        # RTT as predicted).
        rtt_draws = None if truth.exact_rtt else truth.rtt_draws(self.seed, self.first_row, n)

        def dispatch(job: Job, now: float, snap: FleetSnapshot) -> None:
            nonlocal seq_no
            decision = job.decision
            fleet, survivors, order = decision.fleet, decision.survivor_index, decision.order
            first = job.rank
            for k in range(first, len(order)):
                candidate = fleet[survivors[order[k]]]
                pool = pool_of[candidate.index]
                if pool.down:
                    continue
                job.rank = k
                job.pool = pool
                if k > first:
                    counters["failovers"] += k - first
                request = job.request
                job.predicted_j, job.predicted_ttft_s, rtt, prefill = predictions.at_dispatch(snap, request, candidate)
                if rtt_draws is not None:
                    row = job.row
                    rtt = rtt * float(rtt_draws[0][row]) + float(rtt_draws[1][row])
                job.rtt_s = rtt
                data.record_dispatch(snap, candidate, request, now, prefill)
                pool.sent(request.prompt_tokens)
                if not pool.replicas:
                    counters["queued"] += 1
                    pool.hold(job)
                    autoscaler = pool.autoscaler
                    if autoscaler is not None and autoscaler.target == 0:  # Ray Serve's cold-start fast path
                        scale(pool, now, autoscaler.decide(now, 0, pool.ongoing))
                    return
                replica = pool.choose(job)
                if replica.waiting or not replica.can_admit(job):
                    counters["queued"] += 1
                then = replica.arrive(job, now)
                if then is not None:
                    heapq.heappush(heap, (then, seq_no, _STEP, replica, replica.version))
                    seq_no += 1
                return
            counters["failed"] += 1

        def handle(event: tuple[float, int, int, object, int]) -> None:
            nonlocal seq_no, last_event
            now, _, kind, subject, version = event
            if kind == _STEP:
                assert isinstance(subject, Replica)
                if version == subject.version:
                    last_event = now
                    then = subject.boundary(now)
                    if then is not None:
                        heapq.heappush(heap, (then, seq_no, _STEP, subject, subject.version))
                        seq_no += 1
                return
            if kind == _RELEASE:
                assert isinstance(subject, int)
                release(subject, now)
                return
            if kind == _TICK:
                tick(now)
                return
            if kind == _READY:
                assert isinstance(subject, PoolSim)
                for replica, then in subject.ready(now):
                    heapq.heappush(heap, (then, seq_no, _STEP, replica, replica.version))
                    seq_no += 1
                data.replicas_changed(subject)
                return
            if kind == _ARRIVE:
                assert isinstance(subject, int)
                arrival[subject] = now
                if has_deferrable:
                    released[subject] = now
                arrive(subject, now)
                return
            region = str(subject)
            down = kind == _DOWN
            for pool in region_pools.get(region, ()):
                pool.down = down
            if down:
                data.down.add(region)
                snap = data.snapshot(now)
                for pool in region_pools.get(region, ()):
                    for seq in pool.drain():
                        assert isinstance(seq, Job)
                        seq.rank += 1
                        dispatch(seq, now, snap)
            else:
                data.down.discard(region)

        prefix_tokens = w.prefix_tokens
        leaves = None if flows is None else flows.leaves

        def job(row: int, request: Request, now: float, decision: Decision) -> Job:
            return Job(row, request, now, prefix_tokens[row], decision, None if leaves is None else leaves[row])

        bar = tqdm(total=n, unit="req", desc=self.policy.name + ("" if deferring or not has_deferrable else " (at arrival)"),
                   disable=not progress, mininterval=0.5)
        clock = time.perf_counter_ns
        deadline_s = w.deferrable_deadline_s
        arrived = 0
        # (workload class, prompt tokens) -> the TTFT budget of a request with no SLO of its own
        # under the policy (every snapshot's): ``ttft_budget_s`` once per distinct pair.
        budgets: dict[tuple[str, int], float] = {}

        def arrive(i: int, t: float) -> None:
            """Request ``i`` arrives at ``t``: decided, then dispatched, held or unschedulable."""
            nonlocal sched_ns, snapshot_ns, arrived
            mark = clock()
            snap = data.snapshot(t)
            request = factory.request(i)
            if request.ttft_slo_ms is None:
                kind = (request.workload_class, request.prompt_tokens)
                class_budget_s = budgets.get(kind)
                if class_budget_s is None:
                    class_budget_s = budgets[kind] = ttft_budget_s(request, snap)
                budget[i] = class_budget_s
            else:
                budget[i] = ttft_budget_s(request, snap)
            deferrable = has_deferrable and classes[i] == _DEFERRABLE
            if deferrable:
                # Its deadline; a TTFT SLO no longer than that.
                class_budget = budget[i]
                if deadline_s is not None and deadline_s < class_budget:
                    request = dataclasses.replace(request, ttft_slo_ms=deadline_s * 1e3)
                    budget[i] = deadline_s
                deadline[i] = t + (class_budget if deadline_s is None else deadline_s)
            mid = clock()
            decision = scheduler.schedule(request, snap)
            done_ns = clock()
            snapshot_ns += mid - mark
            sched_ns += done_ns - mid
            if decision.fallbacks:
                fallback_ages.record(decision.fallbacks, t - snap.now)
            if decision.schedulable and deferrable and deferring and request.holdable:
                hold(i, request, t, snap, decision, budget[i])
            elif decision.schedulable:
                if deferrable and deferring:
                    reasons["chain"] += 1  # the router's release reason for it (scheduler.server.deferral_api)
                dispatch(job(i, request, t, decision), t, snap)
            else:
                counters["unschedulable"] += 1
                if decision.rejected:
                    unschedulable_by[decision.rejected[-1].plugin] += 1
            arrived += 1
            if arrived % PROGRESS_EVERY == 0:
                bar.update(PROGRESS_EVERY)

        pools = list(by_pool.values())
        # Per pool: its busy time, warm time and cold-start energy at the last booking; energy
        # booked per (pool, epoch hour) [J].
        booked = [(0.0, 0.0, 0.0)] * len(pools)
        idle_by_hour: dict[tuple[int, int], float] = {}
        cold_by_hour: dict[tuple[int, int], float] = {}
        last_booking = first_arrival
        # the shortest metrics interval of the fleet's autoscalers (each pool samples on its own)
        tick_s = min((p.autoscaler.settings.metrics_interval_s for p in pools if p.autoscaler is not None),
                     default=3600.0)

        def book(now: float) -> None:
            """Book each pool's idle and cold-start energy since the last booking to that
            booking's hour."""
            nonlocal last_booking
            hour = int(last_booking // 3600)
            for pool in pools:
                pool.mark(now)
                busy, warm, cold = pool.busy_s, pool.warm_s, pool.cold_start_j
                was_busy, was_warm, was_cold = booked[pool.number]
                key = (pool.number, hour)
                idle_by_hour[key] = idle_by_hour.get(key, 0.0) + pool.costs.idle_w * (warm - was_warm - (busy - was_busy))
                if cold != was_cold:
                    cold_by_hour[key] = cold_by_hour.get(key, 0.0) + cold - was_cold
                booked[pool.number] = (busy, warm, cold)
            last_booking = now

        def scale(pool: PoolSim, now: float, target: int) -> None:
            nonlocal seq_no
            autoscaler = pool.autoscaler
            assert autoscaler is not None
            for ready_at in pool.scale_to(target, now, autoscaler.settings.cold_start_s,
                                          autoscaler.settings.cold_start_j):
                heapq.heappush(heap, (ready_at, seq_no, _READY, pool, 0))
                seq_no += 1
            data.replicas_changed(pool)

        def planned_bounds(pool: PoolSim, autoscaler: PoolAutoscaler, now: float) -> None:
            """The plan's (min, max) replicas of the hour as the autoscaler's bounds (a max of 0,
            "send nothing here", is 1: Ray Serve's least; the pool's replicas at most)."""
            assert plan is not None
            key = (pool.candidate.region.name, pool.candidate.pool.name)
            if key in plan.replicas:
                low, high = warm_replicas_at(plan, *key, now)
                top = min(max(1, high), replicas_of(pool.candidate))
                autoscaler.low, autoscaler.high = min(low, top), top

        def tick(now: float) -> None:
            """Book the fleet's energy; each pool that is up samples its load and scales."""
            nonlocal seq_no
            book(now)
            if autoscaling is not None:
                for pool in pools:
                    autoscaler = pool.autoscaler
                    assert autoscaler is not None
                    pool.stop_drained(now)
                    if pool.down or not autoscaler.due(now):
                        continue
                    if plan is not None:
                        planned_bounds(pool, autoscaler, now)
                    ongoing = autoscaler.observe(now, pool.ongoing)
                    target = autoscaler.decide(now, len(pool.replicas), ongoing)
                    if target != len(pool.replicas) + len(pool.starting):
                        scale(pool, now, target)
            if now + tick_s <= last_root:
                heapq.heappush(heap, (now + tick_s, seq_no, _TICK, None, 0))
                seq_no += 1

        if n:
            first_tick = math.floor(first_arrival / tick_s) * tick_s + tick_s
            if first_tick <= last_root:
                heapq.heappush(heap, (first_tick, seq_no, _TICK, None, 0))
                seq_no += 1

        for i in roots:
            t = arrival[i]
            # Step boundaries at t (to within TIE_S) come after the arrival, which joins that
            # step (``scheduler.sim.replica``, "Ties"); outages at t before.
            due = t - TIE_S
            while heap and (heap[0][0] < due or (heap[0][0] <= t and heap[0][2] != _STEP)):
                handle(heapq.heappop(heap))
            arrive(i, t)
        while heap:
            handle(heapq.heappop(heap))
        bar.update(n - bar.n)
        bar.close()

        end = max(last_event, last_root, self.span_until or -math.inf)
        book(end)
        busy_s: dict[str, float] = {}
        replica_s: dict[str, float] = {}
        pool_energy: list[PoolEnergy] = []
        for (region, pool_name), pool in by_pool.items():
            place = f"{region}/{pool_name}"
            replica_s[place] = pool.warm_s
            busy_s[place] = pool.busy_s
            _, zone, pue, _ = pool_regions[pool.number]
            idle_hours = {hour: j for (number, hour), j in idle_by_hour.items() if number == pool.number}
            cold_hours = {hour: j for (number, hour), j in cold_by_hour.items() if number == pool.number}
            pool_energy.append(PoolEnergy(
                place=place, region=region, pue=pue,
                idle_j=sum(idle_hours.values()),
                idle_g=sum(j / J_PER_KWH * intensity(zone, hour * 3600.0) * pue for hour, j in idle_hours.items()),
                cold_start_j=pool.cold_start_j,
                cold_start_g=sum(j / J_PER_KWH * intensity(zone, hour * 3600.0) * pue for hour, j in cold_hours.items()),
                cold_starts=pool.cold_starts,
                step_j=pool.step_energy_j,
                warm_s=pool.warm_s,
            ))
        idle_j = sum(p.idle_j for p in pool_energy)

        ran_in_a = np.asarray(ran_in, dtype=np.int64)
        latency_a = np.asarray(latency)
        energy_a = np.asarray(energy)
        grams_a = np.asarray(grams)
        deferral_figures = None
        if has_deferrable:
            rows = [i for i, c in enumerate(classes) if c == _DEFERRABLE]
            deferral_figures = deferral_summary(rows, arrival, deadline, released, ran_in_a, latency_a, energy_a,
                                                grams_a, reasons)
            deferral_figures["deferral"] = "queue" if deferring else "at-arrival"

        return RunOutcome(
            policy=self.policy.name,
            regions=region_names,
            ran_in=ran_in_a,
            ttft_s=np.asarray(ttft),
            queue_wait_s=np.asarray(queue_wait),
            latency_s=latency_a,
            budget_s=np.asarray(budget),
            energy_j=energy_a,
            grams=grams_a,
            output_tokens=np.asarray(w.output_tokens),
            prompt_tokens=np.asarray(w.prompt_tokens),
            ran_pool=np.asarray(ran_pool, dtype=np.int64),
            pool_gpus=[pool.candidate.gpu.name for pool in by_pool.values()],
            predicted_j=np.asarray(predicted_j),
            predicted_ttft_s=np.asarray(predicted_ttft),
            hourly=np.asarray(hourly, dtype=np.int64).reshape(len(hourly), len(region_names)),
            start=start_hour,
            counters=counters,
            fallback_ages=fallback_ages,
            unschedulable_by=unschedulable_by,
            busy_s=busy_s,
            replica_s=replica_s,
            idle_j=idle_j,
            pool_energy=pool_energy,
            autoscaled=autoscaling is not None,
            timings_s={
                "total": time.perf_counter() - started_wall,
                "schedule": sched_ns / 1e9,
                "snapshot_and_request": snapshot_ns / 1e9,
            },
            deferral=deferral_figures,
            workflow=None if flows is None else workflow_figures(flows, ran_pool, arrival, latency_a),
        )
