"""The simulator's data layer: what the router's refresher does, on the simulated clock.

Every ``refresh_s`` of simulated time (lazily, when a request arrives and the snapshot is
older) each region that is up publishes its pools' live state (``observed_at`` = now); a
region that is down publishes nothing, so its last state ages past the policy's
``max_age.region_state``. Carbon signals are what the replayed provider had published.
Then ``SnapshotBuilder`` builds the snapshot, exactly as in the router.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

    def snapshot(self, now: float) -> FleetSnapshot:
        """The snapshot a router would hold at ``now`` (rebuilt when older than refresh_s)."""
        snap = self._snapshot
        if snap is not None and now - snap.now < self.refresh_s:
            return snap
        published = self.published
        for region, pools in self._pools.items():
            if region in self.down:
                continue
            states = dict(self._idle[region])
            for pool in pools:
                states[pool.candidate.pool.name] = pool.live()
            published[region] = RegionLiveState(region, True, now, states)
        snap = self.builder.build(now, self.carbon.published(now), published)
        self._snapshot = snap
        return snap
