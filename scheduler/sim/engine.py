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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from scheduler.config.compile import compile_fleet, compile_policy
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
        run = _Run(self, progress)
        run.play()
        return run.result(started_wall)


# An event: (time, tie-break, kind, subject, version).
_Event = tuple[float, int, int, object, int]


class _Events:
    """The event heap, in time order; the tie-break is the order the events were pushed in."""

    __slots__ = ("heap", "pushed")

    def __init__(self) -> None:
        self.heap: list[_Event] = []
        self.pushed = 0

    def push(self, at: float, kind: int, subject: object, version: int = 0) -> None:
        heapq.heappush(self.heap, (at, self.pushed, kind, subject, version))
        self.pushed += 1


@dataclass
class _Tally:
    """What the run measures: per request (in workload order; -1 / NaN: never ran; lists, as the
    loop writes one item at a time) and in totals."""

    arrival: list[float]
    ran_in: list[int]
    ttft: list[float]
    queue_wait: list[float]
    latency: list[float]
    budget: list[float]
    energy: list[float]
    grams: list[float]
    predicted_j: list[float]
    predicted_ttft: list[float]
    # the pool each request ran in (its ``PoolSim.number``)
    ran_pool: list[int]
    # Deferrable requests: their deadlines and release times (empty: the workload has none).
    deadline: list[float]
    released: list[float]
    # Requests per hour (of arrival, from ``start_hour``) and region; grown as later hours are
    # reached (held requests run until their deadline, a workflow's steps after its start).
    hourly: list[list[int]]
    start_hour: float
    regions: int
    counters: Counter[str] = field(default_factory=Counter)
    # the deferral queue's release reasons
    reasons: Counter[str] = field(default_factory=Counter)
    fallback_ages: FallbackAges = field(default_factory=FallbackAges)
    unschedulable_by: Counter[str] = field(default_factory=Counter)
    sched_ns: int = 0
    snapshot_ns: int = 0

    @classmethod
    def empty(cls, arrival: Sequence[float], has_deferrable: bool, start_hour: float, last_root: float,
              regions: int) -> _Tally:
        n = len(arrival)
        return cls(
            arrival=list(arrival), ran_in=[-1] * n, ttft=[math.nan] * n, queue_wait=[math.nan] * n,
            latency=[math.nan] * n, budget=[0.0] * n, energy=[0.0] * n, grams=[0.0] * n,
            predicted_j=[math.nan] * n, predicted_ttft=[math.nan] * n, ran_pool=[-1] * n,
            deadline=[math.nan] * n if has_deferrable else [], released=list(arrival) if has_deferrable else [],
            hourly=[[0] * regions for _ in range(int((last_root - start_hour) // 3600) + 1)], start_hour=start_hour,
            regions=regions,
        )

    def finished(self, job: Job, region: int, grams: float) -> None:
        """``job`` had its last token, in the region at ``region`` in the run's order."""
        assert job.pool is not None
        row = job.row
        self.ran_in[row] = region
        self.ttft[row] = job.rtt_s + job.first_token - job.arrived
        self.queue_wait[row] = job.admitted - job.arrived
        self.latency[row] = job.rtt_s + job.done - job.arrived
        self.energy[row] = job.energy_j
        self.grams[row] = grams
        self.predicted_j[row] = job.predicted_j
        self.predicted_ttft[row] = job.predicted_ttft_s
        self.ran_pool[row] = job.pool.number
        hourly = self.hourly
        hour = int((job.arrived - self.start_hour) // 3600)
        while hour >= len(hourly):
            hourly.append([0] * self.regions)
        hourly[hour][region] += 1

    def unschedulable(self, decision: Decision) -> None:
        self.counters["unschedulable"] += 1
        if decision.rejected:
            self.unschedulable_by[decision.rejected[-1].plugin] += 1


@dataclass(frozen=True)
class _Fleet:
    """The simulated pools: one per (region, pool) serving the workload's model, at its true
    costs, numbered in ``by_pool``'s order (``PoolSim.number``)."""

    by_pool: dict[tuple[str, str], PoolSim]
    pools: list[PoolSim]
    # ``Candidate.index`` -> its pool
    pool_of: dict[int, PoolSim]
    # Per pool number: its region's position in the fleet
    region_of_pool: list[int]
    region_pools: dict[str, list[PoolSim]]


def _build_fleet(sim: Simulation, builder: SnapshotBuilder, first_arrival: float,
                 on_done: Callable[[Seq], None]) -> _Fleet:
    """The run's pools, each with its autoscaler's settings (a plan's pool: its bounds of the first
    hour); ``on_done``: called with each request at its last token."""
    w = sim.workload
    truth = sim.scenario.truth
    autoscaling = sim.scenario.autoscaling
    plan = sim.scenario.plan
    residuals = HeldOutResiduals.load() if truth.gpu_bias else None
    pool_of: dict[int, PoolSim] = {}
    by_pool: dict[tuple[str, str], PoolSim] = {}
    for c in builder.candidates:
        if c.deployment.name != w.model:
            continue
        key = (c.region.name, c.pool.name)
        if key not in by_pool:
            d = c.deployment
            rated = builder.energy_model.rated_costs(c.model, c.gpu, d.precision, d.tensor_parallel).costs
            costs = truth.costs(rated, c.gpu.name, sim.seed, f"{key[0]}/{key[1]}", residuals)
            settings = None if autoscaling is None else autoscaling.for_pool(c, costs.max_num_seqs)
            if settings is not None and plan is not None and key in plan.replicas:
                # The plan's hour at the start: its warm replicas are up from the first request.
                low, high = warm_replicas_at(plan, *key, first_arrival)
                settings = dataclasses.replace(settings, min_replicas=min(low, max(1, high)),
                                               max_replicas=max(1, high), initial_replicas=low)
            by_pool[key] = PoolSim(c, costs, on_done, sim.seed, prefix_aware=sim.scenario.affinity,
                                   number=len(by_pool), knee=truth.knee, autoscaling=settings, start=first_arrival)
        pool_of[c.index] = by_pool[key]
    region_index = {r.name: i for i, r in enumerate(sim.regions)}
    region_of_pool = [region_index[sim_pool.candidate.region.name] for sim_pool in by_pool.values()]
    region_pools: dict[str, list[PoolSim]] = {}
    for (region, _), pool in by_pool.items():
        region_pools.setdefault(region, []).append(pool)
    return _Fleet(by_pool, list(by_pool.values()), pool_of, region_of_pool, region_pools)


@dataclass
class _EnergyBook:
    """The fleet's idle and cold-start energy, booked per (pool number, epoch hour) [J]: at each
    booking, each pool's since the last one, to that one's hour."""

    pools: list[PoolSim]
    last_booking: float
    # Per pool: its busy time, warm time and cold-start energy at the last booking.
    booked: list[tuple[float, float, float]]
    idle_by_hour: dict[tuple[int, int], float] = field(default_factory=dict)
    cold_by_hour: dict[tuple[int, int], float] = field(default_factory=dict)

    def book(self, now: float) -> None:
        hour = int(self.last_booking // 3600)
        idle_by_hour, cold_by_hour = self.idle_by_hour, self.cold_by_hour
        for pool in self.pools:
            pool.mark(now)
            busy, warm, cold = pool.busy_s, pool.warm_s, pool.cold_start_j
            was_busy, was_warm, was_cold = self.booked[pool.number]
            key = (pool.number, hour)
            idle_by_hour[key] = idle_by_hour.get(key, 0.0) + pool.costs.idle_w * (warm - was_warm - (busy - was_busy))
            if cold != was_cold:
                cold_by_hour[key] = cold_by_hour.get(key, 0.0) + cold - was_cold
            self.booked[pool.number] = (busy, warm, cold)
        self.last_booking = now

    def pool_energy(self, fleet: _Fleet, intensity: Callable[[str, float], float]) -> list[PoolEnergy]:
        """Each pool's energy, its grams at the true intensity of the hours it was booked to."""
        pool_energy: list[PoolEnergy] = []
        for (region, pool_name), pool in fleet.by_pool.items():
            zone, pue = pool.candidate.region.grid_zone, pool.candidate.region.pue
            idle_hours = {hour: j for (number, hour), j in self.idle_by_hour.items() if number == pool.number}
            cold_hours = {hour: j for (number, hour), j in self.cold_by_hour.items() if number == pool.number}
            pool_energy.append(PoolEnergy(
                place=f"{region}/{pool_name}", region=region, pue=pue,
                idle_j=sum(idle_hours.values()),
                idle_g=sum(j / J_PER_KWH * intensity(zone, hour * 3600.0) * pue for hour, j in idle_hours.items()),
                cold_start_j=pool.cold_start_j,
                cold_start_g=sum(j / J_PER_KWH * intensity(zone, hour * 3600.0) * pue for hour, j in cold_hours.items()),
                cold_starts=pool.cold_starts,
                step_j=pool.step_energy_j,
                warm_s=pool.warm_s,
            ))
        return pool_energy


class _Run:
    """One ``Simulation.outcome``: the event loop (``play``) and the handlers of its events,
    which measure into ``tally``; ``result`` is the outcome."""

    def __init__(self, sim: Simulation, progress: bool) -> None:
        self.sim = sim
        w = self.workload = sim.workload
        n = len(w)
        # Every request asks for the workload's model: the predictions of the others, which
        # nothing reads, are not kept up to date (``SnapshotBuilder.models``).
        builder = SnapshotBuilder(compile_fleet(sim.regions), compile_policy(sim.policy), models=frozenset((w.model,)))
        self.predictions = Predictions()
        self.scheduler = sim.scheduler or Scheduler.from_registry(default_scheduler_registry(),
                                                                  rng=random.Random(sim.seed))
        self.factory = RequestFactory(w, workflow_ids=sim.scenario.affinity)
        flows = self.flows = w.workflows
        self.roots: Sequence[int] = range(n) if flows is None else flows.roots
        arrival = w.arrival_s
        self.first_arrival = arrival[self.roots[0]] if n else 0.0
        # Hour 0 of the hourly counts (a shard counts its hours from the whole run's start).
        start_hour = self.first_arrival if sim.hour_origin is None else sim.hour_origin
        self.last_root = arrival[self.roots[-1]] if n else start_hour
        self.classes = w.workload_class
        self.has_deferrable = _DEFERRABLE in self.classes
        deferral = self.deferral = sim.scenario.deferral if self.has_deferrable else None
        self.tally = _Tally.empty(arrival, self.has_deferrable, start_hour, self.last_root, len(sim.regions))
        # row -> (the request as it arrived, its class's TTFT budget [s]) while held
        self.held: dict[int, tuple[Request, float]] = {}
        # Workflows: the parents each step still waits for, and when the last one's reached the client.
        self.waits_for = [len(parents) for parents in flows.after] if flows is not None else []
        self.ready_at = [-math.inf] * n if flows is not None else []
        self.intensity = sim.carbon.intensity
        self.events = _Events()
        self.fleet = _build_fleet(sim, builder, self.first_arrival, self.done)
        self.data = SimDataLayer(builder, sim.carbon, self.fleet.region_pools, sim.scenario.refresh_s,
                                 affinity=sim.scenario.affinity)
        for outage in sim.scenario.region_outages:
            self.events.push(outage.start, _DOWN, outage.region)
            self.events.push(outage.end, _UP, outage.region)
        # the last step boundary handled
        self.last_event = self.first_arrival
        self.forecast = (
            CarbonForecast(sim.carbon, deferral.forecast_error, sim.seed, deferral.horizon_h)
            if deferral is not None else None
        )
        # Per request row: the factor on its predicted RTT and the time added to it (None: the
        # RTT as predicted).
        self.rtt_draws = None if sim.scenario.truth.exact_rtt else sim.scenario.truth.rtt_draws(sim.seed,
                                                                                               sim.first_row, n)
        self.bar = tqdm(total=n, unit="req", mininterval=0.5, disable=not progress,
                        desc=sim.policy.name + ("" if deferral is not None or not self.has_deferrable
                                                else " (at arrival)"))
        self.arrived = 0
        # (workload class, prompt tokens) -> the TTFT budget of a request with no SLO of its own
        # under the policy (every snapshot's): ``ttft_budget_s`` once per distinct pair.
        self.budgets: dict[tuple[str, int], float] = {}
        pools = self.fleet.pools
        self.energy = _EnergyBook(pools, self.first_arrival, [(0.0, 0.0, 0.0)] * len(pools))
        self.autoscaling = sim.scenario.autoscaling
        self.plan = sim.scenario.plan
        # the shortest metrics interval of the fleet's autoscalers (each pool samples on its own)
        self.tick_s = min((p.autoscaler.settings.metrics_interval_s for p in pools if p.autoscaler is not None),
                          default=3600.0)
        if n:
            first_tick = math.floor(self.first_arrival / self.tick_s) * self.tick_s + self.tick_s
            if first_tick <= self.last_root:
                self.events.push(first_tick, _TICK, None)

    # The event loop.

    def play(self) -> None:
        """The workload's arrivals in order, each after the events due before it; then the
        events left."""
        heap = self.events.heap
        arrival = self.tally.arrival
        for i in self.roots:
            t = arrival[i]
            # Step boundaries at t (to within TIE_S) come after the arrival, which joins that
            # step (``scheduler.sim.replica``, "Ties"); outages at t before.
            due = t - TIE_S
            while heap and (heap[0][0] < due or (heap[0][0] <= t and heap[0][2] != _STEP)):
                self.handle(heapq.heappop(heap))
            self.arrive(i, t)
        while heap:
            self.handle(heapq.heappop(heap))
        self.bar.update(len(self.workload) - self.bar.n)
        self.bar.close()

    def handle(self, event: _Event) -> None:
        now, _, kind, subject, version = event
        if kind == _STEP:
            assert isinstance(subject, Replica)
            if version == subject.version:
                self.last_event = now
                then = subject.boundary(now)
                if then is not None:
                    self.events.push(then, _STEP, subject, subject.version)
        elif kind == _RELEASE:
            assert isinstance(subject, int)
            self.release(subject, now)
        elif kind == _TICK:
            self.tick(now)
        elif kind == _READY:
            assert isinstance(subject, PoolSim)
            for replica, then in subject.ready(now):
                self.events.push(then, _STEP, replica, replica.version)
            self.data.replicas_changed(subject)
        elif kind == _ARRIVE:
            assert isinstance(subject, int)
            self.tally.arrival[subject] = now
            if self.has_deferrable:
                self.tally.released[subject] = now
            self.arrive(subject, now)
        elif kind == _DOWN:
            self.region_down(str(subject), now)
        else:
            self.region_up(str(subject))

    # Arrivals: decided, then dispatched, held or unschedulable.

    def arrive(self, row: int, t: float) -> None:
        """Request ``row`` arrives at ``t``."""
        mark = time.perf_counter_ns()
        snap = self.data.snapshot(t)
        request = self.factory.request(row)
        budget = self.tally.budget
        budget[row] = self.budget_s(request, snap)
        deferrable = self.has_deferrable and self.classes[row] == _DEFERRABLE
        if deferrable:
            request = self.with_deadline(row, request, t)
        decision = self.decide(request, snap, t, mark)
        queueable = deferrable and self.deferral is not None
        if decision.schedulable and queueable and request.holdable:
            self.hold(row, request, t, snap, decision, budget[row])
        elif decision.schedulable:
            if queueable:
                self.tally.reasons["chain"] += 1  # the router's release reason for it (scheduler.server.deferral_api)
            self.dispatch(self.job(row, request, t, decision), t, snap)
        else:
            self.tally.unschedulable(decision)
        self.arrived += 1
        if self.arrived % PROGRESS_EVERY == 0:
            self.bar.update(PROGRESS_EVERY)

    def budget_s(self, request: Request, snap: FleetSnapshot) -> float:
        """The request's TTFT budget: its own SLO's, else its class's under the policy."""
        if request.ttft_slo_ms is not None:
            return ttft_budget_s(request, snap)
        kind = (request.workload_class, request.prompt_tokens)
        class_budget_s = self.budgets.get(kind)
        if class_budget_s is None:
            class_budget_s = self.budgets[kind] = ttft_budget_s(request, snap)
        return class_budget_s

    def with_deadline(self, row: int, request: Request, t: float) -> Request:
        """A deferrable request's deadline; a TTFT SLO no longer than that."""
        budget = self.tally.budget
        class_budget = budget[row]
        deadline_s = self.workload.deferrable_deadline_s
        self.tally.deadline[row] = t + (class_budget if deadline_s is None else deadline_s)
        if deadline_s is not None and deadline_s < class_budget:
            budget[row] = deadline_s
            return dataclasses.replace(request, ttft_slo_ms=deadline_s * 1e3)
        return request

    def decide(self, request: Request, snap: FleetSnapshot, now: float, mark: int) -> Decision:
        """The scheduler's decision, timed (``mark``: when getting the snapshot began), and the
        true ages of its fallbacks' signals."""
        tally = self.tally
        mid = time.perf_counter_ns()
        decision = self.scheduler.schedule(request, snap)
        decided = time.perf_counter_ns()
        tally.snapshot_ns += mid - mark
        tally.sched_ns += decided - mid
        if decision.fallbacks:
            tally.fallback_ages.record(decision.fallbacks, now - snap.now)
        return decision

    def job(self, row: int, request: Request, now: float, decision: Decision) -> Job:
        leaves = None if self.flows is None else self.flows.leaves[row]
        return Job(row, request, now, self.workload.prefix_tokens[row], decision, leaves)

    def hold(self, row: int, request: Request, now: float, snap: FleetSnapshot, decision: Decision,
             class_budget_s: float) -> None:
        """A deferrable request decided at arrival: dispatch now or hold until its window."""
        deferral, forecast = self.deferral, self.forecast
        assert deferral is not None and forecast is not None
        candidate = decision.fleet[decision.survivor_index[decision.order[0]]]
        needs = deferral.needs_s(predicted_completion_s(self.predictions, snap, request, candidate))
        release = choose_release(forecast.points(candidate.region.grid_zone, now), now, self.tally.deadline[row],
                                 needs, min_gain=deferral.min_gain)
        self.tally.reasons[release.reason] += 1
        if release.at <= now:
            self.dispatch(self.job(row, request, now, decision), now, snap)
            return
        self.held[row] = (request, class_budget_s)
        self.tally.released[row] = release.at
        self.events.push(release.at, _RELEASE, row)

    def release(self, row: int, now: float) -> None:
        """A held request's release: decided afresh, with the time left to its deadline."""
        request, class_budget = self.held.pop(row)
        mark = time.perf_counter_ns()
        snap = self.data.snapshot(now)
        slo_s = max(0.0, min(class_budget, self.tally.deadline[row] - now))
        request = dataclasses.replace(request, ttft_slo_ms=slo_s * 1e3)
        self.tally.budget[row] = slo_s
        decision = self.decide(request, snap, now, mark)
        if decision.schedulable:
            self.dispatch(self.job(row, request, now, decision), now, snap)
        else:
            self.tally.unschedulable(decision)

    def dispatch(self, job: Job, now: float, snap: FleetSnapshot) -> None:
        """Down the decision's ranking from ``job.rank``: the first pool that is up takes it."""
        decision = job.decision
        fleet, survivors, order = decision.fleet, decision.survivor_index, decision.order
        counters = self.tally.counters
        first = job.rank
        for k in range(first, len(order)):
            candidate = fleet[survivors[order[k]]]
            pool = self.fleet.pool_of[candidate.index]
            if pool.down:
                continue
            job.rank = k
            job.pool = pool
            if k > first:
                counters["failovers"] += k - first
            request = job.request
            job.predicted_j, job.predicted_ttft_s, rtt, prefill = self.predictions.at_dispatch(snap, request, candidate)
            if self.rtt_draws is not None:
                row = job.row
                rtt = rtt * float(self.rtt_draws[0][row]) + float(self.rtt_draws[1][row])
            job.rtt_s = rtt
            self.data.record_dispatch(snap, candidate, request, now, prefill)
            pool.sent(request.prompt_tokens)
            if not pool.replicas:
                counters["queued"] += 1
                pool.hold(job)
                autoscaler = pool.autoscaler
                if autoscaler is not None and autoscaler.target == 0:  # Ray Serve's cold-start fast path
                    self.scale(pool, now, autoscaler.decide(now, 0, pool.ongoing))
                return
            replica = pool.choose(job)
            if replica.waiting or not replica.can_admit(job):
                counters["queued"] += 1
            then = replica.arrive(job, now)
            if then is not None:
                self.events.push(then, _STEP, replica, replica.version)
            return
        counters["failed"] += 1

    # Completions.

    def done(self, seq: Seq) -> None:
        """A request's last token: its outcome and compliance, prefix reuse, and the workflow
        steps that waited only for it."""
        assert isinstance(seq, Job) and seq.pool is not None
        request = seq.request
        region = seq.pool.candidate.region
        tally = self.tally
        tally.finished(seq, self.fleet.region_of_pool[seq.pool.number],
                       seq.energy_j / J_PER_KWH * self.intensity(region.grid_zone, seq.admitted) * region.pue)
        counters = tally.counters
        if request.allowed_jurisdictions and region.jurisdiction not in request.allowed_jurisdictions:
            counters["violations"] += 1
        if request.required_certifications and not request.required_certifications.issubset(region.certifications):
            counters["violations"] += 1
        if seq.cached:
            counters["prefix_hits"] += 1
            counters["reused_tokens"] += seq.cached
            if self.data.affinity is not None and request.prefix_key is not None:
                self.data.affinity.record_hit(region.name, seq.pool.candidate.pool.name, request.prefix_key,
                                              seq.cached, seq.done)
        if self.flows is not None:
            self.next_steps(seq.row, seq.done + seq.rtt_s)

    def next_steps(self, row: int, at_client: float) -> None:
        """Request ``row``'s last token reached the client at ``at_client``: each workflow step
        that waited for nothing else arrives after its think time."""
        flows = self.flows
        assert flows is not None
        ready_at, waits_for = self.ready_at, self.waits_for
        for child in flows.children[row]:
            ready_at[child] = max(ready_at[child], at_client)
            waits_for[child] -= 1
            if waits_for[child] == 0:
                self.events.push(ready_at[child] + flows.think_s[child], _ARRIVE, child)

    # Outages.

    def region_down(self, region: str, now: float) -> None:
        """Its pools take nothing more; the requests waiting in them fail over down their rankings."""
        pools = self.fleet.region_pools.get(region, ())
        for pool in pools:
            pool.down = True
        self.data.down.add(region)
        snap = self.data.snapshot(now)
        for pool in pools:
            for seq in pool.drain():
                assert isinstance(seq, Job)
                seq.rank += 1
                self.dispatch(seq, now, snap)

    def region_up(self, region: str) -> None:
        for pool in self.fleet.region_pools.get(region, ()):
            pool.down = False
        self.data.down.discard(region)

    # Ticks: the fleet's energy booked and, autoscaling, each pool scaled.

    def tick(self, now: float) -> None:
        """Book the fleet's energy; each pool that is up samples its load and scales."""
        self.energy.book(now)
        if self.autoscaling is not None:
            for pool in self.fleet.pools:
                self.autoscale(pool, now)
        if now + self.tick_s <= self.last_root:
            self.events.push(now + self.tick_s, _TICK, None)

    def autoscale(self, pool: PoolSim, now: float) -> None:
        autoscaler = pool.autoscaler
        assert autoscaler is not None
        pool.stop_drained(now)
        if pool.down or not autoscaler.due(now):
            return
        if self.plan is not None:
            self.planned_bounds(pool, autoscaler, now)
        ongoing = autoscaler.observe(now, pool.ongoing)
        target = autoscaler.decide(now, len(pool.replicas), ongoing)
        if target != len(pool.replicas) + len(pool.starting):
            self.scale(pool, now, target)

    def planned_bounds(self, pool: PoolSim, autoscaler: PoolAutoscaler, now: float) -> None:
        """The plan's (min, max) replicas of the hour as the autoscaler's bounds (a max of 0,
        "send nothing here", is 1: Ray Serve's least; the pool's replicas at most)."""
        plan = self.plan
        assert plan is not None
        key = (pool.candidate.region.name, pool.candidate.pool.name)
        if key in plan.replicas:
            low, high = warm_replicas_at(plan, *key, now)
            top = min(max(1, high), replicas_of(pool.candidate))
            autoscaler.low, autoscaler.high = min(low, top), top

    def scale(self, pool: PoolSim, now: float, target: int) -> None:
        autoscaler = pool.autoscaler
        assert autoscaler is not None
        for ready_at in pool.scale_to(target, now, autoscaler.settings.cold_start_s,
                                      autoscaler.settings.cold_start_j):
            self.events.push(ready_at, _READY, pool)
        self.data.replicas_changed(pool)

    # The outcome.

    def result(self, started_wall: float) -> RunOutcome:
        """The outcome, the fleet's energy booked to the end of the span (``started_wall``: when
        the run began, wall clock)."""
        sim, w, tally, fleet = self.sim, self.workload, self.tally, self.fleet
        self.energy.book(max(self.last_event, self.last_root, sim.span_until or -math.inf))
        pool_energy = self.energy.pool_energy(fleet, self.intensity)
        places = [f"{region}/{pool_name}" for region, pool_name in fleet.by_pool]
        ran_in = np.asarray(tally.ran_in, dtype=np.int64)
        latency = np.asarray(tally.latency)
        energy = np.asarray(tally.energy)
        grams = np.asarray(tally.grams)
        region_names = [r.name for r in sim.regions]
        hourly = tally.hourly
        return RunOutcome(
            policy=sim.policy.name,
            regions=region_names,
            ran_in=ran_in,
            ttft_s=np.asarray(tally.ttft),
            queue_wait_s=np.asarray(tally.queue_wait),
            latency_s=latency,
            budget_s=np.asarray(tally.budget),
            energy_j=energy,
            grams=grams,
            output_tokens=np.asarray(w.output_tokens),
            prompt_tokens=np.asarray(w.prompt_tokens),
            ran_pool=np.asarray(tally.ran_pool, dtype=np.int64),
            pool_gpus=[pool.candidate.gpu.name for pool in fleet.by_pool.values()],
            predicted_j=np.asarray(tally.predicted_j),
            predicted_ttft_s=np.asarray(tally.predicted_ttft),
            hourly=np.asarray(hourly, dtype=np.int64).reshape(len(hourly), len(region_names)),
            start=tally.start_hour,
            counters=tally.counters,
            fallback_ages=tally.fallback_ages,
            unschedulable_by=tally.unschedulable_by,
            busy_s={place: pool.busy_s for place, pool in zip(places, fleet.by_pool.values(), strict=True)},
            replica_s={place: pool.warm_s for place, pool in zip(places, fleet.by_pool.values(), strict=True)},
            idle_j=sum(p.idle_j for p in pool_energy),
            pool_energy=pool_energy,
            autoscaled=self.autoscaling is not None,
            timings_s={
                "total": time.perf_counter() - started_wall,
                "schedule": tally.sched_ns / 1e9,
                "snapshot_and_request": tally.snapshot_ns / 1e9,
            },
            deferral=self.deferral_figures(ran_in, latency, energy, grams),
            workflow=None if self.flows is None else workflow_figures(self.flows, tally.ran_pool, tally.arrival,
                                                                      latency),
        )

    def deferral_figures(self, ran_in: np.ndarray, latency: np.ndarray, energy: np.ndarray,
                         grams: np.ndarray) -> dict[str, Any] | None:
        """The deferrable requests' figures (None: the workload has none)."""
        if not self.has_deferrable:
            return None
        tally = self.tally
        rows = [i for i, c in enumerate(self.classes) if c == _DEFERRABLE]
        figures = deferral_summary(rows, tally.arrival, tally.deadline, tally.released, ran_in, latency, energy,
                                   grams, tally.reasons)
        figures["deferral"] = "queue" if self.deferral is not None else "at-arrival"
        return figures
