"""The requests a region's gateway has in flight: where each runs, the batch it shared, and
its share of the GPU energy the gateway meters.

A request is ``start``-ed when the gateway admits it (its pool and requested model), gets
its replica's reports (``report``, ``scheduler.region.replica_report``: the first places it on
that replica, the last closes its lifetime there), the token counts the engine streams
(``progress``: vLLM's continuous usage, prompt tokens and completion tokens so far), and is
``finish``-ed when its stream ends.

**Batch** (``RequestShare.mean_batch``): the running sequences of its replica averaged over
its lifetime there, from the replica's own first and last report (``lifetime_batch``);
never the pool's in-flight count, which adds up every replica and the queue. A request
without both reports (its replica did not report) is billed at batch 1, the energy model's
largest bill.

**Measured energy** (``meter`` and ``finish`` given NVML readings of this node's GPUs). Each
GPU's interval between two readings where its counter moved is split among the requests on
that GPU by rule "predicted-share-v1" (``scheduler.energy.attribution.split_interval``),
each request's work priced by the step model at its replica's operating point in the
interval (the running count the replica last reported, the mean context of its requests):

    prefill  E_prefill(prompt)                              once, in the interval its first tokens arrived
    decode   E_decode(prompt, n1) - E_decode(prompt, n0)    its completion tokens n0 -> n1

A GPU runs the requests of the replicas that claim it (their reports' GPUs, on this node)
or, where none does, those of the replicas that could not say which GPUs they hold. A
replica's claim lapses ``claim_ttl_s`` after its last report once none of its requests is in
flight. An interval with no request on its GPU is idle: its joules go to the idle counter of
the pools that claim the GPU ("unclaimed" when none does), to no request. A request's GPUs
close their interval when it ends, so its last tokens are weighed before its bill is made;
a GPU whose counter has not moved since its last reading keeps its interval open (the
driver updates the counter every 20-100 ms).

The meter's resolution (``nvml.boundary_error_j``: E_lag per GPU and reading) adds to a
request's half-width wherever its fraction f of a GPU's interval changes across a reading:

    meter_error_i = sum over the readings of |f_i(after) - f_i(before)| x E_lag(reading)

(f_i is 0 before the request came and after it left).

**Published running** per pool (``running``): over its replicas, the running count each last
reported, at most the requests this gateway has on it.

The clock is injected; every method is synchronous.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from scheduler.energy.attribution import ONLINE_RULE, Work, split_interval
from scheduler.energy.nvml import GpuEnergyReading, boundary_error_j
from scheduler.energy.step import EnergyCoefficients
from scheduler.region.replica_report import ReplicaReport, lifetime_batch

UNCLAIMED = "unclaimed"


class Pricing(Protocol):
    """The step model as the accounts price work with (``energy_report.RegionPricing``)."""

    def coefficients(self, pool: str, model: str, batch: float, context: float) -> EnergyCoefficients: ...

    def ratio_error(self, pool: str, model: str) -> float: ...


@dataclass(frozen=True, slots=True)
class MeasuredEnergy:
    """A request's share of the metered GPU energy (module doc)."""

    prefill_j: float
    decode_j: float
    model_error_j: float
    meter_error_j: float
    # Intervals it had a share of.
    intervals: int

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j


@dataclass(frozen=True, slots=True)
class RequestShare:
    """What one finished request shared while it was in flight."""

    duration_s: float
    mean_batch: float
    # None: no replica reported it.
    replica: str | None
    # None: no metered interval had it (no GPU meter, or its GPUs are not this node's).
    measured: MeasuredEnergy | None


@dataclass(frozen=True, slots=True)
class IntervalRecord:
    """One closed interval of one GPU: measured = attributed + idle."""

    gpu: int
    start: float
    end: float
    measured_j: float
    attributed_j: float
    idle_j: float
    requests: int
    weighed_by: str
    # The pools charged with the idle joules ("" when none were idle).
    idle_pool: str


@dataclass
class _Request:
    pool: str
    model: str
    started: float
    replica: str | None = None
    first: ReplicaReport | None = None
    last: ReplicaReport | None = None
    placed_at: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_j: float = 0.0
    decode_j: float = 0.0
    model_error_j: float = 0.0
    meter_error_j: float = 0.0
    intervals: int = 0


@dataclass
class _Replica:
    pool: str
    report: ReplicaReport
    seen: float
    requests: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Mark:
    """Where a request stood at its GPU's last reading."""

    prefilled: bool
    completion_tokens: int
    since: float


@dataclass
class _Gpu:
    energy_mj: float
    at: float
    lag_j: float
    marks: dict[str, _Mark] = field(default_factory=dict)
    # Each request's fraction of the last closed interval.
    fractions: dict[str, float] = field(default_factory=dict)


@dataclass
class InFlight:
    clock: Callable[[], float]
    # None: nothing is metered (no GPU meter on this node).
    pricing: Pricing | None = None
    # The Ray node of this gateway: the GPUs it meters are this node's.
    node: str = ""
    claim_ttl_s: float = 60.0
    # Told the idle joules of every idle interval: (pools, joules).
    on_idle: Callable[[str, float], None] | None = None
    history: int = 256
    attributed_j: float = field(default=0.0, init=False)
    idle_j: dict[str, float] = field(default_factory=dict, init=False)
    intervals: collections.deque[IntervalRecord] = field(init=False)
    _requests: dict[str, _Request] = field(default_factory=dict, init=False)
    _replicas: dict[str, _Replica] = field(default_factory=dict, init=False)
    _gpus: dict[int, _Gpu] = field(default_factory=dict, init=False)
    _counts: collections.Counter[str] = field(default_factory=collections.Counter, init=False)
    _started: collections.Counter[str] = field(default_factory=collections.Counter, init=False)

    def __post_init__(self) -> None:
        self.intervals = collections.deque(maxlen=self.history)

    # --- requests ----------------------------------------------------------------------

    def start(self, pool: str, request_id: str, model: str) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already in flight")
        self._requests[request_id] = _Request(pool=pool, model=model, started=self.clock())
        self._counts[pool] += 1
        self._started[pool] += 1

    def count(self, pool: str) -> int:
        return self._counts[pool]

    def started_total(self, pool: str) -> int:
        return self._started[pool]

    def report(self, request_id: str, report: ReplicaReport) -> None:
        """One of the request's replica's reports: the first places the request there."""
        now = self.clock()
        request = self._requests[request_id]
        replica = self._replicas.get(report.replica)
        if replica is None:
            replica = self._replicas[report.replica] = _Replica(pool=request.pool, report=report, seen=now)
        replica.report, replica.seen = report, now
        if request.replica is None:
            request.replica, request.first, request.placed_at = report.replica, report, now
            replica.requests.add(request_id)
        request.last = report

    def progress(self, request_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        request = self._requests[request_id]
        request.prompt_tokens = max(request.prompt_tokens, prompt_tokens)
        request.completion_tokens = max(request.completion_tokens, completion_tokens)

    def finish(self, request_id: str, reading: GpuEnergyReading | None = None) -> RequestShare:
        """The request's bill: its GPUs' intervals close at ``reading`` first (when metered)."""
        now = self.clock()
        if reading is not None:
            on_gpu = self._placement()
            for gpu, requests in on_gpu.items():
                if request_id in requests:
                    self._close(gpu, requests, reading, now)
        request = self._requests.pop(request_id)
        self._counts[request.pool] -= 1
        for state in self._gpus.values():
            state.marks.pop(request_id, None)
            # Its fraction drops to 0 at the reading its last interval ended on.
            request.meter_error_j += state.fractions.pop(request_id, 0.0) * state.lag_j
        if request.replica is not None:
            replica = self._replicas[request.replica]
            replica.requests.discard(request_id)
            replica.seen = now
        batch = lifetime_batch(request.first, request.last) if request.first and request.last else 1.0
        measured = None
        if request.intervals:
            measured = MeasuredEnergy(prefill_j=request.prefill_j, decode_j=request.decode_j,
                                      model_error_j=request.model_error_j, meter_error_j=request.meter_error_j,
                                      intervals=request.intervals)
        return RequestShare(duration_s=now - request.started, mean_batch=batch, replica=request.replica,
                            measured=measured)

    # --- the meter ---------------------------------------------------------------------

    def meter(self, reading: GpuEnergyReading) -> None:
        """A reading of this node's GPUs: every GPU whose counter moved closes its interval."""
        now = self.clock()
        self._forget_idle_replicas(now)
        on_gpu = self._placement()
        for gpu in range(len(reading.energy_mj)):
            self._close(gpu, on_gpu.get(gpu, set()), reading, now)

    def _close(self, gpu: int, requests: set[str], reading: GpuEnergyReading, now: float) -> None:
        energy_mj = reading.energy_mj[gpu]
        state = self._gpus.get(gpu)
        if state is None or energy_mj < state.energy_mj:
            # The first reading, or the counter went back (driver reload): a new baseline.
            self._gpus[gpu] = _Gpu(energy_mj=energy_mj, at=now, lag_j=boundary_error_j(reading, gpu))
            return
        if energy_mj == state.energy_mj:
            return  # not updated since the last reading: the interval stays open
        assert self.pricing is not None, "readings without pricing"
        measured_j = (energy_mj - state.energy_mj) / 1000.0
        split = split_interval(measured_j, self._work(state, requests, now, self.pricing))
        marks, fractions = {}, {}
        for request_id, share in split.shares.items():
            request = self._requests[request_id]
            request.prefill_j += share.prefill_j
            request.decode_j += share.decode_j
            request.model_error_j += share.model_error_j
            request.meter_error_j += abs(share.fraction - state.fractions.get(request_id, 0.0)) * state.lag_j
            request.intervals += 1
            marks[request_id] = _Mark(prefilled=request.prompt_tokens > 0,
                                      completion_tokens=request.completion_tokens, since=now)
            fractions[request_id] = share.fraction
        for request_id, fraction in state.fractions.items():
            if request_id not in fractions:  # on the GPU before, not now (placement changed)
                self._requests[request_id].meter_error_j += fraction * state.lag_j
        idle_pool = ""
        if split.idle_j > 0.0:
            idle_pool = self._claimant_pools(gpu)
            self.idle_j[idle_pool] = self.idle_j.get(idle_pool, 0.0) + split.idle_j
            if self.on_idle is not None:
                self.on_idle(idle_pool, split.idle_j)
        self.attributed_j += split.attributed_j
        self.intervals.append(IntervalRecord(
            gpu=gpu, start=state.at, end=now, measured_j=measured_j, attributed_j=split.attributed_j,
            idle_j=split.idle_j, requests=len(split.shares), weighed_by=split.weighed_by, idle_pool=idle_pool))
        self._gpus[gpu] = _Gpu(energy_mj=energy_mj, at=now, lag_j=boundary_error_j(reading, gpu), marks=marks,
                               fractions=fractions)

    def _work(self, state: _Gpu, requests: set[str], now: float, pricing: Pricing) -> dict[str, Work]:
        """What each request on the GPU did since the GPU's last reading, priced at its
        replica's operating point (module doc)."""
        by_replica: dict[str, list[tuple[str, _Request]]] = collections.defaultdict(list)
        for request_id in requests:
            request = self._requests[request_id]
            by_replica[str(request.replica)].append((request_id, request))
        work = {}
        for replica_id, members in by_replica.items():
            batch = float(max(1, self._replicas[replica_id].report.running))
            context = sum(r.prompt_tokens + r.completion_tokens for _, r in members) / len(members)
            prices: dict[str, tuple[EnergyCoefficients, float]] = {}
            for request_id, request in members:
                price = prices.get(request.model)
                if price is None:
                    price = prices[request.model] = (
                        pricing.coefficients(request.pool, request.model, batch, context),
                        pricing.ratio_error(request.pool, request.model))
                coefficients, ratio_error = price
                mark = state.marks.get(request_id) or _Mark(False, 0, max(request.placed_at, state.at))
                prompt, prefilled = request.prompt_tokens, request.prompt_tokens > 0
                work[request_id] = Work(
                    prefill_j=coefficients.prefill_joules(prompt, 0) if prefilled and not mark.prefilled else 0.0,
                    decode_j=(coefficients.decode_joules(prompt, request.completion_tokens)
                              - coefficients.decode_joules(prompt, mark.completion_tokens)),
                    seconds=now - mark.since, decoding=prefilled, ratio_error=ratio_error)
        return work

    # --- placement ---------------------------------------------------------------------

    def _placement(self) -> dict[int, set[str]]:
        """GPU -> the requests on it (module doc). Replicas on another node are not metered."""
        on_gpu: dict[int, set[str]] = collections.defaultdict(set)
        unknown: set[str] = set()
        for replica in self._replicas.values():
            report = replica.report
            if report.gpus and report.node == self.node:
                for gpu in report.gpus:
                    on_gpu[gpu] |= replica.requests
            elif not report.gpus and report.node in ("", self.node):
                unknown |= replica.requests
        if unknown:
            for gpu in self._gpus:
                if gpu not in on_gpu:
                    on_gpu[gpu] = set(unknown)
        return on_gpu

    def _claimant_pools(self, gpu: int) -> str:
        pools = {r.pool for r in self._replicas.values() if r.report.node == self.node and gpu in r.report.gpus}
        return "+".join(sorted(pools)) or UNCLAIMED

    def _forget_idle_replicas(self, now: float) -> None:
        for replica_id in [rid for rid, r in self._replicas.items()
                           if not r.requests and now - r.seen > self.claim_ttl_s]:
            del self._replicas[replica_id]

    # --- views -------------------------------------------------------------------------

    def running(self, pool: str) -> int | None:
        """The pool's running sequences (module doc); None before any replica of it reported."""
        replicas = [r for r in self._replicas.values() if r.pool == pool]
        if not replicas:
            return None
        return sum(min(r.report.running, len(r.requests)) for r in replicas)

    def as_dict(self) -> dict[str, Any]:
        """The rule, the totals and the recent intervals (``GET /energy``)."""
        return {
            "rule": ONLINE_RULE,
            "attributed_j": self.attributed_j,
            "idle_j": dict(self.idle_j),
            "intervals": [asdict(record) for record in self.intervals],
            "replicas": {rid: {"pool": r.pool, "node": r.report.node, "gpus": list(r.report.gpus),
                               "running": r.report.running, "in_flight": len(r.requests)}
                         for rid, r in self._replicas.items()},
        }
