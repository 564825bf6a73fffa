"""A whole simulated scenario as one picklable value, and running it under several policies.

Every policy sees the same workload (drawn from the seed), the same carbon replay and the
same outages; policies may run in parallel processes (``jobs``) with identical results,
since each run depends only on the spec and the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.config.loader import load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.sim.carbon_feed import CarbonReplay, ProviderOutage
from scheduler.sim.engine import RegionOutage, Scenario, Simulation
from scheduler.sim.fleets import scale_fleet, twelve_region_fleet
from scheduler.sim.report import PolicyResult
from scheduler.sim.workload import WorkloadConfig, build_workload, load_trace


@dataclass(frozen=True)
class ScenarioSpec:
    workload: WorkloadConfig
    trace: str = "conv"
    regions_dir: Path | None = None
    policies_dir: Path | None = None
    carbon_dir: Path = SHIPPED_CARBON_DIR
    carbon_year: int | None = 2023
    carbon_delay_s: float = 0.0
    carbon_outages: tuple[ProviderOutage, ...] = ()
    region_outages: tuple[RegionOutage, ...] = ()
    capacity_scale: float = 1.0
    # Lognormal sigma of each pool's true step costs around the rated ones (scheduler.sim.truth).
    truth_error: float = 0.0
    # Add the four generated regions (the 12-region benchmark fleet).
    twelve_regions: bool = False
    refresh_s: float = 1.0
    seed: int = 0
    progress: bool = True

    def regions(self) -> tuple[RegionConfig, ...]:
        regions = load_fleet(self.regions_dir, self.policies_dir).regions
        if self.twelve_regions:
            regions = twelve_region_fleet(regions)
        return scale_fleet(regions, self.capacity_scale)

    def describe(self) -> dict[str, Any]:
        w = self.workload
        return {
            "trace": self.trace,
            "start": w.start,
            "hours": w.hours,
            "rate": w.rate,
            "model": w.model,
            "seed": self.seed,
            "carbon_dir": str(self.carbon_dir),
            "carbon_year": self.carbon_year,
            "carbon_delay_s": self.carbon_delay_s,
            "carbon_outages": [o.__dict__ for o in self.carbon_outages],
            "region_outages": [o.__dict__ for o in self.region_outages],
            "capacity_scale": self.capacity_scale,
            "truth_error": self.truth_error,
            "residency_share": w.residency_share,
            "batch_share": w.batch_share,
            "deferrable_share": w.deferrable_share,
            "prefix_share": w.prefix_share,
            "clients": {c.name: c.share for c in w.continents},
        }


def run_policy(spec: ScenarioSpec, policy: str) -> PolicyResult:
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    regions = spec.regions()
    workload = build_workload(load_trace(spec.trace), spec.workload, spec.seed)
    carbon = CarbonReplay.from_dir(
        spec.carbon_dir, [r.grid_zone for r in regions], spec.carbon_year, spec.carbon_delay_s, spec.carbon_outages
    )
    scenario = Scenario(refresh_s=spec.refresh_s, region_outages=spec.region_outages, truth_error=spec.truth_error)
    return Simulation(regions, fleet.policy(policy), workload, carbon, scenario, spec.seed).run(spec.progress)


def compare(spec: ScenarioSpec, policies: Sequence[str], jobs: int = 1) -> list[PolicyResult]:
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    for name in policies:
        fleet.policy(name)  # fail fast on an unknown name, before any run
    if jobs <= 1 or len(policies) <= 1:
        return [run_policy(spec, name) for name in policies]
    with ProcessPoolExecutor(max_workers=min(jobs, len(policies))) as pool:
        return list(pool.map(run_policy, [spec] * len(policies), policies))
