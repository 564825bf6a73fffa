"""Whole simulations on two-region fleets whose outcome follows by hand from the rules.

Both regions run the same pool (8 x H100, llama-3.1-8b) at the same PUE, so predicted joules
are equal and only the grid (CLEAN 20 g/kWh vs DIRTY 500 g/kWh) and the distance differ.
Under carbon-first weights (energy 0.15, carbon 0.75, latency 0.05, load 0.05) the clean region
scores 0.75 more on carbon and at most 0.05 less on latency: it wins whenever it is eligible.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.registry import Registry
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import register_all
from scheduler.plugins.filters import residency
from scheduler.sim.carbon_feed import ProviderOutage
from scheduler.sim.engine import RegionOutage
from scheduler.sim.truth import TruthModel
from tests.unit.sim.kit import NEW_YORK, OSLO, PARIS, START, Files, policy, region, simulate, write_trace

T0 = START.timestamp()
HOUR = 3600.0


def near_and_clean() -> tuple[RegionConfig, ...]:
    # Clients sit in Paris: "near" is in Paris on a dirty grid, "clean" in Oslo (~1,340 km).
    return (region("near", "DIRTY", PARIS), region("clean", "CLEAN", OSLO))


def test_one_clean_region_within_slo_takes_all_carbon_ranked_traffic(files: Files) -> None:
    result, workload = simulate(files, near_and_clean(), policy(), hours=0.5, rate=2.0)
    assert result.requests == len(workload) == 3600
    assert result.ran == 3600
    assert result.region_share == {"near": 0.0, "clean": 1.0}
    assert result.slo_attainment == 1.0
    assert result.fallbacks == {}
    # 50 output tokens at 20 g/kWh x PUE 1.2: grams follow from the measured joules.
    assert result.gco2e_per_request == pytest.approx(result.j_per_request / 3.6e6 * 20.0 * 1.2)


def test_clean_region_outside_the_ttft_slo_takes_none(files: Files) -> None:
    # On an idle replica TTFT = RTT + one prefill step of 100 tokens. RTT Paris->Paris is
    # 2 ms, Paris->Oslo 2 x 1,340 km x 1.4 / 200,000 km/s + 2 ms = ~21 ms: an SLO halfway
    # between the near region's TTFT and the far one's RTT leaves only "near".
    regions = near_and_clean()
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy()))
    near = builder.candidates[0]
    costs = builder.energy_model.rated_costs(near.model, near.gpu, "bf16", 1).costs
    near_ttft = 0.002 + costs.step_time(100, 0, 100 * 101 // 2)
    assert near_ttft < 0.015
    tight = policy(ttft_ms=(near_ttft + 0.021) / 2 * 1e3, ttft_ms_per_1k=0.0)
    result, _ = simulate(files, regions, tight, hours=0.25, rate=2.0)
    assert result.region_share == {"near": 1.0, "clean": 0.0}
    assert result.slo_attainment == 1.0
    assert result.unschedulable == 0


def test_residency_requirement_is_never_violated(files: Files) -> None:
    # The clean region is in the US: EU-bound requests must stay on the dirty EU grid, the
    # others go to the clean one.
    regions = (region("eu", "DIRTY", PARIS, "EU"), region("us", "CLEAN", NEW_YORK, "US"))
    result, workload = simulate(files, regions, policy(), hours=0.5, rate=2.0, residency_share=0.4)
    restricted = sum(workload.restricted)
    assert 0.3 * len(workload) < restricted < 0.5 * len(workload)
    assert result.violations == 0
    assert round(result.region_share["eu"] * result.ran) == restricted
    assert round(result.region_share["us"] * result.ran) == len(workload) - restricted


def test_violations_are_counted_by_the_simulator_not_taken_from_the_scheduler(files: Files) -> None:
    # A scheduler built without the residency filter sends EU-bound requests to the clean US
    # region; the simulator's own count must see every one of them.
    registry = register_all(Registry())
    del registry.filters[residency.TYPE]
    careless = Scheduler.from_registry(registry, rng=random.Random(0))
    regions = (region("eu", "DIRTY", PARIS, "EU"), region("us", "CLEAN", NEW_YORK, "US"))
    result, workload = simulate(files, regions, policy(), hours=0.25, rate=2.0, residency_share=0.4, scheduler=careless)
    assert result.violations == sum(workload.restricted) > 0
    assert result.region_share["us"] == 1.0


def test_carbon_feed_stops_and_decisions_fall_back_once_the_signal_passes_its_max_age(files: Files) -> None:
    # The provider goes quiet at 01:00: the last value published before then (observed 00:00)
    # is used until it is older than max_age.carbon = 2 h, i.e. until 02:00; after that the
    # carbon scorer abstains and the fallback weights (latency 0.7, load 0.3) send everything
    # to the nearest region.
    outage = ProviderOutage(None, T0 + HOUR, T0 + 10 * HOUR)
    result, workload = simulate(files, near_and_clean(), policy(), hours=5.0, rate=0.2, carbon_outages=(outage,))
    near, clean = 0, 1
    hourly = result.hourly
    for hour in (0, 1):
        assert hourly[hour, near] == 0 and hourly[hour, clean] > 0, hour
    for hour in (2, 3, 4):
        assert hourly[hour, clean] <= 1 and hourly[hour, near] > 0, hour  # <= 1: the snapshot is up to 1 s old
    after = sum(1 for t in workload.arrival_s if t > T0 + 2 * HOUR + 1.0)
    assert after <= result.fallbacks["carbon"] <= after + 1


def test_carbon_published_later_than_its_max_age_is_never_used(files: Files) -> None:
    result, workload = simulate(
        files, near_and_clean(), policy(), hours=0.5, rate=0.5, carbon_delay_s=3 * HOUR
    )
    # With a 3 h publication delay no value is ever younger than 2 h (none exists yet at all
    # in the first three hours of data): every decision falls back.
    assert result.fallbacks["carbon"] == len(workload)
    assert result.region_share == {"near": 1.0, "clean": 0.0}


def test_region_outage_fails_over_then_the_region_is_dropped_until_it_returns(files: Files) -> None:
    outage = RegionOutage("clean", T0 + HOUR, T0 + 2 * HOUR)
    result, _ = simulate(files, near_and_clean(), policy(), hours=3.0, rate=1.0, region_outages=(outage,))
    near, clean = 0, 1
    assert result.hourly[1, clean] == 0
    assert result.hourly[1, near] > 3000
    assert result.hourly[0, near] == 0
    assert result.hourly[2, near] <= 1  # the returning region publishes at the next refresh
    # Until its last live state is 5 s old the router still ranks it first: those requests
    # fail over to "near" before their first token.
    assert 3 <= result.failovers <= 7
    assert result.failed == 0 and result.unschedulable == 0


def test_same_seed_same_results_and_another_seed_differs(files: Files) -> None:
    regions = (region("eu", "DIRTY", PARIS, "EU"), region("us", "CLEAN", NEW_YORK, "US"))

    def run(seed: int) -> dict[str, Any]:
        result, _ = simulate(files, regions, policy(), hours=0.25, rate=2.0, residency_share=0.4, seed=seed)
        out = result.to_json()
        del out["timings_s"]
        out["hourly"] = np.asarray(result.hourly).tolist()
        return out

    first = run(7)
    assert run(7) == first
    assert run(8) != first


@pytest.mark.parametrize(("gpus", "saturated"), [(3, True), (8, False)])
def test_queues_form_from_compute(files: Files, tmp_path: Path, gpus: int, saturated: bool) -> None:
    # The case: 100 requests/s of ~1,150 prompt tokens (115k prefill tokens/s). Three
    # H100 replicas prefill ~80k tokens/s at the rated step costs: they fall behind and the
    # queue grows for the whole minute; eight keep up (busy nearly all the time, but at a
    # batch that absorbs the load). Sequence and KV limits never bind here.
    long_prompts = dataclasses.replace(files, trace=write_trace(tmp_path / "long.csv", 1150, 50))
    only = (region("only", "CLEAN", OSLO, gpus=gpus),)
    result, workload = simulate(long_prompts, only, policy(ttft_ms=1e7), hours=1 / 60, rate=100.0)
    assert result.ran == len(workload) == 6000
    busy = result.utilisation["only/h100"]
    assert result.idle_j > 0
    if saturated:
        assert busy > 0.97
        assert result.queue_wait_p50_ms > 3000 and result.queue_wait_p99_ms > 8000
        assert result.queued > len(workload) / 2
    else:
        assert busy > 0.5
        assert result.queue_wait_p99_ms < 500


def test_fallback_ages_grow_with_the_clock_while_a_snapshot_is_reused(files: Files) -> None:
    # The carbon provider is quiet from 01:00 to 30:00 (its last value observed 00:00). With
    # requests every 50 s and nothing else changing, the simulator keeps one snapshot from
    # ~02:00 (the signal went stale) for a day; the ages recorded must still be each request's
    # true age: up to 30 h, not ~2 h.
    outage = ProviderOutage(None, T0 + HOUR, T0 + 30 * HOUR)
    result, workload = simulate(files, near_and_clean(), policy(), hours=31.0, rate=0.02, carbon_outages=(outage,))
    ages = result.fallback_age_s["carbon"]
    stale = [t for t in workload.arrival_s if T0 + 2 * HOUR < t < T0 + 30 * HOUR]
    assert len(stale) <= ages["count"] <= len(stale) + 1
    assert 29.9 * HOUR < ages["max_s"] <= 30 * HOUR
    assert ages["mean_s"] == pytest.approx(16 * HOUR, rel=0.02)
    assert result.fallbacks["carbon"] == ages["count"]


def test_prediction_error_shows_the_truth_models_error(files: Files) -> None:
    # One request every 5 s on an idle region: what the scheduler predicts is the same in both
    # runs; the measured energy moves with the pool's true costs.
    exact, _ = simulate(files, near_and_clean(), policy(), hours=0.1, rate=0.2)
    perturbed, _ = simulate(files, near_and_clean(), policy(), hours=0.1, rate=0.2, truth=TruthModel.rated(0.5))
    assert exact.j_per_request != pytest.approx(perturbed.j_per_request, rel=0.05)
    shift = perturbed.energy_error["mean_pct"] - exact.energy_error["mean_pct"]
    predicted_exact = exact.j_per_request * (1 + exact.energy_error["mean_pct"] / 100)
    predicted_perturbed = perturbed.j_per_request * (1 + perturbed.energy_error["mean_pct"] / 100)
    assert abs(shift) > 5
    # Identical requests on an idle pool: one prediction, so predicted = measured x (1 + error).
    assert predicted_perturbed == pytest.approx(predicted_exact, rel=1e-6)
