"""An idle pool publishes the very state it published before (its rates at 0, nothing sent),
so the simulator's data layer hands the builder the same region mapping and the builder keeps
its predictions; the first request sent changes it."""

from __future__ import annotations

import heapq
import random

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.datalayer import SimDataLayer, _healthy_states
from scheduler.sim.pools import PoolSim, _pool_state
from scheduler.sim.replica import Replica, Seq
from scheduler.types import PoolLiveState, RegionLiveState, Request
from tests.unit.sim import kit
from tests.unit.sim.test_pools import COSTS, candidate


def test_an_idle_pool_republishes_the_same_state_until_something_is_sent() -> None:
    p = PoolSim(candidate(2), COSTS, lambda seq: None, 0)
    first = p.live(0.0)
    assert all(p.live(float(t)) is first for t in range(1, 50))
    p.sent(100)
    busy = p.live(50.0)
    assert busy is not first and busy.arrival_rate > 0
    # the averages decay to 0 (rounded), then the state is the same object again
    states = [p.live(50.0 + 30 * k) for k in range(1, 8)]
    assert states[-1].arrival_rate == 0.0 and states[-1].prompt_tokens_rate == 0.0
    assert p.live(400.0) is states[-1]


def test_the_data_layer_publishes_what_every_pool_would_though_it_asks_only_those_not_quiet() -> None:
    """The data layer asks a pool for its state only while it may have changed (from the
    request sent to it until it is quiet again); the states it publishes are, at every
    snapshot, those of a copy of the fleet whose every pool is asked every time."""
    regions = tuple(kit.region(f"r{i}", f"Z{i}", kit.PARIS, gpus=2) for i in range(4))
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(kit.policy()))

    def fleet() -> list[PoolSim]:
        return [PoolSim(c, COSTS, lambda seq: None, 7) for c in builder.candidates]

    skipped, every = fleet(), fleet()
    data = SimDataLayer(builder, CarbonReplay({}), {p.candidate.region.name: [p] for p in skipped}, refresh_s=0.0)
    heaps: tuple[list[tuple[float, int, Replica]], ...] = ([], [])
    rng = random.Random(3)
    now, tie = 0.0, 0
    for step in range(600):
        now += rng.choice((0.001, 0.05, 0.5, 3.0, 30.0))
        for heap in heaps:
            while heap and heap[0][0] <= now:
                at, _, replica = heapq.heappop(heap)
                then = replica.boundary(at)
                if then is not None:
                    tie += 1
                    heapq.heappush(heap, (then, tie, replica))
        snapshot = data.snapshot(now)
        expected = [p.live(now) for p in every]
        published = [snapshot.live[p.candidate.region.name].pools[p.candidate.pool.name] for p in skipped]
        assert published == expected, step
        if rng.random() < 0.15:
            k = rng.randrange(len(skipped))
            # some decode for minutes: their pools' rates decay to 0 while they run
            prompt, output = rng.randint(1, 40), rng.choice((rng.randint(1, 30), rng.randint(2000, 8000)))
            request = Request(request_id=f"q{step}", model="llama-3.1-8b", prompt_tokens=prompt, max_tokens=output)
            data.record_dispatch(snapshot, skipped[k].candidate, request, now)
            for pools, heap in zip((skipped, every), heaps, strict=True):
                pools[k].sent(prompt)
                replica = pools[k].choose()
                then = replica.arrive(Seq(now, prompt, output), now)
                if then is not None:
                    tie += 1
                    heapq.heappush(heap, (then, tie, replica))


def test_published_states_are_the_ones_the_constructor_makes() -> None:
    # The data layer and the pools set the states' slots directly (cheaper than their __init__).
    pools = {"a": PoolLiveState(running=3)}
    made: dict[str, RegionLiveState] = {}
    _healthy_states({"r1": pools, "r2": {}}, 12.5, made)
    assert made == {"r1": RegionLiveState("r1", True, 12.5, pools), "r2": RegionLiveState("r2", True, 12.5, {})}
    assert made["r1"].pools is pools
    state = _pool_state(4, 7, 2, 1, 0.25, 0.5, 1.5, 300.0)
    expected = PoolLiveState(queue_depth=4, running=7, kv_cache_usage=0.25, prefix_cache_hit_rate=0.5,
                             arrival_rate=1.5, prompt_tokens_rate=300.0, replicas=2, starting_replicas=1)
    assert state == expected
    assert hash(state) == hash(expected)
