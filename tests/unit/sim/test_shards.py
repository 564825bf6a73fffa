"""A run cut into time shards (scheduler.sim.shards, ``bench simulate --jobs N``) summarises as
the whole run: boundaries at wide arrival gaps, outcomes merged in row order."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.sim import shards
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.engine import Scenario, Simulation
from scheduler.sim.workload import WorkloadConfig, build_workload, load_trace
from tests.unit.sim.kit import NEW_YORK, PARIS, START, Files, europe_only, policy, region

pytestmark = pytest.mark.timeout(120)


def test_a_shard_starts_after_the_widest_gap_near_its_boundary() -> None:
    arrival = [float(i) for i in range(1000)]
    arrival[498:] = [t + 50.0 for t in arrival[498:]]  # a 51 s gap before row 498
    assert shards.starts(arrival, 2, search_share=0.01) == [0, 498]
    assert shards.starts(arrival, 2, search_share=0.001) == [0, 499]  # the gap is out of reach: a 1 s one
    assert shards.starts(arrival, 1) == [0]
    assert shards.starts(arrival[:3], 8) == [0, 1, 2]
    with pytest.raises(ValueError, match="shards must be >= 1"):
        shards.starts(arrival, 0)


def test_shards_merged_give_the_whole_runs_figures(files: Files) -> None:
    regions = (region("eu", "DIRTY", PARIS, "EU"), region("us", "CLEAN", NEW_YORK, "US"))
    workload = build_workload(load_trace(str(files.trace)), WorkloadConfig(
        start=START.timestamp(), hours=6.0, rate=0.05, continents=europe_only(), residency_share=0.4), 3)
    carbon = CarbonReplay.from_dir(files.carbon_dir, [r.grid_zone for r in regions], 2023)

    def simulation(rows: tuple[int, int] | None) -> Simulation:
        part = workload if rows is None else workload.rows(*rows)
        until = None if rows is None or rows[1] == len(workload) else workload.arrival_s[rows[1]]
        return Simulation(regions, policy(), part, carbon, Scenario(), 3, hour_origin=workload.arrival_s[0],
                          span_until=until)

    whole_result = simulation(None).outcome(progress=False).summary()
    whole = whole_result.to_json()
    first = shards.starts(workload.arrival_s, 3)
    bounds = list(zip(first, [*first[1:], len(workload)], strict=True))
    assert len(bounds) == 3 and bounds[-1][1] == len(workload)
    merged_result = shards.merge([simulation(b).outcome(progress=False) for b in bounds]).summary()
    merged = merged_result.to_json()
    for out in (whole, merged):
        del out["timings_s"]
    print(f"\nshards {bounds}: J/request {merged['j_per_request']:.3f} vs {whole['j_per_request']:.3f}")
    assert merged["requests"] == whole["requests"] == len(workload)
    assert (np.asarray(merged_result.hourly) == np.asarray(whole_result.hourly)).all()
    assert merged["slo_attainment"] == whole["slo_attainment"] and merged["violations"] == whole["violations"]
    assert merged["idle_j"] == pytest.approx(whole["idle_j"], rel=1e-3)
    # What a shard does not inherit (a warm prefix cache, the pools' rate averages) moves the
    # joules of a few requests after each boundary, not the run's figures.
    for name in ("j_per_request", "gco2e_per_request", "ttft_p50_ms", "ttft_p99_ms"):
        assert merged[name] == pytest.approx(whole[name], rel=0.01), name


def test_bench_simulate_runs_in_time_shards(capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli import main

    assert main(["bench", "simulate", "--requests", "300", "--hours", "24", "--jobs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "300 requests, 12 regions, 24 h of hourly grid data, policy default, 2 time shards in parallel" in out
    assert main(["bench", "simulate", "--requests", "300", "--hours", "24", "--jobs", "2", "--no-progress",
                 "--deferrable-share", "0.3"]) == 1
    assert "cut into shards only without workflows and deferrable requests" in capsys.readouterr().err
