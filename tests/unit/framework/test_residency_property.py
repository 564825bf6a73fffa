"""Property: whatever the snapshot (carbon, live state, kill switch) and the request, no
decision ever places a request outside its allowed jurisdictions, not even in failover."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.types import GeoPoint, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region

JURISDICTIONS = ("EU", "US", "UK", "JP", "SG")
GPUS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L4", "B200")


@st.composite
def fleets(draw: st.DrawFn) -> list:  # type: ignore[type-arg]
    n = draw(st.integers(1, 6))
    regions = []
    for i in range(n):
        gpus = draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True))
        regions.append(
            region(f"r{i}", draw(st.sampled_from(JURISDICTIONS)), zone=f"Z{i}",
                   lat=draw(st.floats(-60, 70)), lon=draw(st.floats(-179, 179)),
                   pools=[pool(f"p{j}", g) for j, g in enumerate(gpus)])
        )
    return regions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    regions=fleets(),
    allowed=st.frozensets(st.sampled_from(JURISDICTIONS), min_size=1, max_size=3),
    prompt=st.integers(1, 150_000),
    out=st.integers(1, 4096),
    carbon_values=st.lists(st.floats(0, 1000), min_size=6, max_size=6),
    carbon_ages=st.lists(st.floats(0, 20_000), min_size=6, max_size=6),
    live_ages=st.lists(st.one_of(st.none(), st.floats(0, 30)), min_size=6, max_size=6),
    healthy=st.lists(st.booleans(), min_size=6, max_size=6),
    energy_on=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_never_outside_allowed_jurisdictions(  # type: ignore[no-untyped-def]
    make_snapshot, regions, allowed, prompt, out, carbon_values, carbon_ages, live_ages, healthy, energy_on, seed
) -> None:
    signals = [carbon(f"Z{i}", carbon_values[i], carbon_ages[i]) for i in range(len(regions))]
    live = [
        RegionLiveState(region=r.name, healthy=healthy[i], observed_at=NOW - age,
                        pools={p.name: PoolLiveState(queue_depth=i, kv_cache_usage=0.1 * i) for p in r.pools})
        for i, (r, age) in enumerate(zip(regions, live_ages, strict=False))
        if age is not None
    ]
    snapshot = make_snapshot(regions, carbon_signals=signals, live=live, energy_routing_enabled=energy_on)
    request = Request(request_id="p", model="llama-3.1-8b", prompt_tokens=prompt, max_tokens=out,
                      allowed_jurisdictions=allowed, client_location=GeoPoint(48.0, 2.0))
    decision = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(seed)).schedule(request, snapshot)
    for candidate in decision.ranked_candidates:
        assert candidate.region.jurisdiction in allowed
    if not any(r.jurisdiction in allowed for r in regions):
        assert not decision.schedulable
