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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from scheduler.datalayer.pending import PendingDispatches
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.pools import PoolSim
from scheduler.types import FleetSnapshot, PoolLiveState, RegionLiveState


class SimDataLayer:
    def __init__(
        self,
        builder: SnapshotBuilder,
        carbon: CarbonReplay,
        pools: Mapping[str, Sequence[PoolSim]],
        refresh_s: float = 1.0,
    ) -> None:
        self.builder = builder
        self.carbon = carbon
        self.refresh_s = refresh_s
        # region -> its simulated pools (those serving the simulated model)
        self._pools = {name: tuple(pools.get(name, ())) for name in (r.name for r in builder.regions)}
        self._idle = {
            r.name: {p.name: PoolLiveState() for p in r.pools} for r in builder.regions
        }
        self.down: set[str] = set()
        self.published: dict[str, RegionLiveState] = {}
        self._snapshot: FleetSnapshot | None = None
        # What the last snapshot was built from, and until when it stays exact.
        self._inputs: tuple[object, ...] = ()
        self._valid_until = 0.0
        # region -> the last time it published (its state may be unchanged since the build)
        self._last_publish: dict[str, float] = {}
        self.pending = PendingDispatches()
        # region -> the pool states it last published and the mapping made of them
        self._states: dict[str, tuple[tuple[PoolLiveState, ...], Mapping[str, PoolLiveState]]] = {}

    def snapshot(self, now: float) -> FleetSnapshot:
        """The snapshot a router would hold at ``now`` (rebuilt when older than refresh_s).

        A rebuild whose inputs (pool states, carbon signals, regions down) equal the last
        one's, before any signal or region state crosses its maximum age, would decide
        exactly as the last snapshot does: then the last one is kept (with sparse arrivals
        that saves a rebuild per request)."""
        snap = self._snapshot
        if snap is not None and now - snap.now < self.refresh_s:
            return self.pending.apply(snap)
        carbon = self.carbon.published(now)
        down = self.down
        live = {region: tuple([pool.live(now) for pool in pools]) for region, pools in self._pools.items()
                if region not in down}
        for region in live:
            self._last_publish[region] = now
        self.pending.settle_regions(dict.fromkeys(live, now), now)
        inputs = (carbon, frozenset(self.down), live)
        if snap is not None and now <= self._valid_until and self._same(inputs):
            return self.pending.apply(snap)
        published = self.published
        for region in self.down:
            # It kept publishing (unchanged) until it went down.
            last = published.get(region)
            if last is not None and self._last_publish.get(region, 0.0) > last.observed_at:
                published[region] = dataclasses.replace(last, observed_at=self._last_publish[region])
        for region, pool_states in live.items():
            # The same mapping while the region's pool states are the same (the snapshot
            # builder then reuses its candidates' predictions).
            kept = self._states.get(region)
            if kept is not None and kept[0] == pool_states:
                states = kept[1]
            else:
                states = dict(self._idle[region])
                for pool, state in zip(self._pools[region], pool_states, strict=True):
                    states[pool.candidate.pool.name] = state
                self._states[region] = (pool_states, states)
            published[region] = RegionLiveState(region, True, now, states)
        snap = self.builder.build(now, carbon, published)
        self._snapshot, self._inputs = snap, inputs
        self._valid_until = self._exact_until(snap)
        return self.pending.apply(snap)

    def _same(self, inputs: tuple[object, ...]) -> bool:
        return bool(self._inputs) and inputs[0] is self._inputs[0] and inputs[1:] == self._inputs[1:]

    def _exact_until(self, snap: FleetSnapshot) -> float:
        """The last time at which every signal and down region's last state in ``snap`` is as
        fresh or as stale as at ``snap.now`` (stale means age > max age: a value is stale
        from just after observed_at + max age)."""
        max_age = snap.policy.max_age
        limits = [s.observed_at + max_age.carbon for s in snap.carbon.values()]
        limits += [self.published[r].observed_at + max_age.region_state for r in self.down if r in self.published]
        return min((t for t in limits if t >= snap.now), default=float("inf"))
