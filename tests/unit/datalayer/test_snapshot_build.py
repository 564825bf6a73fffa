"""The snapshot builder reuses what did not change: a region whose fresh pool states equal the
last build's keeps its candidates' predictions, and the result is always what a builder
that never saw an earlier build makes."""

from __future__ import annotations

import dataclasses
import random

from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.types import FleetSnapshot, PoolLiveState, RegionLiveState
from tests.literals import NOW, carbon, pool, region


def test_a_snapshot_has_every_field_the_constructor_sets(default_policy) -> None:  # type: ignore[no-untyped-def]
    snapshot = SnapshotBuilder((region("a", zone="A"),), default_policy).build(NOW, carbon={"A": carbon("A", 90)})
    fields = {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(FleetSnapshot)}
    assert set(vars(snapshot)) >= set(fields)
    rebuilt = FleetSnapshot(**fields)
    assert all(getattr(rebuilt, name) is value for name, value in fields.items())
    assert snapshot.live_key is not SnapshotBuilder((region("a"),), default_policy).build(NOW).live_key


def test_incremental_builds_equal_builds_from_scratch(default_policy) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(2)
    regions = tuple(region(f"r{i}", pools=[pool("h100", "H100-80GB"), pool("l4", "L4", count=4)]) for i in range(6))
    builder = SnapshotBuilder(regions, default_policy)
    live: dict[str, RegionLiveState] = {}
    now = NOW
    for _ in range(60):
        now += rng.choice((0.5, 1.0, 7.0))
        for r in regions:
            roll = rng.random()
            if roll < 0.1:
                live.pop(r.name, None)  # never seen / expired
            elif roll < 0.4 or r.name not in live:
                live[r.name] = RegionLiveState(r.name, True, now, {p.name: PoolLiveState(
                    running=rng.choice((0, 3, 30)), queue_depth=rng.choice((0, 2)),
                    kv_cache_usage=rng.choice((0.0, 0.5)), arrival_rate=rng.choice((0.0, 1.5))) for p in r.pools})
            elif roll < 0.7:
                # republished unchanged: same pool mapping, or an equal copy of it
                state = live[r.name]
                pools = state.pools if rng.random() < 0.5 else dict(state.pools)
                live[r.name] = RegionLiveState(r.name, True, now, pools)
            # else: not republished (it ages, and goes stale after max_age.region_state)
        snapshot = builder.build(now, live=dict(live))
        fresh = SnapshotBuilder(regions, default_policy).build(now, live=dict(live))
        assert snapshot.perf == fresh.perf
