"""Simulated pools (replicas behind power-of-two choices, what they publish) and the truth model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.step import StepCosts
from scheduler.sim.pools import PoolSim
from scheduler.sim.replica import Seq
from scheduler.sim.truth import GROUPS, truth_costs
from scheduler.types import Candidate
from tests.unit.sim.kit import PARIS, policy, region

COSTS = StepCosts(t_step=0.01, t_token=0.001, t_kv=1e-4, t_pair=1e-5, e_step=10.0, e_token=1.0, e_kv=0.1,
                  e_pair=0.01, idle_w=50.0, max_num_seqs=2, max_batched_tokens=8, kv_capacity_tokens=100)


def candidate(gpus: int) -> Candidate:
    return SnapshotBuilder(compile_fleet((region("near", "DIRTY", PARIS, gpus=gpus),)), compile_policy(policy())).candidates[0]


def pool(gpus: int, seed: int = 0) -> PoolSim:
    return PoolSim(candidate(gpus), COSTS, lambda seq: None, seed)


def test_a_pool_has_one_replica_per_tensor_parallel_group_of_gpus() -> None:
    assert len(pool(8).replicas) == 8
    assert len(pool(1).replicas) == 1


def test_power_of_two_choices_sends_to_the_less_loaded_of_two() -> None:
    p = pool(2)
    busy, idle = p.replicas
    for k in range(3):
        busy.arrive(Seq(0.0, 4, 4), 0.0)
        assert p.choose() is idle, k


def test_replica_choice_is_seeded() -> None:
    def choices(seed: int) -> list[int]:
        p = pool(8, seed)
        return [p.replicas.index(p.choose()) for _ in range(20)]

    assert choices(1) == choices(1)
    assert choices(1) != choices(2)


def test_live_state_sums_the_replicas() -> None:
    p = pool(2)
    first, second = p.replicas
    for replica in (first, second, second):
        replica.arrive(Seq(0.0, 4, 4), 0.0)
    assert (p.live(0.0).queue_depth, p.live(0.0).running) == (3, 0)
    # Admission at the step boundary: 2 run (max_num_seqs 2 per replica, both fit).
    first.boundary(0.0)
    second.boundary(0.0)
    live = p.live(0.0)
    assert (live.queue_depth, live.running) == (0, 3)
    assert live.kv_cache_usage == 0.0  # nothing in the cache until the prefill step ends
    taken = p.drain()
    assert taken == [] and p.live(0.0) is live  # unchanged: the same object


def test_live_state_publishes_smoothed_arrival_rates() -> None:
    p = pool(2)
    p.live(0.0)  # the first publication opens the window
    for second in range(1, 61):  # 4 requests of 400 tokens every second for a minute
        for _ in range(4):
            p.sent(400)
        live = p.live(float(second))
    assert live.arrival_rate == pytest.approx(4.0, rel=0.01)
    assert live.prompt_tokens_rate == pytest.approx(1600.0, rel=0.01)
    first = p.live(61.0).arrival_rate  # nothing sent in the last second: the average decays
    assert 3.0 < first < 4.0


def test_drain_takes_the_waiting_requests_only() -> None:
    p = pool(1)
    (replica,) = p.replicas
    waiting = [Seq(0.0, 4, 4) for _ in range(3)]
    for seq in waiting:
        replica.arrive(seq, 0.0)
    replica.boundary(0.0)  # admits two
    assert p.drain() == waiting[2:]
    assert p.live(0.0).queue_depth == 0 and p.live(0.0).running == 2


def test_truth_without_error_is_the_rated_costs() -> None:
    assert truth_costs(COSTS, 0.0, seed=3, pool_key="eu/h100") is COSTS


def test_truth_errors_are_seeded_per_pool_and_lognormal() -> None:
    one = truth_costs(COSTS, 0.2, seed=3, pool_key="eu/h100")
    assert one == truth_costs(COSTS, 0.2, seed=3, pool_key="eu/h100")
    assert one != truth_costs(COSTS, 0.2, seed=3, pool_key="us/h100")
    assert one != truth_costs(COSTS, 0.2, seed=4, pool_key="eu/h100")
    # Limits and capacities are never perturbed.
    assert (one.max_num_seqs, one.max_batched_tokens, one.kv_capacity_tokens) == (2, 8, 100)
    pools = [truth_costs(COSTS, 0.2, seed=0, pool_key=f"r{i}/p") for i in range(2000)]
    for group in GROUPS:
        time_log = np.log([getattr(p, f"t_{group}") / getattr(COSTS, f"t_{group}") for p in pools])
        energy_log = np.log([getattr(p, f"e_{group}") / getattr(COSTS, f"e_{group}") for p in pools])
        assert abs(time_log.mean()) < 0.02 and time_log.std() == pytest.approx(0.2, rel=0.1)
        # energy = time x power: both factors
        assert energy_log.std() == pytest.approx(0.2 * np.sqrt(2), rel=0.1)
    assert np.log([p.idle_w / COSTS.idle_w for p in pools]).std() == pytest.approx(0.2, rel=0.1)


def test_truth_error_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        truth_costs(dataclasses.replace(COSTS), -0.1, seed=0, pool_key="x")
