"""Building the immutable ``FleetSnapshot`` a decision reads.

``SnapshotBuilder`` is made once per config (it enumerates the candidates and their static
facts); ``build(now, carbon, live, ...)`` is called by the background refresher about once
a second (router), at every event (simulator) or once (``route --explain``). It turns live
state into per-candidate coefficients so that a decision does only arithmetic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_, is_not

from scheduler.config.schema import PolicyConfig, PoolConfig, RegionConfig
from scheduler.energy.cold_start import ColdStart, cold_start
from scheduler.energy.energy_model import EnergyModel
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.power_cap import PoolCap, PowerCap, capped, pool_cap, power_cap
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.energy.step import (
    GPU_MEMORY_UTILIZATION,
    EnergyCoefficients,
    LatencyCoefficients,
    RatedCosts,
    mean_context,
    predict,
)
from scheduler.signal_check import CLOCK_SKEW_S, signal_problem
from scheduler.types import (
    Candidate,
    CandidatePerf,
    FleetSnapshot,
    PoolLiveState,
    RegionLiveState,
    Signal,
    SnapshotDelta,
    build_frozen,
    judge_fresh,
)


@dataclass(frozen=True)
class PerfAssumptions:
    """What the predictions assume where live state says nothing (it is stale or missing)."""

    # Concurrent sequences per replica, and their mean context, when a pool's state is unknown.
    nominal_batch: float = 16.0
    nominal_context: float = 1024.0
    # The prompt length a queued request is assumed to have when the pool publishes no
    # arrival rates (the router does not see the queue's prompts).
    queued_prompt_tokens: float = 1024.0
    # E[P^2] / E[P]^2 of the prompt lengths (the second moment of prefill service times; the
    # Azure conversation and code traces both have 1.9).
    prompt_spread: float = 2.0
    # Prefill utilisation beyond which the stationary queue is taken at this value (the
    # backlog term takes over: a queue past saturation grows with time, not with rho).
    max_utilisation: float = 0.95
    # KV usage above which a replica admits a new sequence only when one finishes.
    kv_full: float = 0.95
    # Output tokens of a running sequence (its remaining half decides when a slot frees).
    output_tokens: float = 256.0


def replicas_of(candidate: Candidate) -> int:
    return max(1, candidate.pool.count // candidate.deployment.tensor_parallel)


def kv_capacity_tokens(candidate_region: RegionConfig, pool_index: int, deployment_index: int) -> int:
    """Tokens of KV cache one replica can give a single sequence (at most max_context)."""
    pool = candidate_region.pools[pool_index]
    deployment = pool.models[deployment_index]
    gpu = GPU_CATALOGUE[pool.gpu]
    model = MODEL_CATALOGUE[deployment.name]
    usable = gpu.hbm_bytes * GPU_MEMORY_UTILIZATION * deployment.tensor_parallel
    free_for_kv = usable - model.weight_bytes(deployment.precision)
    if free_for_kv <= 0:
        return 0
    return min(deployment.max_context, int(free_for_kv / model.kv_bytes_per_token_at(deployment.precision)))


def pool_power_cap(region: RegionConfig, pool: PoolConfig, energy_model: EnergyModel) -> PoolCap:
    """The pool's configured, efficient and effective power caps (``scheduler.energy.power_cap``):
    with the region's eco switch on, the efficient cap (never above ``power_cap_w``)."""
    return pool_cap(
        GPU_CATALOGUE[pool.gpu], pool.power_cap_w, region.eco,
        [(MODEL_CATALOGUE[d.name], d.precision, d.tensor_parallel) for d in pool.models], energy_model,
    )


def candidate_caps(regions: Sequence[RegionConfig], candidates: Sequence[Candidate],
                   energy_model: EnergyModel) -> tuple[PowerCap | None, ...]:
    """Per candidate, the power cap its replicas run under (None: the default limit, TDP).
    Config only (the pools' ``power_cap_w``, the regions' ``eco``): the efficient cap is
    computed only for pools of regions with eco on."""
    targets: dict[tuple[str, str], float] = {}
    for region in regions:
        for pool in region.pools:
            target = pool_power_cap(region, pool, energy_model).target_w if region.eco else pool.power_cap_w
            targets[(region.name, pool.name)] = target
    return tuple(power_cap(c.gpu, targets[(c.region.name, c.pool.name)], c.deployment.tensor_parallel)
                 for c in candidates)


def enumerate_candidates(regions: Sequence[RegionConfig]) -> tuple[Candidate, ...]:
    candidates: list[Candidate] = []
    for region in regions:
        for p, pool in enumerate(region.pools):
            for d, deployment in enumerate(pool.models):
                candidates.append(
                    Candidate(
                        index=len(candidates),
                        region=region,
                        pool=pool,
                        deployment=deployment,
                        gpu=GPU_CATALOGUE[pool.gpu],
                        model=MODEL_CATALOGUE[deployment.name],
                        kv_capacity_tokens=kv_capacity_tokens(region, p, d),
                    )
                )
    return tuple(candidates)


# A changed pool's ``CandidatePerf`` (one per snapshot in the simulator) is made by setting its
# slots: the ``__init__`` of a frozen, slotted dataclass calls ``object.__setattr__`` per field.
_SET_ENERGY, _SET_LATENCY, _SET_BATCH, _SET_QUEUE_WAIT_S, _SET_LIVE, _SET_WARMTH, _SET_COLD_START_S, _SET_WAKE_J = (
    vars(CandidatePerf)[f.name].__set__ for f in dataclasses.fields(CandidatePerf))


def _candidate_perf(energy: EnergyCoefficients, latency: LatencyCoefficients, batch: float, queue_wait_s: float,
                    live: bool, warmth: str = "warm", cold_start_s: float = 0.0, wake_j: float = 0.0) -> CandidatePerf:
    """``CandidatePerf(energy, latency, batch, queue_wait_s, live, warmth, cold_start_s, wake_j)``."""
    perf = object.__new__(CandidatePerf)
    _SET_ENERGY(perf, energy)
    _SET_LATENCY(perf, latency)
    _SET_BATCH(perf, batch)
    _SET_QUEUE_WAIT_S(perf, queue_wait_s)
    _SET_LIVE(perf, live)
    _SET_WARMTH(perf, warmth)
    _SET_COLD_START_S(perf, cold_start_s)
    _SET_WAKE_J(perf, wake_j)
    return perf


# Operating points whose step-model coefficients a builder keeps before it starts over.
OPERATING_POINTS_KEPT = 4096


@dataclass
class SnapshotBuilder:
    """Builds snapshots of one fleet under one policy.

    A candidate's ``CandidatePerf`` depends only on the candidate and its pool's live state
    when that state is fresh, so an entry is computed again only when its pool's fresh state
    is another object, not equal to the last build's, and when no candidate's entry changed
    the last ``perf`` tuple itself is reused (then the framework's columns derived from it are
    too). Each snapshot says which candidates' entries changed since the last build's
    (``SnapshotDelta.perf``), so that the columns derived from that tuple are updated there
    alone, and which inputs changed at all (``SnapshotDelta.changed``), so that the columns of
    the plugins that read none of them are kept. (No memo of entries by pool state: the
    states a pool publishes rarely recur, its arrival rates move at every publication, and
    such a memo's entries, four objects each, made the garbage collector's passes cost more
    than the few hits saved.)
    """

    regions: tuple[RegionConfig, ...]
    policy: PolicyConfig
    energy_model: EnergyModel = field(default_factory=ProfileEnergyModel)
    perf: PerfAssumptions = field(default_factory=PerfAssumptions)
    # The version of the config files the regions and policy came from (every snapshot, and
    # so every decision and receipt, carries it; scheduler.server.config_reload). "": none.
    config_version: str = ""
    # The models whose candidates' ``CandidatePerf`` follow their pools' live state (None:
    # every model). The others keep the nominal entry of a pool whose state is unknown
    # (``live`` False): for the simulator, whose requests all ask for one model, so that a
    # pool's new state does not cost the predictions of the other models it serves.
    models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        self.candidates = enumerate_candidates(self.regions)
        self.rated: tuple[RatedCosts, ...] = tuple(
            self.energy_model.rated_costs(c.model, c.gpu, c.deployment.precision, c.deployment.tensor_parallel)
            for c in self.candidates
        )
        # Per candidate: the power cap in effect (config: power_cap_w, eco), or None (TDP).
        self.caps: tuple[PowerCap | None, ...] = candidate_caps(self.regions, self.candidates, self.energy_model)
        self._region_names = tuple(region.name for region in self.regions)
        # per region (``regions`` order): its pools that serve one of ``models``, each with its
        # candidates of them
        self._by_region: tuple[tuple[tuple[str, tuple[Candidate, ...]], ...], ...] = tuple(
            tuple((pool.name, members) for pool in region.pools
                  if (members := tuple(c for c in self.candidates if c.region.name == region.name
                                       and c.pool.name == pool.name and self._followed(c))))
            for region in self.regions)
        self._replicas = tuple(replicas_of(c) for c in self.candidates)
        # Per candidate: what waking one of its replicas costs (scheduler.energy.cold_start).
        self._cold_starts: tuple[ColdStart, ...] = tuple(
            cold_start(c.gpu, c.model, c.deployment.precision, c.deployment.tensor_parallel, c.pool.cold_start_s,
                       c.pool.cold_start_j) for c in self.candidates)
        # (candidate index, batch, others' context) -> its coefficients (``_at_point``)
        self._points: dict[tuple[int, float, float], tuple[EnergyCoefficients, LatencyCoefficients]] = {}
        # the fresh pool states per region of the last build, and its perf tuple
        self._last: tuple[list[Mapping[str, PoolLiveState] | None], tuple[CandidatePerf, ...]] | None = None
        self._zones = tuple(dict.fromkeys(region.grid_zone for region in self.regions))
        # the last build's key, live mapping, and carbon signals per zone of ``_zones``
        self._last_key: object | None = None
        self._last_live: Mapping[str, RegionLiveState] = {}
        self._last_carbon: _CarbonSeen | None = None
        self._last_fresh: tuple[Mapping[str, PoolLiveState] | None, ...] = ()

    def build(
        self,
        now: float,
        carbon: Mapping[str, Signal] | None = None,
        live: Mapping[str, RegionLiveState] | None = None,
        energy_routing_enabled: bool = True,
        carbon_bounds: Mapping[str, float] | None = None,
    ) -> FleetSnapshot:
        """The snapshot at ``now``. A candidate's ``CandidatePerf`` is recomputed only when its
        pool's fresh state differs from the last build's; the perf tuple itself is the last one
        while no candidate's entry is another object."""
        live = dict(live or {})
        judged = judge_fresh(live, self._region_names, now, self.policy.max_age.region_state)
        fresh = judged[0]
        last = self._last
        changes: tuple[tuple[CandidatePerf, ...], tuple[int, ...]] | None = None
        if last is None:
            perf = self._in_fleet_order(fresh)
        else:
            before, previous = last
            changed: list[CandidatePerf] | None = None
            # the candidates whose entry is another object than in ``previous``
            changed_at: list[int] = []
            for r in compress(range(len(fresh)), map(is_not, fresh, before)):
                pools, was = fresh[r], before[r]
                for name, members in self._by_region[r]:
                    # A pool whose state is the very object it was, or an equal one (a state
                    # republished unchanged), keeps its candidates' entries.
                    pool_state = None if pools is None else pools.get(name)
                    if pools is not None and was is not None and (
                            pool_state is (had := was.get(name)) or pool_state == had):
                        continue
                    for c in members:
                        entry = self.perf_of(c, pool_state)
                        if entry is not previous[c.index]:
                            if changed is None:
                                changed = list(previous)
                            changed[c.index] = entry
                            changed_at.append(c.index)
            perf = previous if changed is None else tuple(changed)
            changes = (previous, tuple(changed_at))
        self._last = (fresh, perf)
        carbon = dict(carbon or {})
        delta = self._delta(now, carbon, live, judged, changes)
        snapshot: FleetSnapshot = build_frozen(FleetSnapshot, {
            "now": now,
            "policy": self.policy,
            "regions": self.regions,
            "candidates": self.candidates,
            "perf": perf,
            "carbon": carbon,
            "live": live,
            "energy_routing_enabled": energy_routing_enabled,
            "carbon_bounds": dict(carbon_bounds or {}),
            "store": None,
            "probes": {},
            "last_seen": {},
            "live_since": None,
            "pending_wait_s": None,
            "live_key": object(),
            "delta": delta,
            "config_version": self.config_version,
            # The router's refresher adds the policy's canary (scheduler.canary.runtime).
            "canary": None,
            "canary_arm": "",
            "prefix_warm": {},
            "workflows": {},
        })
        return snapshot

    def _delta(self, now: float, carbon: Mapping[str, Signal], live: Mapping[str, RegionLiveState],
               judged: tuple[list[Mapping[str, PoolLiveState] | None], bool],
               changes: tuple[tuple[CandidatePerf, ...], tuple[int, ...]] | None) -> SnapshotDelta:
        """What changed since the last build (of ``SNAPSHOT_INPUTS``; ``changes``: the last
        build's perf tuple and the candidates whose entry is another object, None: no last build)."""
        fresh = tuple(judged[0])
        since = self._last_key
        carbon_seen = _CarbonSeen.of(self._zones, carbon, now, self.policy.max_age.carbon, self._last_carbon)
        changed = {"clock"}
        if since is None:
            pools = tuple(range(len(fresh)))
            changed.update(("perf", "pools", "live", "carbon"))
        else:
            pools = tuple(compress(range(len(fresh)), map(is_not, fresh, self._last_fresh)))
            if changes is None or changes[1]:
                changed.add("perf")
            if pools:
                changed.add("pools")
            last_live = self._last_live
            if len(live) != len(last_live) or any(state is not last_live.get(name) for name, state in live.items()):
                changed.add("live")
            if not carbon_seen.same_as_last:
                changed.add("carbon")
        key = object()
        self._last_key, self._last_live, self._last_carbon, self._last_fresh = key, live, carbon_seen, fresh
        return SnapshotDelta(key=key, since=since, changed=frozenset(changed),
                             perf_since=None if changes is None else changes[0],
                             perf=() if changes is None else changes[1], pools=pools, fresh_pools=fresh,
                             all_fresh_and_healthy=judged[1], now=now, live=live, policy=self.policy)

    def _followed(self, candidate: Candidate) -> bool:
        """Whether ``candidate``'s entry follows its pool's live state (``models``)."""
        return self.models is None or candidate.deployment.name in self.models

    def _in_fleet_order(self, fresh: list[Mapping[str, PoolLiveState] | None]) -> tuple[CandidatePerf, ...]:
        region_of = {region.name: r for r, region in enumerate(self.regions)}
        return tuple(self.perf_of(c, None if not self._followed(c) or (pools := fresh[region_of[c.region.name]]) is None
                                  else pools.get(c.pool.name)) for c in self.candidates)

    def perf_of(self, c: Candidate, pool_state: PoolLiveState | None) -> CandidatePerf:
        """The candidate's predictors with its pool in ``pool_state`` (None: unknown or stale;
        the nominal batch and context and no queue are assumed).

        Per replica (the pool's totals / R replicas serving), with r running and q waiting sequences,
        requests arriving at lambda = arrival_rate / R with mean prompt P = prompt_tokens_rate
        / arrival_rate:
            batch        = r + 1 (this request joins), at most max_num_seqs
            others' context = KV usage x KV capacity / r      (scheduler.energy.step.mean_context)
            queue wait   = max(stationary, backlog) + tau / 2 + slot wait
              stationary = lambda E[S^2] / (2 (1 - rho))     the M/G/1 (Pollaczek-Khinchine) wait
                           of the prefill server, S = P x s, s = prefill seconds per token at
                           this batch, E[S^2] = prompt_spread x (P s)^2, rho = lambda P s
                           (capped at max_utilisation)
              backlog    = q x prefill time of a P-token prompt   (the requests already waiting)
              tau / 2    = the rest of the step in progress when the request arrives (none
                           when nothing runs: an idle replica starts a step for it)
              slot wait  = (the replica is full: max_num_seqs or KV usage >= kv_full)
                           output_tokens / 2 x tpot / r (until the first of the r running
                           sequences, each half-way through its output, ends)

        Under a power cap below the replica's draw at this batch (``self.caps``: the pool's
        ``power_cap_w`` or, with the region's eco switch on, its efficient cap) the step costs
        are the capped ones (``scheduler.energy.power_cap.capped``): slower, fewer joules.

        A candidate whose model has no warm replica (``pool_state.replicas_of``: its own
        deployment's, else the pool's) is "starting" while the region reports one of it
        starting, else "cold": the request's TTFT then adds the pool's cold start
        (``cold_start_s``: the whole of it, as the router cannot tell how far a start has got),
        and a cold pool's energy adds the wake-up (``wake_j``: ``scheduler.energy.cold_start``).
        """
        assumptions = self.perf
        costs = self.rated[c.index].costs
        if pool_state is None:
            energy, latency = self._at_point(c.index, assumptions.nominal_batch, assumptions.nominal_context)
            return _candidate_perf(energy, latency, assumptions.nominal_batch, 0.0, False)
        # The candidate's model's own deployment's replicas decide its warmth; R: the pool's
        # replicas serving now where the region says (Ray Serve's autoscaler moves it; its
        # load is the pool's), else the pool's capacity.
        warm, starting = pool_state.replicas_of(c.deployment.name)
        serving = pool_state.replicas
        replicas = serving if serving is not None and serving > 0 else self._replicas[c.index]
        running = pool_state.running / replicas
        waiting = pool_state.queue_depth / replicas
        batch = min(running + 1.0, float(costs.max_num_seqs))
        others = mean_context(pool_state.kv_cache_usage, costs.kv_capacity_tokens, running)
        energy, latency = self._at_point(c.index, batch, others)
        arrivals = max(0.0, pool_state.arrival_rate) / replicas
        prompt = (pool_state.prompt_tokens_rate / pool_state.arrival_rate if pool_state.arrival_rate > 0
                  else assumptions.queued_prompt_tokens)
        per_token = latency.prefill_s_per_token + prompt / 2 * latency.prefill_s_per_pair
        service = prompt * per_token
        rho = min(arrivals * service, assumptions.max_utilisation)
        stationary = arrivals * assumptions.prompt_spread * service * service / (2.0 * (1.0 - rho))
        backlog = waiting * (latency.prefill_s + service)
        wait = max(stationary, backlog) + (latency.prefill_s / 2.0 if pool_state.running > 0 else 0.0)
        if running >= costs.max_num_seqs or pool_state.kv_cache_usage >= assumptions.kv_full:
            tpot = latency.tpot_s + others * latency.tpot_s_per_context_token
            wait += assumptions.output_tokens / 2.0 * tpot / max(running, 1.0)
        if warm is None or warm > 0:
            return _candidate_perf(energy, latency, batch, wait, True)
        # No replica serves: the request waits for one to start, and wakes one when none is
        # starting (its charge: docs/objective.md, "Cold pools").
        start = self._cold_starts[c.index]
        if starting:
            return _candidate_perf(energy, latency, batch, wait, True, "starting", start.seconds, 0.0)
        return _candidate_perf(energy, latency, batch, wait, True, "cold", start.seconds, start.joules)

    def _at_point(self, index: int, batch: float, others: float) -> tuple[EnergyCoefficients, LatencyCoefficients]:
        """The step model's coefficients of candidate ``index`` at an operating point (decode
        batch, others' mean context), under its power cap where the cap binds there
        (``scheduler.energy.power_cap``). Memoized: a pool's state changes at nearly every
        publication (its arrival rates move), its operating point rarely (a pool between
        requests runs nothing: batch 1, no context), and the step model is most of the cost
        of an entry."""
        point = (index, batch, others)
        found = self._points.get(point)
        if found is None:
            if len(self._points) >= OPERATING_POINTS_KEPT:
                self._points.clear()
            rated = self.rated[index]
            found = self._points[point] = predict(capped(rated, self.caps[index], batch, others), batch, others)
        return found


@dataclass(frozen=True, slots=True)
class _CarbonSeen:
    """The carbon signals of a build, per grid zone, and whether every one was usable then."""

    signals: tuple[Signal | None, ...]
    all_usable: bool
    oldest: float
    newest: float
    # every signal is the last build's object and usable, as was every one of the last build's
    same_as_last: bool

    @classmethod
    def of(cls, zones: tuple[str, ...], carbon: Mapping[str, Signal], now: float, max_age: float,
           last: _CarbonSeen | None) -> _CarbonSeen:
        signals = tuple(map(carbon.get, zones))
        if (last is not None and last.all_usable and all(map(is_, signals, last.signals))
                and now - last.oldest <= max_age and -(now - last.newest) <= CLOCK_SKEW_S):
            # The same signals, usable still: judged as signal_problem judges each (a float
            # difference is monotonic in each operand: the oldest and the newest decide for all).
            return cls(signals, True, last.oldest, last.newest, True)
        usable = all(s is not None and signal_problem(s, now, max_age) is None for s in signals)
        observed = [s.observed_at for s in signals if s is not None]
        return cls(signals, usable, min(observed, default=now), max(observed, default=now), False)
