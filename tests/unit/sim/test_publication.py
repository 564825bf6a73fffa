"""An idle pool publishes the very state it published before (its rates at 0, nothing sent),
so the simulator's data layer hands the builder the same region mapping and the builder keeps
its predictions; the first request sent changes it."""

from __future__ import annotations

from scheduler.sim.pools import PoolSim
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
