"""The simulator's data layer: what the router's refresher does, on the simulated clock.

Every ``refresh_s`` of simulated time (lazily, when a request arrives and the snapshot is
older) each region that is up publishes its pools' live state (``observed_at`` = now); a
region that is down publishes nothing, so its last state ages past the policy's
``max_age.region_state``. Carbon signals are what the replayed provider had published.
Then ``SnapshotBuilder`` builds the snapshot, exactly as in the router.

A snapshot is kept while a rebuild would decide the same (``snapshot``): its ``now`` then lags
the clock, and so do the ages a decision records from it; the engine adds the lag back
(``scheduler.sim.engine``).

As in the router, the dispatches made since the last publication are counted
(``scheduler.datalayer.pending``): the engine records each, a publication settles those it
shows, and every snapshot handed out carries the rest.

With ``affinity`` (``SimAffinity``) every snapshot handed out also carries ``prefix_warm`` and
``workflows`` as the router's refresher fills them (docs/affinity.md); without, both are empty.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from scheduler.datalayer.pending import PendingDispatches
from scheduler.datalayer.refresher import MAX_WARM_KEYS, MAX_WORKFLOWS
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.policy import Policy
from scheduler.signal_check import signal_problem
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.pools import PoolSim
from scheduler.sim.slots import slot_setters
from scheduler.state.prefix_warm import MAX_KEYS_PER_POOL
from scheduler.types import Candidate, FleetSnapshot, PoolLiveState, RegionLiveState, Request, Signal, WarmPrefix

# A publication's region states (one per region that is up, at nearly every snapshot) are made
# by setting their slots (``scheduler.sim.slots``).
_SET_REGION, _SET_HEALTHY, _SET_OBSERVED_AT, _SET_POOLS = slot_setters(RegionLiveState)


def _healthy_states(live: Mapping[str, Mapping[str, PoolLiveState]], now: float,
                    states: dict[str, RegionLiveState]) -> None:
    """``states[region] = RegionLiveState(region, True, now, pools)`` for every region in ``live``."""
    new = object.__new__
    for region, pools in live.items():
        states[region] = state = new(RegionLiveState)
        _SET_REGION(state, region)
        _SET_HEALTHY(state, True)
        _SET_OBSERVED_AT(state, now)
        _SET_POOLS(state, pools)


class SimAffinity:
    """What the router's snapshot carries for affinity, on the simulated clock.

    ``prefix_warm``: a request that finished with cached tokens > 0 (a prefix-cache hit) is a
    hit of its key on its pool, stamped with its finish time and its cached tokens, as the
    region gateway records it (``scheduler.state.prefix_warm.PrefixHits``: per pool the
    ``MAX_KEYS_PER_POOL`` most recently hit keys). A region publishes the hits recorded since
    its last publication when it publishes its live state (``publish``; a region that is down
    publishes none); the snapshot carries every published hit younger than the policy's
    ``max_age.prefix_cache``, at most ``MAX_WARM_KEYS`` keys (the most recent), as the
    refresher's ``_fresh_warm`` does.

    ``workflows``: every dispatch of a request with a workflow id records where it went and its
    prompt tokens (``SnapshotRefresher.record_dispatch``), visible to the very next decision, at
    most ``MAX_WORKFLOWS`` of them, each dropped ``max_age.prefix_cache`` after its dispatch.
    The snapshots carry a read-only view of that record, not a copy: the simulator decides on
    each snapshot as soon as it is handed out, when the view is exactly what a copy would hold,
    and a copy per dispatch would cost as many entries as there are live workflows.
    """

    def __init__(self, policy: Policy) -> None:
        self.max_age_s = policy.max_age.prefix_cache
        # hits recorded and not yet published: (region, pool, key, cached tokens, at)
        self._staged: list[tuple[str, str, str, int, float]] = []
        # (region, pool) -> key -> its latest published hit (least recent first)
        self._pools: dict[tuple[str, str], OrderedDict[str, WarmPrefix]] = {}
        # key -> the pools it is warm in, as the snapshot shows them
        self._by_key: dict[str, tuple[WarmPrefix, ...]] = {}
        self._warm: Mapping[str, tuple[WarmPrefix, ...]] = {}
        self._flows: OrderedDict[str, WarmPrefix] = OrderedDict()
        self._flows_view: Mapping[str, WarmPrefix] = MappingProxyType(self._flows)
        # the snapshot ``attach`` was last given and what it returned
        self._attached: tuple[FleetSnapshot, Mapping[str, object], FleetSnapshot] | None = None

    def record_hit(self, region: str, pool: str, key: str, cached_tokens: int, at: float) -> None:
        self._staged.append((region, pool, key, cached_tokens, at))

    def record_dispatch(self, candidate: Candidate, request: Request, now: float) -> None:
        workflow = request.workflow_id
        if not workflow:
            return
        flows = self._flows
        flows[workflow] = WarmPrefix(candidate.region.name, candidate.pool.name, request.prompt_tokens, now,
                                     source="workflow")
        flows.move_to_end(workflow)
        if len(flows) > MAX_WORKFLOWS:
            flows.popitem(last=False)

    def publish(self, now: float, up: Iterable[str]) -> None:
        """The regions in ``up`` publish their staged hits; hits older than the max age leave."""
        regions = set(up)
        changed: set[str] = set()
        kept: list[tuple[str, str, str, int, float]] = []
        for hit in self._staged:
            region, pool, key, tokens, at = hit
            if region not in regions:
                kept.append(hit)
                continue
            keys = self._pools.setdefault((region, pool), OrderedDict())
            keys[key] = WarmPrefix(region, pool, tokens, at)
            keys.move_to_end(key)
            changed.add(key)
            if len(keys) > MAX_KEYS_PER_POOL:
                changed.add(keys.popitem(last=False)[0])
        self._staged = kept
        oldest = now - self.max_age_s
        for keys in self._pools.values():
            # Hits are recorded in time order: the stale ones are at the front.
            while keys:
                key, warm = next(iter(keys.items()))
                if warm.observed_at >= oldest:
                    break
                del keys[key]
                changed.add(key)
        if not changed:
            return
        by_key = self._by_key
        for key in changed:
            places = tuple(keys[key] for keys in self._pools.values() if key in keys)
            if places:
                by_key[key] = places
            else:
                by_key.pop(key, None)
        if len(by_key) > MAX_WARM_KEYS:
            newest = sorted(by_key, key=lambda k: max(w.observed_at for w in by_key[k]), reverse=True)
            self._warm = {k: by_key[k] for k in newest[:MAX_WARM_KEYS]}
        else:
            self._warm = dict(by_key)

    def attach(self, snapshot: FleetSnapshot, now: float) -> FleetSnapshot:
        """``snapshot`` carrying the published hits and the workflows fresh at ``now``."""
        flows = self._flows
        oldest = now - self.max_age_s
        while flows and next(iter(flows.values())).observed_at < oldest:
            flows.popitem(last=False)
        attached = self._attached
        if attached is not None and attached[0] is snapshot and attached[1] is self._warm:
            return attached[2]
        copy = snapshot.copy_with(prefix_warm=self._warm, workflows=self._flows_view)
        self._attached = (snapshot, self._warm, copy)
        return copy


class SimDataLayer:
    def __init__(
        self,
        builder: SnapshotBuilder,
        carbon: CarbonReplay,
        pools: Mapping[str, Sequence[PoolSim]],
        refresh_s: float = 1.0,
        affinity: bool = False,
    ) -> None:
        self.builder = builder
        self.carbon = carbon
        self.refresh_s = refresh_s
        # region -> its simulated pools (those serving the simulated model)
        self._pools = {name: tuple(pools.get(name, ())) for name in (r.name for r in builder.regions)}
        # region -> the state each of its pools last published, by pool name (every pool of its
        # config: one that is not simulated, or never published, is idle). A new mapping when a
        # pool publishes another state, the same object while none does (the snapshot builder
        # and the pool-served filter then reuse what they derived from it).
        self._published_pools: dict[str, Mapping[str, PoolLiveState]] = {
            r.name: {p.name: PoolLiveState() for p in r.pools} for r in builder.regions}
        # The pools whose next publication may differ from their last, each with its region and
        # name: every pool until its first one, then a pool from the request sent to it until it
        # is ``quiet`` again. A quiet pool would publish its last state: it is not asked (sparse
        # arrivals leave most pools quiet at most publications).
        self._active: dict[PoolSim, tuple[str, str]] = {
            pool: (region, pool.candidate.pool.name) for region, sims in self._pools.items() for pool in sims}
        self._place = {(region, pool.candidate.pool.name): pool for region, sims in self._pools.items() for pool in sims}
        # the carbon mapping ``_exact_until`` last read, and its signals' stale-from times, sorted
        self._carbon_limits: tuple[object, float, list[float]] | None = None
        self._zones = tuple(dict.fromkeys(r.grid_zone for r in builder.regions))
        # (zone, hour) -> the zone's trailing maximum then (``_carbon_bounds``)
        self._bounds: dict[tuple[str, int], float | None] = {}
        self.down: set[str] = set()
        self.published: dict[str, RegionLiveState] = {}
        self._snapshot: FleetSnapshot | None = None
        # What the last snapshot was built from, and until when it stays exact.
        self._inputs: tuple[object, ...] = ()
        self._valid_until = 0.0
        # region -> the last time it published (its state may be unchanged since the build)
        self._last_publish: dict[str, float] = {}
        self.pending = PendingDispatches()
        self.affinity = SimAffinity(builder.policy) if affinity else None

    def record_dispatch(self, snapshot: FleetSnapshot, candidate: Candidate, request: Request, now: float,
                        prefill: float | None = None) -> None:
        """The engine sent ``request`` to ``candidate``: as ``SnapshotRefresher.record_dispatch``
        (``prefill``: the request's predicted prefill there, ``PendingDispatches.record``)."""
        self.pending.record(snapshot, candidate, request, now, prefill)
        region, name = candidate.region.name, candidate.pool.name
        pool = self._place[(region, name)]
        if pool not in self._active:
            # Its region published at every snapshot since the pool went quiet.
            pool.published_quiet(self._last_publish[region])
            self._active[pool] = (region, name)
        if self.affinity is not None:
            self.affinity.record_dispatch(candidate, request, now)

    def replicas_changed(self, pool: PoolSim) -> None:
        """The autoscaler started, readied or retired replicas of ``pool``: it publishes its new
        replica counts at the next snapshot, even where no request has been sent to it since it
        went quiet (a pool scaled to zero while idle must be seen cold)."""
        if pool not in self._active:
            region, name = pool.candidate.region.name, pool.candidate.pool.name
            pool.published_quiet(self._last_publish[region])
            self._active[pool] = (region, name)

    def _handed_out(self, snap: FleetSnapshot, now: float) -> FleetSnapshot:
        applied = self.pending.apply(snap)
        return applied if self.affinity is None else self.affinity.attach(applied, now)

    def snapshot(self, now: float) -> FleetSnapshot:
        """The snapshot a router would hold at ``now`` (rebuilt when older than refresh_s).

        A rebuild whose inputs (pool states, carbon signals, regions down) equal the last
        one's, before any signal or region state crosses its maximum age, would decide
        exactly as the last snapshot does: then the last one is kept (with sparse arrivals
        that saves a rebuild per request)."""
        snap = self._snapshot
        if snap is not None and now - snap.now < self.refresh_s:
            return self._handed_out(snap, now)
        carbon = self.carbon.published(now)
        down = self.down
        published_pools = self._published_pools
        active = self._active
        # Whether a pool publishes another state than it last did: the inputs then differ from
        # the last build's (every publication either builds or finds them equal to its inputs).
        changed = False
        for pool, (region, name) in list(active.items()):
            if region in down:
                continue
            state = pool.live(now)
            pools = published_pools[region]
            was = pools[name]
            if state is not was and state != was:
                pools = published_pools[region] = {**pools, name: state}  # the snapshots hold the last one
                changed = True
            if pool.quiet:
                del active[pool]
        # (``_published_pools`` is in region order)
        live = dict(published_pools) if not down else {r: p for r, p in published_pools.items() if r not in down}
        published_at = dict.fromkeys(live, now)
        self._last_publish.update(published_at)
        self.pending.settle_regions(published_at, now)
        if self.affinity is not None:
            self.affinity.publish(now, live)
        inputs = (carbon, frozenset(self.down), live)
        if snap is not None and not changed and now <= self._valid_until and self._same(inputs):
            return self._handed_out(snap, now)
        published = self.published
        for region in self.down:
            # It kept publishing (unchanged) until it went down.
            last = published.get(region)
            if last is not None and self._last_publish.get(region, 0.0) > last.observed_at:
                published[region] = dataclasses.replace(last, observed_at=self._last_publish[region])
        _healthy_states(live, now, published)
        snap = self.builder.build(now, carbon, published, carbon_bounds=self._carbon_bounds(carbon, now))
        self._snapshot, self._inputs = snap, inputs
        self._valid_until = self._exact_until(snap)
        return self._handed_out(snap, now)

    def _carbon_bounds(self, carbon: Mapping[str, Signal], now: float) -> Mapping[str, float]:
        """The bounds a stale zone's candidates are priced at (``FleetSnapshot.carbon_bounds``):
        each such zone's highest accepted value over the policy's window, as a router's data
        layer keeps it (``CarbonReplay.trailing_max``). Only for the zones whose signal is stale,
        missing or invalid: the carbon scorer reads no other."""
        policy = self.builder.policy
        max_age = policy.max_age.carbon
        bounds: dict[str, float] = {}
        for zone in self._zones:
            signal = carbon.get(zone)
            if signal is not None and signal_problem(signal, now, max_age) is None:
                continue
            key = (zone, int(now // 3600.0))
            if key not in self._bounds:
                if len(self._bounds) >= 4096:
                    self._bounds.clear()
                self._bounds[key] = self.carbon.trailing_max(zone, now, policy.stale_bounds.carbon_window)
            bound = self._bounds[key]
            if bound is not None:
                bounds[zone] = bound
        return bounds

    def _same(self, inputs: tuple[object, ...]) -> bool:
        return bool(self._inputs) and inputs[0] is self._inputs[0] and inputs[1:] == self._inputs[1:]

    def _exact_until(self, snap: FleetSnapshot) -> float:
        """The last time at which every signal and down region's last state in ``snap`` is as
        fresh or as stale as at ``snap.now`` (stale means age > max age: a value is stale
        from just after observed_at + max age)."""
        max_age = snap.policy.max_age
        carbon = self._inputs[0]
        kept = self._carbon_limits
        if kept is None or kept[0] is not carbon or kept[1] != max_age.carbon:
            # Once per carbon mapping the replay publishes (an hour's); a NaN limit is never
            # reached (nor sortable).
            stale_from = (s.observed_at + max_age.carbon for s in snap.carbon.values())
            kept = (carbon, max_age.carbon, sorted(t for t in stale_from if not math.isnan(t)))
            self._carbon_limits = kept
        limits = kept[2]
        first = bisect.bisect_left(limits, snap.now)
        until = limits[first] if first < len(limits) else math.inf
        for r in self.down:
            last = self.published.get(r)
            if last is not None and snap.now <= (t := last.observed_at + max_age.region_state) < until:
                until = t
        return until
