"""Helpers for the workflow and affinity tests: a workflow workload on a kit fleet (kit.py),
simulated with or without affinity, or both and merged as ``scheduler.sim.scenario`` merges them."""

from __future__ import annotations

from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.deferral import Deferral
from scheduler.sim.engine import Scenario, Simulation
from scheduler.sim.report import PolicyResult
from scheduler.sim.workflow import build_workflow_workload, merge_affinity
from scheduler.sim.workflow_spec import WorkflowSpec
from scheduler.sim.workload import Continent, WorkloadConfig, load_trace
from tests.unit.sim.kit import START, Files, europe_only


def run(
    files: Files,
    regions: tuple[RegionConfig, ...],
    pol: PolicyConfig,
    shape: str,
    *,
    hours: float,
    rate: float,
    affinity: bool = True,
    continents: tuple[Continent, ...] | None = None,
    deferrable_share: float = 0.0,
    deferrable_deadline_s: float | None = None,
    deferral: Deferral | None = None,
    seed: int = 0,
) -> PolicyResult:
    """``rate`` workflows a second of ``shape`` for ``hours`` from START."""
    config = WorkloadConfig(
        start=START.timestamp(), hours=hours, rate=rate, continents=continents or europe_only(),
        residency_share=0.0, prefix_share=0.0, deferrable_share=deferrable_share,
        deferrable_deadline_s=deferrable_deadline_s,
    )
    workload = build_workflow_workload(load_trace(str(files.trace)), config, WorkflowSpec.parse(shape), seed)
    carbon = CarbonReplay.from_dir(files.carbon_dir, [r.grid_zone for r in regions], 2023)
    scenario = Scenario(affinity=affinity, deferral=deferral)
    return Simulation(regions, pol, workload, carbon, scenario, seed).run(progress=False)


def compare(files: Files, regions: tuple[RegionConfig, ...], pol: PolicyConfig, shape: str, *, hours: float,
            rate: float) -> PolicyResult:
    """The same workload with and without affinity, merged (``*_affinity``, ``*_no_affinity``)."""
    return merge_affinity(run(files, regions, pol, shape, hours=hours, rate=rate, affinity=True),
                          run(files, regions, pol, shape, hours=hours, rate=rate, affinity=False))
