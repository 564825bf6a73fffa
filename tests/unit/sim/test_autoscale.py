"""The simulator's autoscaler: a hand-worked trace, the same decisions as Ray Serve's own policy
code on random traces, and a pool's warm time and cold-start energy as replicas come and go."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.sim.autoscale import AutoscalingSettings, PoolAutoscaler, PoolAutoscaling
from scheduler.sim.pools import PoolSim
from scheduler.sim.replica import Seq
from tests.unit.sim.kit import PARIS, policy, region

pytestmark = pytest.mark.timeout(120)

SETTINGS = PoolAutoscaling(min_replicas=1, max_replicas=8, target_ongoing_requests=10.0, cold_start_s=60.0,
                           cold_start_j=6000.0, metrics_interval_s=10.0, look_back_period_s=30.0, upscale_delay_s=30.0,
                           downscale_delay_s=60.0)


@dataclass(frozen=True)
class Step:
    t: float
    running: int  # replicas running (warm) at t
    sample: float  # ongoing requests sampled at t
    mean: float  # the look-back mean, worked by hand
    target: int  # the decision, worked by hand


# Worked by hand (target 10 requests a replica, look-back 30 s = the samples of the last 3 ticks):
HAND_TRACE = (
    Step(0, 1, 10, 10.0, 1),    # 10 / 10 = 1 replica: as it is
    Step(10, 1, 40, 25.0, 1),   # mean (10 + 40) / 2 = 25 -> ceil(2.5) = 3 > 1: upscale wish starts at 10
    Step(20, 1, 40, 30.0, 1),   # 3 replicas wished for 10 s < 30 s
    Step(30, 1, 40, 40.0, 1),   # mean of 40, 40, 40 (10 is past the look-back): 4, wished for 20 s
    Step(40, 1, 40, 40.0, 4),   # wished for 30 s: 4 replicas (3 start cold)
    Step(50, 1, 40, 40.0, 4),   # still cold: 1 running; desired 4 = target: no wish
    Step(60, 4, 40, 40.0, 4),
    Step(70, 4, 200, 93.3, 4),  # mean (40 + 40 + 200) / 3 = 93.3 -> 10 > 8: wish starts
    Step(80, 4, 0, 80.0, 4),    # (40 + 200 + 0) / 3 = 80 -> 8: still an upscale wish, 10 s old
    Step(90, 4, 0, 66.7, 4),    # 66.7 -> 7, 20 s old
    Step(100, 4, 0, 0.0, 4),    # 0 -> ceil(0) = 0 < 4: the upscale wish is broken, downscale wish starts
    Step(110, 4, 0, 0.0, 4),
    Step(150, 4, 0, 0.0, 4),    # 50 s
    Step(160, 4, 0, 0.0, 1),    # 60 s: down to max(1, 0) = 1 (not to zero: only 1 -> 0 may)
    Step(170, 1, 0, 0.0, 1),    # a 1 -> 0 wish starts (min_replicas 1 would hold it at 1 anyway)
)


def test_decisions_follow_a_hand_worked_trace() -> None:
    scaler = PoolAutoscaler(SETTINGS, replicas=8)
    assert scaler.target == 1
    for step in HAND_TRACE:
        mean = scaler.observe(step.t, step.sample)
        assert mean == pytest.approx(step.mean, abs=0.05), step
        assert scaler.decide(step.t, step.running, mean) == step.target, step


def test_scale_to_zero_waits_its_own_delay_and_wakes_at_once() -> None:
    settings = PoolAutoscaling(min_replicas=0, max_replicas=4, target_ongoing_requests=10.0, cold_start_s=60.0,
                               cold_start_j=6000.0, downscale_delay_s=60.0, downscale_to_zero_delay_s=300.0,
                               initial_replicas=1)
    scaler = PoolAutoscaler(settings, replicas=4)
    assert scaler.decide(0.0, 1, 0.0) == 1       # 1 -> 0 wished from t = 0
    assert scaler.decide(290.0, 1, 0.0) == 1
    assert scaler.decide(300.0, 1, 0.0) == 0     # after downscale_to_zero_delay_s, not downscale_delay_s
    assert scaler.decide(310.0, 0, 0.0) == 0
    assert scaler.decide(311.0, 0, 3.0) == 1     # a request at a pool at zero: the cold-start fast path


def _ray_decisions(settings: PoolAutoscaling, trace: list[tuple[float, int, float]], replicas: int) -> list[int]:
    """Ray Serve 2.60's own code on ``trace``: its default policy wrapped as its controller wraps
    it (``_apply_autoscaling_config``), its clock at each step's time, then ``apply_bounds``."""
    from ray.serve import autoscaling_policy
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    low, high = settings.bounds(replicas)
    config = AutoscalingConfig(min_replicas=low, max_replicas=high,
                               initial_replicas=settings.initial(replicas),
                               target_ongoing_requests=settings.target_ongoing_requests,
                               upscale_delay_s=settings.upscale_delay_s,
                               downscale_delay_s=settings.downscale_delay_s,
                               downscale_to_zero_delay_s=settings.downscale_to_zero_delay_s,
                               upscaling_factor=settings.upscaling_factor,
                               downscaling_factor=settings.downscaling_factor)
    policy = autoscaling_policy._apply_autoscaling_config(autoscaling_policy.replica_queue_length_autoscaling_policy)
    target = settings.initial(replicas)
    state: dict[str, Any] = {}
    out = []
    clock = autoscaling_policy.time.time
    try:
        for t, running, ongoing in trace:
            autoscaling_policy.time.time = lambda t=t: t  # type: ignore[misc]
            ctx = AutoscalingContext(
                deployment_id=None, deployment_name="pool", app_name="region", current_num_replicas=running,
                target_num_replicas=target, running_replicas=[], total_num_requests=ongoing,
                total_queued_requests=0.0, aggregated_metrics=None, raw_metrics=None,
                capacity_adjusted_min_replicas=low, capacity_adjusted_max_replicas=high, policy_state=state,
                last_scale_up_time=None, last_scale_down_time=None, current_time=t, config=config)
            decision, state = policy(ctx)
            target = max(low, min(high, decision))
            out.append(target)
    finally:
        autoscaling_policy.time.time = clock  # type: ignore[misc]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_same_decisions_as_ray_serves_policy_code(seed: int) -> None:
    rng = random.Random(seed)
    settings = PoolAutoscaling(
        cold_start_s=60.0, cold_start_j=6000.0, min_replicas=rng.choice((0, 1, 2)), max_replicas=rng.choice((4, 16)),
        target_ongoing_requests=rng.choice((2.0, 8.0, 32.0)), upscale_delay_s=rng.choice((0.0, 30.0)),
        downscale_delay_s=rng.choice((20.0, 600.0)), downscale_to_zero_delay_s=rng.choice((None, 50.0)),
        upscaling_factor=rng.choice((1.0, 0.5, 2.0)), downscaling_factor=rng.choice((1.0, 0.3)))
    replicas = 16
    scaler = PoolAutoscaler(settings, replicas)
    trace: list[tuple[float, int, float]] = []
    mine: list[int] = []
    running = settings.initial(replicas)
    level = 0.0
    for k in range(400):
        t = 10.0 * k
        # load in phases of 80 ticks, noisy; running replicas trail the target (cold starts)
        if k % 80 == 0:
            level = (150.0, 0.0, 40.0, 5.0, 0.0)[k // 80]
        ongoing = max(0.0, level + rng.uniform(-3, 3))
        trace.append((t, running, ongoing))
        mine.append(scaler.decide(t, running, ongoing))
        running = mine[-1] if rng.random() < 0.5 else min(running, mine[-1])
    assert mine == _ray_decisions(settings, trace, replicas)
    targets = [settings.initial(replicas), *mine]
    assert any(a < b for a, b in itertools.pairwise(targets))  # it scaled up
    assert any(a > b for a, b in itertools.pairwise(targets))  # and down


def _pool(settings: AutoscalingSettings) -> PoolSim:
    candidate = SnapshotBuilder(compile_fleet((region("r", "CLEAN", PARIS, gpus=4),)), compile_policy(policy())).candidates[0]
    builder = SnapshotBuilder(compile_fleet((region("r", "CLEAN", PARIS, gpus=4),)), compile_policy(policy()))
    costs = builder.energy_model.rated_costs(candidate.model, candidate.gpu, "bf16", 1).costs
    return PoolSim(candidate, costs, lambda seq: None, autoscaling=settings.for_pool(candidate, costs.max_num_seqs),
                   start=0.0)


def test_a_pools_warm_time_and_cold_start_energy_as_replicas_come_and_go() -> None:
    pool = _pool(AutoscalingSettings(min_replicas=1, cold_start_s=60.0, cold_start_j=6000.0))
    assert len(pool.replicas) == 1 and len(pool.every) == 1
    assert pool.scale_to(3, 0.0, 60.0, 6000.0) == [60.0, 60.0]     # two cold starts
    assert pool.cold_starts == 2 and pool.cold_start_j == 12000.0
    assert pool.ready(30.0) == [] and len(pool.replicas) == 1
    pool.ready(60.0)
    assert len(pool.replicas) == 3
    pool.scale_to(4, 90.0, 60.0, 6000.0)
    pool.scale_to(3, 120.0, 60.0, 6000.0)    # the starting one goes first, half-way: half its energy
    assert pool.cold_starts == 3 and pool.cold_start_j == pytest.approx(15000.0)
    busy = Seq(150.0, 100, 50)
    pool.choose().arrive(busy, 150.0)        # a replica holds a request: it drains before it stops
    pool.scale_to(1, 150.0, 60.0, 6000.0)    # the two idle ones stop at once
    assert len(pool.replicas) == 1 and not pool.stopping
    pool.mark(200.0)
    # one replica 0-200 s, two more 60-150 s
    assert pool.warm_s == pytest.approx(200.0 + 2 * 90.0)


def test_a_request_at_a_pool_with_no_warm_replica_waits_for_the_first_ready() -> None:
    pool = _pool(AutoscalingSettings(min_replicas=0, initial_replicas=0))
    assert pool.replicas == []
    assert pool.live(0.0).kv_cache_usage == 0.0  # a pool at zero publishes no KV in use, not a full cache
    seq = Seq(5.0, 100, 50)
    pool.hold(seq)
    assert pool.ongoing == 1 and pool.totals.waiting == 1
    assert pool.live(5.0).queue_depth == 1
    pool.scale_to(1, 5.0, 60.0, 100.0)
    steps = pool.ready(65.0)
    assert len(steps) == 1 and steps[0][1] == 65.0   # its replica starts a step at once
    assert pool.held == [] and pool.totals.waiting == 1 and len(pool.replicas[0].waiting) == 1
