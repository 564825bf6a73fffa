"""Core value types shared by the scheduler, the data layer, the server and the simulator.

Everything here is a frozen dataclass: a routing decision is a pure function of
(Request, FleetSnapshot) and nothing in either may change under it. Times are UTC epoch
seconds (float); every live input carries the ``observed_at`` of the value it holds, and age
is always measured from it, never from when we fetched it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from scheduler.energy.step import EnergyCoefficients, EnergyEstimate, LatencyCoefficients

# The fleet and the policy are compiled from the files (scheduler.config.compile); a candidate
# is imported from here as before.
from scheduler.fleet import Candidate as Candidate
from scheduler.fleet import Fleet, Region
from scheduler.policy import Policy

# The records the SDK carries too live in scheduler.wire (the SDK must not need this module's
# numpy); the rest of the scheduler keeps importing them from here.
from scheduler.wire.records import CarbonUsed as CarbonUsed
from scheduler.wire.records import EnergyReceipt as EnergyReceipt
from scheduler.wire.records import Fallback as Fallback
from scheduler.wire.records import Signal as Signal

WorkloadClass = Literal["interactive", "batch", "deferrable"]
WORKLOAD_CLASSES: tuple[WorkloadClass, ...] = ("interactive", "batch", "deferrable")
# How a request's workflow hangs together (docs/affinity.md, "Workflow shapes"): a chain's step
# extends the previous one's prompt; a fan-out's siblings share a prefix; a DAG has both.
WorkflowShape = Literal["chain", "fanout", "dag"]
WORKFLOW_SHAPES: tuple[WorkflowShape, ...] = ("chain", "fanout", "dag")

FrozenT = TypeVar("FrozenT")


def build_frozen(cls: type[FrozenT], fields: dict[str, Any]) -> FrozenT:
    """The instance of the frozen, unslotted dataclass ``cls`` whose fields are ``fields``
    (which names every one of them): what the generated ``__init__`` makes, without its one
    ``object.__setattr__`` per field. For the objects every decision makes (``Decision``,
    ``RequestView``, the framework's ``Frame`` and ``LazyRejections``; the snapshot): the
    constructors instead made ``scheduler bench decide``'s p50 12 % higher (12 regions x 4 pools:
    34.5 -> 39.0 us, 2026-12-06). The instance is as immutable to its users as any other, and
    equal to the constructor's (``tests/unit/test_build_frozen.py``)."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


@dataclass(frozen=True, slots=True)
class GeoPoint:
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class Request:
    """What the scheduler needs to know about one inference request (never the prompt text)."""

    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    tenant: str = ""
    workload_class: WorkloadClass = "interactive"
    # None: the policy's default for the workload class.
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    # Empty: no residency requirement. Otherwise the jurisdictions the request may run in.
    allowed_jurisdictions: frozenset[str] = frozenset()
    required_certifications: frozenset[str] = frozenset()
    # None: any precision the policy's floor for its workload class allows (docs/objective.md).
    precision: str | None = None
    task_class: str | None = None
    client_location: GeoPoint | None = None
    # Requests sharing a prefix key can reuse each other's KV cache (when the client names none,
    # the router derives one from the prompt's first tokens: scheduler.prefix).
    prefix_key: str | None = None
    # Prompt tokens expected to be served from the prefix cache (on every candidate; where the
    # snapshot knows the prefix warm, the framework credits more there: docs/affinity.md).
    cached_tokens: int = 0
    # Requests of one workflow share it (None: not part of a named workflow).
    workflow_id: str | None = None
    # None: a lone request, or a workflow of unknown shape.
    workflow_shape: WorkflowShape | None = None
    # Tokens at the start of the prompt shared with the workflow's other requests (a fan-out's
    # system prompt); None: as much as the workflow's last request's prompt (a chain's history).
    shared_prefix_tokens: int | None = None

    @property
    def holdable(self) -> bool:
        """Whether batching or deferral may hold it: a chain's (or a DAG's) step never waits,
        the steps after it wait on it."""
        return self.workflow_shape not in ("chain", "dag")




@dataclass(frozen=True, slots=True)
class ModelReplicas:
    """The replicas of the deployment that serves one model of a pool: warm (serving) and
    starting (engine loading), as Ray Serve counts them."""

    replicas: int
    starting_replicas: int


@dataclass(frozen=True, slots=True)
class PoolLiveState:
    """What a pool publishes (its replicas summed). The rates are measured over the interval
    since the pool's previous publication."""

    queue_depth: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    gpu_power_w: float | None = None
    measured_j_per_token: float | None = None
    # Requests that arrived per second, and their prompt tokens per second.
    arrival_rate: float = 0.0
    prompt_tokens_rate: float = 0.0
    # What the pool's deployment serves now: model -> its live context limit (the engine's
    # max_model_len). None: not reported (the pool is taken to serve what its config says).
    # (Not hashed: a dict is not hashable, and equal states still hash equal without it.)
    models: Mapping[str, int] | None = field(default=None, hash=False)
    # Replicas of the pool's deployment that serve now (warm), and those whose engine is loading
    # (starting), as Ray Serve counts them (None: not reported; the pool then counts as warm).
    # A pool with no warm replica is cold: a request there waits for, and with none starting
    # pays for, a cold start (docs/objective.md, "Cold pools"). The counts are the sums over
    # the pool's deployments (one per model).
    replicas: int | None = None
    starting_replicas: int | None = None
    # Per model, its own deployment's counts: a model can be at zero while the pool's other
    # model serves. None (or a model not in it): the pool's counts stand for the model.
    model_replicas: Mapping[str, ModelReplicas] | None = field(default=None, hash=False)

    def replicas_of(self, model: str) -> tuple[int | None, int | None]:
        """(warm, starting) replicas that serve ``model`` (``model_replicas``, else the pool's)."""
        own = None if self.model_replicas is None else self.model_replicas.get(model)
        if own is None:
            return self.replicas, self.starting_replicas
        return own.replicas, own.starting_replicas


@dataclass(frozen=True, slots=True)
class WarmPrefix:
    """A pool where a prefix (or a workflow) is warm: the prompt tokens of it the pool's cache
    serves, and when that was last seen (docs/affinity.md)."""

    region: str
    pool: str
    cached_tokens: int
    observed_at: float
    # "hit": the region published an engine-reported prefix-cache hit for the key;
    # "workflow": this router sent the workflow's last request there.
    source: str = "hit"

    @property
    def place(self) -> str:
        return f"{self.region}/{self.pool}"


@dataclass(frozen=True, slots=True)
class RegionLiveState:
    """What a region last published about itself."""

    region: str
    healthy: bool
    observed_at: float
    pools: Mapping[str, PoolLiveState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CandidatePerf:
    """A candidate's live-dependent energy and latency coefficients, computed once per
    snapshot by the data layer (``scheduler.datalayer.snapshot``, from the step model of
    ``scheduler.energy.step`` at the pool's live batch) so that a decision only multiplies
    them by the request's token counts."""

    energy: EnergyCoefficients
    latency: LatencyCoefficients
    # Expected decode batch per replica (this request included) and queue wait before admission.
    batch: float
    queue_wait_s: float
    # False when the pool's live state is stale or missing and ``batch``/``queue_wait_s``
    # are the nominal assumptions.
    live: bool
    # "warm": the pool has a replica serving; "starting": none serves, one is starting (the
    # request waits for it); "cold": none serves or starts (the request wakes one). A pool whose
    # live state says nothing of its replicas counts as warm.
    warmth: str = "warm"
    # What this request's decision adds for the pool's cold start (docs/objective.md, "Cold
    # pools"): the seconds until a replica serves (in its TTFT) and, where it would wake the
    # pool, the wake-up's joules (in its energy). 0 on a warm pool.
    cold_start_s: float = 0.0
    wake_j: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """The shared state store as the router's refresher last found it."""

    reachable: bool
    # The last successful read (None: none since the router started).
    last_read_at: float | None
    # The router's start: an outage that began before any read counts from here.
    since: float
    error: str = ""
    # The first good read after failed ones (None: no outage since the router started). A
    # region that has not published since may not have reconnected yet (region-health).
    recovered_at: float | None = None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The router's own health probe of a region's endpoint (``GET {endpoint}/health``)."""

    ok: bool
    checked_at: float
    # Why not ok (HTTP status, connection error); empty when ok.
    detail: str = ""


@dataclass(frozen=True)
class CanarySplit:
    """The canary of the snapshot's policy as routing applies it now (scheduler.canary): which
    requests its arm decides for, whether it is on, and the arm's own snapshot."""

    control: str  # the control policy (the router's)
    arm: str  # the candidate policy
    fraction: float
    assign_by: str  # tenant | request_id
    # False: rolled back, switched off, or not read from the store yet: the control decides all.
    enabled: bool
    # Changes at every re-enable; the windows are counted per epoch.
    epoch: str
    window_s: float
    # The control's snapshot deciding under the arm's policy (its objective, the control's hard
    # limits; scheduler.canary.policy); None while the arm is off.
    snapshot: FleetSnapshot | None = field(default=None, compare=False, repr=False)


# The snapshot inputs a plugin may declare it reads (``READS``; scheduler.framework.plugin).
# perf: the candidates' ``CandidatePerf``; pools: each region's fresh pool mapping; live: each
# region's published live state (however old); carbon: each zone's carbon signal and whether it
# is usable; clock: ``now`` (new at every build), and with it every input a delta does not track.
SNAPSHOT_INPUTS = frozenset({"perf", "pools", "live", "carbon", "clock"})


@dataclass(frozen=True, slots=True)
class SnapshotDelta:
    """What changed between the snapshot builder's previous build (``since``) and this one
    (``key``), and the verdicts on freshness it judged on the way (scheduler.datalayer.snapshot).
    The framework reuses a plugin's columns across builds while none of the inputs it reads is
    in ``changed`` (scheduler.framework.state)."""

    # this build, and the previous build of the same builder (None: its first)
    key: object
    since: object | None
    # of SNAPSHOT_INPUTS, those that may differ from ``since``'s (all of them when it is None)
    changed: frozenset[str]
    # the previous build's perf tuple, and the candidates whose ``CandidatePerf`` is another
    # object here (the framework updates its prediction rows there alone)
    perf_since: tuple[CandidatePerf, ...] | None
    perf: tuple[int, ...]
    # the regions (positions in ``FleetSnapshot.regions``) whose fresh pool mapping is another
    # object here (every region when ``since`` is None)
    pools: tuple[int, ...]
    # per region (``FleetSnapshot.regions`` order): the pool mapping of its live state when that
    # is fresh (age <= policy.max_age.region_state), else None
    fresh_pools: tuple[Mapping[str, PoolLiveState] | None, ...]
    # every region's state is fresh, and every published state healthy
    all_fresh_and_healthy: bool
    # the clock, live mapping and policy the builder judged the changes and freshness under
    now: float
    live: Mapping[str, RegionLiveState]
    policy: Policy

    def judged(self, snapshot: FleetSnapshot) -> bool:
        """Whether this delta describes ``snapshot``: it has the clock, live mapping and policy
        the builder judged (a copy with others, such as a canary arm's under its own policy,
        is judged afresh)."""
        return self.now == snapshot.now and self.live is snapshot.live and self.policy is snapshot.policy


# Per region: its fresh pool mapping or None; and whether every region is fresh and healthy.
FreshPools = tuple[list[Mapping[str, PoolLiveState] | None], bool]


def judge_fresh(live: Mapping[str, RegionLiveState], names: Sequence[str], now: float, max_age: float) -> FreshPools:
    """Per region of ``names``: the pool mapping of its live state when that is fresh (age <=
    ``max_age``), else None; and whether every one of them is fresh and every state in
    ``live`` healthy (False also when some region's pool mapping is None). The snapshot builder
    records these verdicts in ``SnapshotDelta``; the framework judges a snapshot it did not build."""
    get = live.get
    pools: list[Mapping[str, PoolLiveState] | None] = [
        None if (state := get(name)) is None or now - state.observed_at > max_age else state.pools for name in names]
    return pools, None not in pools and all(state.healthy for state in live.values())


@dataclass(frozen=True)
class FleetSnapshot:
    """Everything a decision may look at, frozen at ``now``.

    ``carbon`` maps grid zone -> the latest carbon-intensity signal (absent: never seen).
    ``live`` maps region -> its last published live state (absent: never seen).
    """

    now: float
    policy: Policy
    # The regions and their candidates (``fleet.candidates``), of one config version.
    fleet: Fleet
    # Aligned with ``candidates`` (``perf[c.index]``).
    perf: tuple[CandidatePerf, ...]
    carbon: Mapping[str, Signal] = field(default_factory=dict)
    live: Mapping[str, RegionLiveState] = field(default_factory=dict)
    energy_routing_enabled: bool = True
    # Grid zone -> the highest carbon intensity the data layer accepted for it over the policy's
    # trailing window (``stale_bounds.carbon_window``), gCO2e/kWh: what a candidate whose zone
    # signal is unusable is priced at. Absent: none known (the fleet-wide bound applies,
    # ``scheduler.signal_check.UPPER_BOUND_G_PER_KWH``).
    carbon_bounds: Mapping[str, float] = field(default_factory=dict)
    # The store behind the live inputs (None: no store: the simulator, offline tools).
    store: StoreStatus | None = None
    # region -> the router's own probe of its endpoint (absent: not probed). Judged only while
    # the store is unreachable (scheduler.plugins.filters.region_health).
    probes: Mapping[str, ProbeResult] = field(default_factory=dict)
    # region -> ``observed_at`` of the last state it published, from its last-seen record (no
    # TTL): a region whose state key expired was seen and stopped, it is not "never seen".
    last_seen: Mapping[str, float] = field(default_factory=dict)
    # When the router started reading live state; a region never seen is trusted for the
    # policy's ``unknown_region_state.missing_warmup`` after it. None: no live source (the
    # simulator, offline tools): never-seen regions are judged as during the warm-up.
    live_since: float | None = None
    # Per candidate: queue wait the router's own dispatches add that the live state does not
    # show yet (scheduler.datalayer.pending); None: none pending.
    pending_wait_s: npt.NDArray[np.float64] | None = field(default=None, compare=False)
    # Identifies the snapshot's inputs but pending dispatches (now, carbon, live, policy, kill
    # switch, store, probes): snapshots that differ only in pending dispatches share it, and so
    # share every plugin's columns (scheduler.framework.state); a copy with other inputs gets
    # a new one.
    live_key: object = field(default_factory=object, compare=False, repr=False)
    # What changed since the builder's previous snapshot, and the freshness it judged (None:
    # not known, as for a snapshot made otherwise: every input counts as new).
    delta: SnapshotDelta | None = field(default=None, compare=False, repr=False)
    # The policy's canary as applied now (None: the policy has none), and which of its arms this
    # snapshot decides for: "" (no canary), "control", or "canary" (``canary.snapshot``).
    canary: CanarySplit | None = field(default=None, compare=False, repr=False)
    canary_arm: str = ""
    # The version of the config (regions, policies, keys, budgets) this snapshot was built
    # from: the decisions and receipts made on it record it. "": not versioned (offline tools).
    config_version: str = ""
    # Prefix key -> the pools whose prefix cache served it (published by the regions, fresh
    # within policy.max_age.prefix_cache when the refresher read them); workflow id -> where
    # this router last sent it (docs/affinity.md). Bounded by the refresher.
    prefix_warm: Mapping[str, tuple[WarmPrefix, ...]] = field(default_factory=dict, compare=False, repr=False)
    workflows: Mapping[str, WarmPrefix] = field(default_factory=dict, compare=False, repr=False)

    def age(self, observed_at: float) -> float:
        return self.now - observed_at

    def copy_with(self, **changes: Any) -> FleetSnapshot:
        """This snapshot with ``changes`` and everything else shared: its ``live_key`` unless
        changed, and the columns cached on it (``dataclasses.replace`` would make a new
        instance without them). The router makes one per dispatch (``with_pending``)."""
        copy = object.__new__(FleetSnapshot)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    def with_pending(self, pending_wait_s: npt.NDArray[np.float64] | None) -> FleetSnapshot:
        """This snapshot with other pending dispatches (its columns shared)."""
        return self.copy_with(pending_wait_s=pending_wait_s)

    def with_workflows(self, workflows: Mapping[str, WarmPrefix]) -> FleetSnapshot:
        """This snapshot with other workflow homes (its columns shared)."""
        return self.copy_with(workflows=workflows)

    @property
    def regions(self) -> tuple[Region, ...]:
        return self.fleet.regions

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.fleet.candidates

    @property
    def candidates_by_model(self) -> Mapping[str, tuple[Candidate, ...]]:
        """Model name -> the candidates (deployments) serving it."""
        return self.fleet.candidates_by_model

    @property
    def pools(self) -> tuple[tuple[Candidate, ...], ...]:
        """The candidates grouped by (region, pool), in fleet order."""
        return self.fleet.pools

    @property
    def store_outage_s(self) -> float | None:
        """Seconds the store has been unreachable (since the last good read); None while it
        answers, or when no store is behind this snapshot."""
        store = self.store
        if store is None or store.reachable:
            return None
        return self.now - (store.since if store.last_read_at is None else store.last_read_at)

    def fresh_live(self, region: str) -> RegionLiveState | None:
        """The region's live state if it is younger than the policy's limit, else None."""
        state = self.live.get(region)
        if state is None or self.now - state.observed_at > self.policy.max_age.region_state:
            return None
        return state


@dataclass(frozen=True, slots=True)
class Rejection:
    """A candidate a filter or matcher removed, and why (formatted lazily: hot path)."""

    candidate: Candidate
    plugin: str
    reason_format: str
    reason_args: tuple[object, ...] = ()

    @property
    def reason(self) -> str:
        return self.reason_format.format(*self.reason_args)


class RejectionGroup(Protocol):
    def __len__(self) -> int: ...

    def materialize(self) -> list[Rejection]: ...




@dataclass(frozen=True, slots=True)
class ScoredCandidate:
    candidate: Candidate
    # scorer TYPE -> its quantity for this candidate, in the scorer's unit (absent: it abstained)
    quantities: Mapping[str, float]
    # scorer TYPE -> quantity x the policy's rate, in USD
    costs: Mapping[str, float]
    # the sum of the costs, USD (lowest first)
    total: float


@dataclass(frozen=True)
class Decision:
    """The outcome of one ``Scheduler.schedule`` call.

    The survivors are kept in ranking order with ``order`` (lowest cost first) and their
    per-scorer quantities; ``ranked`` builds the per-candidate view on first use, so a router
    that only needs the ranked candidates for dispatch and failover does not pay for it.
    """

    request_id: str
    decided_at: float
    policy: str
    # The snapshot's candidates, and the indices (into it) of those that survived the filters.
    fleet: tuple[Candidate, ...]
    survivor_index: Sequence[int] | npt.NDArray[np.intp]
    # Positions into the survivors, best first, and each survivor's cost in USD.
    order: Sequence[int] | npt.NDArray[np.intp]
    totals: Sequence[float] | npt.NDArray[np.float64]
    # The scorers of the applied objective that answered (by TYPE), their units, their rates
    # (USD per unit, for this request's workload class, as applied and as written) and their
    # quantities: one row per scorer, one column per survivor.
    scorer_names: tuple[str, ...]
    units: tuple[str, ...]
    rates: tuple[float, ...]
    rates_written: tuple[str, ...]
    quantities: Sequence[Sequence[float]] | npt.NDArray[np.float64]
    # Rejections known outright, and groups whose reasons are formatted when first read.
    eager_rejections: tuple[Rejection, ...]
    lazy_rejections: tuple[RejectionGroup, ...]
    fallbacks: tuple[Fallback, ...]
    # False: the policy's fallback (performance) objective ranked (a stale energy-layer
    # signal, or the kill switch).
    energy_ranking: bool
    # The chosen candidate's energy coefficients and the request's (prompt, cached, output
    # tokens): ``energy`` evaluates them on first use.
    energy_inputs: tuple[EnergyCoefficients, int, int, int] | None = None
    # Plugin TYPE -> nanoseconds its call took in this decision. Filled on a sample of the
    # decisions (``Scheduler.timing_every``: a scheduler's first, then one in 16 by default),
    # empty on the others: read it as a profile over many decisions.
    plugin_timings_ns: Mapping[str, int] = field(default_factory=dict)
    # The canary arm that decided ("control" or "canary"; "" when the policy has no canary):
    # the snapshot's ``canary_arm``.
    canary_arm: str = ""
    # The snapshot's per-candidate performance (``fleet`` order): each pool's warmth and what a
    # cold start adds (empty: not recorded).
    perf: tuple[CandidatePerf, ...] = ()

    @cached_property
    def energy(self) -> EnergyEstimate | None:
        """The energy model's prediction for the chosen candidate, with the wake-up of its pool
        where the decision wakes it (``cold_start_j``)."""
        if self.energy_inputs is None:
            return None
        coefficients, prompt, cached, output = self.energy_inputs
        estimate = coefficients.estimate(prompt, cached, output)
        wake = self.perf[int(self.survivor_index[self.order[0]])].wake_j if self.perf else 0.0
        if wake == 0.0:
            return estimate
        return replace(estimate, energy_j=estimate.energy_j + wake, low_j=estimate.low_j + wake,
                       high_j=estimate.high_j + wake, cold_start_j=wake)

    @property
    def schedulable(self) -> bool:
        return len(self.order) > 0

    @cached_property
    def survivors(self) -> tuple[Candidate, ...]:
        return tuple(self.fleet[i] for i in self.survivor_index)

    @cached_property
    def ranked_candidates(self) -> tuple[Candidate, ...]:
        """Best first: the order dispatch tries them in (failover walks down this list)."""
        # (one conversion to Python ints: indexing numpy arrays element by element costs more)
        fleet, index = self.fleet, np.asarray(self.survivor_index, dtype=np.intp)
        return tuple(fleet[i] for i in index[np.asarray(self.order, dtype=np.intp)].tolist())

    @property
    def rejected_count(self) -> int:
        """How many candidates were rejected (without formatting their reasons)."""
        return len(self.eager_rejections) + sum(len(group) for group in self.lazy_rejections)

    @cached_property
    def rejected(self) -> tuple[Rejection, ...]:
        """Every rejection, in the order the plugins ran."""
        out = list(self.eager_rejections)
        for group in self.lazy_rejections:
            out.extend(group.materialize())
        return tuple(out)

    @cached_property
    def ranked(self) -> tuple[ScoredCandidate, ...]:
        return tuple(self._scored(i) for i in self.order)

    @property
    def chosen(self) -> ScoredCandidate | None:
        return self._scored(self.order[0]) if len(self.order) else None

    def _scored(self, i: int) -> ScoredCandidate:
        quantities = {name: float(row[i]) for name, row in zip(self.scorer_names, self.quantities, strict=True)}
        return ScoredCandidate(
            candidate=self.fleet[self.survivor_index[i]],
            quantities=quantities,
            costs={name: rate * quantities[name] for name, rate in zip(self.scorer_names, self.rates, strict=True)},
            total=float(self.totals[i]),
        )




