"""The whole fleet's energy under the autoscaler, and the hindsight bound on fleets small enough
to check by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.step import StepCosts
from scheduler.sim.autoscale import AutoscalingSettings
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.engine import Scenario, Simulation
from scheduler.sim.oracle import bound_pools, request_cost, solve
from scheduler.sim.truth import EXACT_TRUTH
from scheduler.sim.workload import WorkloadConfig, build_workload, load_trace
from tests.unit.sim.kit import NEW_YORK, OSLO, PARIS, START, Files, europe_only, policy, region, write_zone

pytestmark = pytest.mark.timeout(300)

T0 = START.timestamp()


def _carbon(files: Files) -> None:
    # hourly values that differ, so that booking an hour's energy to the wrong hour shows
    write_zone(files.carbon_dir, "CLEAN", [20.0, 60.0, 30.0] * 16)
    write_zone(files.carbon_dir, "DIRTY", [500.0, 300.0, 700.0] * 16)


def _bursts(path: Path) -> Path:
    """A trace of 600 requests (100 prompt, 50 output tokens) in its first minute, then one
    at 5 min: tiled, bursts and lulls."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for k in range(600):
        lines.append(f"2023-11-16 18:00:{k // 10:02d}.{k % 10}000000,100,50")
    lines.append("2023-11-16 18:05:00.0000000,100,50")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_charged_idle_and_cold_starts_add_up_to_the_replicas_energy(files: Files, tmp_path: Path) -> None:
    """charged + idle + cold starts = every replica's steps + its idle power over its warm,
    not busy, time + its cold starts (within 0.1 %), in J and in grams at each hour's
    intensity; the run crosses an hour and the autoscaler starts and retires replicas."""
    _carbon(files)
    regions = (region("near", "DIRTY", PARIS, gpus=8), region("clean", "CLEAN", OSLO, gpus=8))
    # 25 minutes from 00:50: bursts of 10 requests/s for a minute, 4 min lulls
    workload = build_workload(load_trace(str(_bursts(tmp_path / "bursts.csv"))),
                              WorkloadConfig(start=T0 + 3000.0, hours=25 / 60, rate=None, continents=europe_only()), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    settings = AutoscalingSettings(min_replicas=1, target_ongoing_requests=0.5, upscale_delay_s=10.0,
                                   downscale_delay_s=60.0, cold_start_s=30.0, cold_start_j=9000.0)
    outcome = Simulation(regions, policy(), workload, carbon, Scenario(autoscaling=settings), 0).outcome(False)
    ran = outcome.ran_in >= 0
    assert ran.all()
    pools = outcome.pool_energy
    assert sum(p.cold_starts for p in pools) > 0
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy()))
    c = builder.candidates[0]
    idle_w = builder.energy_model.rated_costs(c.model, c.gpu, "bf16", 1).costs.idle_w
    span = workload.arrival_s[-1] - workload.arrival_s[0]
    clean = next(p for p in pools if p.region == "clean")
    # replicas came and went in the pool that ran everything: several starts, and less warm
    # time than its peak would have drawn throughout
    assert clean.cold_starts >= 4
    assert span < clean.warm_s < 3 * span

    charged = float(outcome.energy_j[ran].sum())
    books = charged + sum(p.idle_j + p.cold_start_j for p in pools)
    drawn = sum(p.step_j + idle_w * (p.warm_s - outcome.busy_s[p.place]) + p.cold_start_j for p in pools)
    assert books == pytest.approx(drawn, rel=1e-3)
    assert charged == pytest.approx(sum(p.step_j for p in pools), rel=1e-3)

    result = outcome.summary()
    assert result.fleet_kwh * 3.6e6 == pytest.approx(sum(
        (float(outcome.energy_j[outcome.ran_pool == i].sum()) + p.idle_j + p.cold_start_j) * p.pue
        for i, p in enumerate(pools)), rel=1e-9)
    # grams: each pool's idle energy priced hour by hour lies between its zone's cheapest and dearest hour
    for p in pools:
        low, high = (20.0, 60.0) if p.region == "clean" else (300.0, 700.0)
        assert low * p.pue / 3.6e6 * p.idle_j <= p.idle_g <= high * p.pue / 3.6e6 * p.idle_j
    assert result.fleet_gco2e_per_request * result.ran == pytest.approx(
        float(outcome.grams[ran].sum()) + sum(p.idle_g + p.cold_start_g for p in pools), rel=1e-9)
    assert set(result.fleet_by_region) == {"near", "clean"}
    assert sum(f["kwh"] for f in result.fleet_by_pool.values()) == pytest.approx(result.fleet_kwh)


def test_fixed_sizes_keep_every_replica_warm_for_the_whole_run(files: Files) -> None:
    regions = (region("near", "DIRTY", PARIS, gpus=4),)
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.05, rate=2.0, continents=europe_only()), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY"], 2023)
    outcome = Simulation(regions, policy(), workload, carbon, Scenario(), 0).outcome(False)
    (pool,) = outcome.pool_energy
    span = workload.arrival_s[-1] - workload.arrival_s[0]
    assert pool.cold_starts == 0 and pool.cold_start_j == 0.0
    # until the last request is done, within a few seconds of its arrival
    assert 4 * span <= pool.warm_s <= 4 * (span + 5.0)


def test_request_cost_by_hand() -> None:
    costs = StepCosts(t_step=1.0, t_token=0.1, t_kv=0.001, t_pair=0.0001, e_step=100.0, e_token=1.0, e_kv=0.01,
                      e_pair=0.001, idle_w=50.0, kv_capacity_tokens=1300)
    energy, busy = request_cost(costs, np.asarray([10]), np.asarray([3]), np.asarray([4]), 1300)
    # batch min(256, 1300 // 13) = 100; prefill of 6 tokens after 4: 6 x 4 + 6 x 7 / 2 = 45 pairs;
    # 2 decode steps reading 11 and 12: 23 KV tokens and pairs; 8 tokens; 3 steps' share of e_step
    assert energy[0] == pytest.approx(8 * 1.0 + 0.01 * (4 + 23) + 0.001 * (45 + 23) + 100.0 * 3 / 100)
    assert busy[0] == pytest.approx(8 * 0.1 + 0.001 * (4 + 23) + 0.0001 * (45 + 23) + 1.0 * 3 / 100)


@pytest.mark.parametrize("residency", [0.0, 1.0])
def test_the_bound_on_two_pools_by_hand(files: Files, tmp_path: Path, residency: float) -> None:
    """Paris clients; a dirty EU pool in Paris and a clean US one in New York (84 ms away,
    within the 2 s SLO). Unbound, every request goes to the clean pool, which runs the
    fractional replicas its busy time needs and pays their cold start; bound to the EU, every
    request goes to the dirty pool. The idle pool scales to zero."""
    regions = (region("near", "DIRTY", PARIS, gpus=8), region("clean", "CLEAN", NEW_YORK, jurisdiction="US", gpus=8))
    pol = policy()
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.5, rate=2.0, continents=europe_only(),
                                             residency_share=residency, prefix_share=0.0), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    pools = bound_pools(regions, pol, workload.model, EXACT_TRUTH, 0)
    settings = AutoscalingSettings(min_replicas=0, initial_replicas=0, cold_start_j=5000.0)
    bound = solve(workload, pools, pol, carbon, settings)
    target = pools[1] if residency == 0.0 else pools[0]
    intensity = 20.0 if residency == 0.0 else 500.0
    n = len(workload)
    energy, busy = request_cost(target.costs, np.full(n, 100), np.full(n, 50), np.zeros(n, dtype=np.int64),
                                target.kv_capacity_tokens)
    length = workload.arrival_s[-1] - workload.arrival_s[0]
    replicas = busy.sum() / length  # warm replicas exactly as busy as the requests need
    grams = (energy.sum() + 5000.0 * replicas) * 1.2 * intensity / 3.6e6
    assert bound.requests == n and bound.unplaced == 0
    assert bound.pool_share[target.place] == pytest.approx(1.0)
    assert bound.fleet_gco2e == pytest.approx(grams, rel=1e-6)
    assert bound.fleet_kwh == pytest.approx((energy.sum() + 5000.0 * replicas) * 1.2 / 3.6e6, rel=1e-6)
    # split: the requests' grams, no idle time (replicas exactly as busy as needed), the cold starts
    assert bound.charged_gco2e == pytest.approx(energy.sum() * 1.2 * intensity / 3.6e6, rel=1e-6)
    assert bound.idle_gco2e == pytest.approx(0.0, abs=1e-6 * grams)
    assert bound.cold_start_gco2e == pytest.approx(5000.0 * replicas * 1.2 * intensity / 3.6e6, rel=1e-6)
    assert bound.warm_replica_h == pytest.approx(replicas * length / 3600.0, rel=1e-6)


def test_the_bound_with_fixed_sizes_pays_every_replicas_idle_power(files: Files) -> None:
    regions = (region("near", "DIRTY", PARIS, gpus=2), region("clean", "CLEAN", OSLO, gpus=3))
    pol = policy()
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.25, rate=1.0, continents=europe_only(),
                                             prefix_share=0.0), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    pools = bound_pools(regions, pol, workload.model, EXACT_TRUTH, 0)
    bound = solve(workload, pools, pol, carbon, None)
    n = len(workload)
    clean = pools[1]
    energy, busy = request_cost(clean.costs, np.full(n, 100), np.full(n, 50), np.zeros(n, dtype=np.int64),
                                clean.kv_capacity_tokens)
    length = workload.arrival_s[-1] - workload.arrival_s[0]
    idle_w = clean.costs.idle_w
    grams = (1.2 / 3.6e6) * (20.0 * (energy.sum() + idle_w * (3 * length - busy.sum()))
                             + 500.0 * pools[0].costs.idle_w * 2 * length)
    assert bound.pool_share[clean.place] == pytest.approx(1.0)
    assert bound.fleet_gco2e == pytest.approx(grams, rel=1e-6)
    assert bound.idle_gco2e == pytest.approx(grams - 1.2 / 3.6e6 * 20.0 * energy.sum(), rel=1e-6)
    assert bound.warm_replica_h == pytest.approx(5 * length / 3600.0, rel=1e-6)


def test_an_overloaded_trace_gives_a_bound_over_what_fits(files: Files) -> None:
    """One replica a pool, far more requests than two replicas can run in the run's time: the
    bound solves, leaves out the share that does not fit (before, the LP was infeasible), and
    fills both replicas' time."""
    regions = (region("near", "DIRTY", PARIS, gpus=1), region("clean", "CLEAN", OSLO, gpus=1))
    pol = policy()
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.05, rate=400.0, continents=europe_only(),
                                             prefix_share=0.0), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    pools = bound_pools(regions, pol, workload.model, EXACT_TRUTH, 0)
    n = len(workload)
    length = workload.arrival_s[-1] - workload.arrival_s[0]
    need = sum(float(request_cost(p.costs, np.full(n, 100), np.full(n, 50), np.zeros(n, dtype=np.int64),
                                  p.kv_capacity_tokens)[1].sum()) for p in pools) / 2
    assert need > 2 * length, "the trace must overload the two replicas for this test to mean anything"
    bound = solve(workload, pools, pol, carbon, None)
    assert 0 < bound.unplaced < n and bound.requests + bound.unplaced == n
    assert sum(bound.pool_share.values()) == pytest.approx(1.0, rel=1e-4)  # over whole requests
    # both replicas busy all the time: no idle energy left, whatever the grid
    assert bound.idle_gco2e == pytest.approx(0.0, abs=1e-6 * bound.fleet_gco2e)
    assert bound.fleet_gco2e == pytest.approx(bound.charged_gco2e, rel=1e-6)


def test_a_capacity_plan_bounds_the_autoscaler_by_the_hour(files: Files, tmp_path: Path) -> None:
    """``simulate --plan``: a pool the plan keeps at 0 is never warm (its autoscaler's minimum
    is the plan's, and nothing is sent there); a pool the plan keeps at 2 runs 2 from the first
    request; without the plan each keeps Ray Serve's minimum of 1."""
    from types import MappingProxyType

    from scheduler.plan.schedule import DailySchedule

    _carbon(files)
    regions = (region("near", "DIRTY", PARIS, gpus=8), region("clean", "CLEAN", OSLO, gpus=8))
    workload = build_workload(load_trace(str(_bursts(tmp_path / "bursts.csv"))),
                              WorkloadConfig(start=T0 + 3000.0, hours=25 / 60, rate=None, continents=europe_only()), 0)
    settings = AutoscalingSettings(min_replicas=1, target_ongoing_requests=0.5, upscale_delay_s=10.0,
                                   downscale_delay_s=60.0, cold_start_s=30.0, cold_start_j=9000.0)
    plan = DailySchedule(start=T0, slice_s=3600.0, slices=24,
                         replicas=MappingProxyType({("near", "h100"): ((0, 0),) * 24, ("clean", "h100"): ((2, 2),) * 24}),
                         target_ongoing_requests=MappingProxyType({("near", "h100"): (0.5,) * 24,
                                                                   ("clean", "h100"): (0.5,) * 24}))
    span = workload.arrival_s[-1] - workload.arrival_s[0]

    def warm_and_starts(scenario: Scenario) -> dict[str, tuple[float, int]]:
        carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
        outcome = Simulation(regions, policy(), workload, carbon, scenario, 0).outcome(False)
        assert (outcome.ran_in >= 0).all()
        return {p.region: (p.warm_s, p.cold_starts) for p in outcome.pool_energy}

    planned = warm_and_starts(Scenario(autoscaling=settings, plan=plan))
    unplanned = warm_and_starts(Scenario(autoscaling=settings))
    print(f"\nwarm s and cold starts per region, planned {planned}, unplanned {unplanned}; span {span:.0f} s")
    assert planned["near"] == (0.0, 0)
    assert planned["clean"][0] >= 2 * span and planned["clean"][1] == 0  # 2 warm from the start, never more
    assert unplanned["near"][0] >= span  # Ray Serve's min_replicas 1, warm throughout
