"""A whole simulated scenario as one picklable value, and running it under several policies.

Every policy sees the same workload (drawn from the seed), the same carbon replay and the
same outages; policies may run in parallel processes (``jobs``) with identical results,
since each run depends only on the spec and the policy.

With deferrable requests and ``deferral`` set, a policy runs twice on the same workload: with
the deferral queue (its result) and deciding the same deferrable requests at arrival (its
``deferred_*_at_arrival`` figures, ``scheduler.sim.deferral.merge``).

With ``workflow`` set the workload is that workflow's (``scheduler.sim.workflow``) and a policy
runs twice on it, with affinity (its result) and without (its ``*_no_affinity`` figures,
``scheduler.sim.workflow.merge_affinity``); ``compare`` runs those two as separate jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.config.loader import load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.plan.schedule import load_schedule
from scheduler.sim import shards as shards_
from scheduler.sim.autoscale import AutoscalingSettings
from scheduler.sim.carbon_feed import CarbonReplay, ProviderOutage
from scheduler.sim.deferral import Deferral, merge
from scheduler.sim.engine import RegionOutage, Scenario, Simulation
from scheduler.sim.fleets import scale_fleet, twelve_region_fleet
from scheduler.sim.report import PolicyResult, RunOutcome
from scheduler.sim.truth import EXACT_TRUTH, HeldOutResiduals, TruthModel
from scheduler.sim.workflow import build_workflow_workload, merge_affinity
from scheduler.sim.workflow_spec import WorkflowSpec
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
    # What the pools and the network really do (scheduler.sim.truth; default: the rated costs
    # exactly, the RTT as predicted; ``scheduler simulate`` passes the model-form truth).
    truth: TruthModel = EXACT_TRUTH
    # Add the four generated regions (the 12-region benchmark fleet).
    twelve_regions: bool = False
    # The deferral queue for deferrable requests (None: decided at arrival, no second run).
    deferral: Deferral | None = dataclasses.field(default_factory=Deferral)
    refresh_s: float = 1.0
    # Workflows instead of independent requests, each run with and without affinity (None: neither).
    workflow: WorkflowSpec | None = None
    # Every pool scales by Ray Serve's autoscaling policy on its region file's settings or the
    # default, these overriding them where set (None: fixed sizes; ``scheduler simulate``
    # autoscales unless given --fixed-sizes).
    autoscaling: AutoscalingSettings | None = None
    # A capacity plan file (``scheduler plan --json``) whose hourly min/max replicas bound the
    # autoscaler of the pools it names (None: none).
    plan: Path | None = None
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
            "truth": self.truth.describe(self.gpus(), self.seed,
                                         HeldOutResiduals.load() if self.truth.gpu_bias else None),
            "residency_share": w.residency_share,
            "batch_share": w.batch_share,
            "deferrable_share": w.deferrable_share,
            "deferrable_deadline_s": w.deferrable_deadline_s,
            "deferral": None if self.deferral is None else dataclasses.asdict(self.deferral),
            "prefix_share": w.prefix_share,
            "clients": {c.name: c.share for c in w.continents},
            "workflow": None if self.workflow is None else self.workflow.describe(),
            "autoscaling": None if self.autoscaling is None else dataclasses.asdict(self.autoscaling),
            "plan": None if self.plan is None else str(self.plan),
        }

    def gpus(self) -> list[str]:
        """The GPU types of the pools that serve the simulated model."""
        model = self.workload.model
        return sorted({pool.gpu for r in self.regions() for pool in r.pools if any(d.name == model for d in pool.models)})

    def affinity_modes(self) -> tuple[bool, ...]:
        """The runs of each policy: with and without affinity for workflows, else the plain one."""
        return (True, False) if self.workflow is not None else (False,)


def run_policy(spec: ScenarioSpec, policy: str) -> PolicyResult:
    """``policy`` on the spec's workload: every run of ``affinity_modes``, merged."""
    return _merged([run_mode(spec, policy, affinity) for affinity in spec.affinity_modes()])


def _merged(results: Sequence[PolicyResult]) -> PolicyResult:
    return results[0] if len(results) == 1 else merge_affinity(results[0], results[1])


def run_mode(spec: ScenarioSpec, policy: str, affinity: bool) -> PolicyResult:
    """``policy`` on the spec's workload, with or without affinity (``Scenario.affinity``)."""
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    regions = spec.regions()
    trace = load_trace(spec.trace)
    workload = (build_workload(trace, spec.workload, spec.seed) if spec.workflow is None
                else build_workflow_workload(trace, spec.workload, spec.workflow, spec.seed))

    def run(deferral: Deferral | None) -> PolicyResult:
        carbon = CarbonReplay.from_dir(
            spec.carbon_dir, [r.grid_zone for r in regions], spec.carbon_year, spec.carbon_delay_s,
            spec.carbon_outages,
        )
        scenario = Scenario(refresh_s=spec.refresh_s, region_outages=spec.region_outages,
                            truth=spec.truth, deferral=deferral, affinity=affinity, autoscaling=spec.autoscaling,
                            plan=None if spec.plan is None else load_schedule(spec.plan))
        return Simulation(regions, fleet.policy(policy), workload, carbon, scenario, spec.seed).run(spec.progress)

    if spec.deferral is None or spec.workload.deferrable_share <= 0:
        return run(None)
    at_arrival = run(None)
    queued = run(spec.deferral)
    if not queued.deferral:
        return queued  # no deferrable request was drawn
    return dataclasses.replace(queued, deferral=merge(queued.deferral, at_arrival.deferral))


def run_sharded(spec: ScenarioSpec, policy: str, shards: int) -> PolicyResult:
    """``policy`` on the spec's workload cut into ``shards`` time shards simulated in parallel
    processes (``scheduler.sim.shards``: what a shard's fleet does not inherit)."""
    if spec.workflow is not None or spec.workload.deferrable_share > 0:
        raise ValueError("a run is cut into shards only without workflows and deferrable requests "
                         "(a held request or a workflow's steps would cross a shard boundary)")
    workload = build_workload(load_trace(spec.trace), spec.workload, spec.seed)
    first = shards_.starts(workload.arrival_s, shards)
    bounds = [*zip(first, [*first[1:], len(workload)], strict=True)]
    origin = workload.arrival_s[0] if len(workload) else 0.0
    # Each shard's idle energy runs to the next one's first arrival.
    until = [*(workload.arrival_s[start] for start in first[1:]), None]
    with ProcessPoolExecutor(max_workers=len(bounds)) as pool:
        outcomes = list(pool.map(_run_shard, [spec] * len(bounds), [policy] * len(bounds),
                                 [b[0] for b in bounds], [b[1] for b in bounds], [origin] * len(bounds), until))
    return shards_.merge(outcomes).summary()


def _run_shard(spec: ScenarioSpec, policy: str, start: int, stop: int, origin: float,
               until: float | None) -> RunOutcome:
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    regions = spec.regions()
    workload = build_workload(load_trace(spec.trace), spec.workload, spec.seed).rows(start, stop)
    carbon = CarbonReplay.from_dir(spec.carbon_dir, [r.grid_zone for r in regions], spec.carbon_year,
                                   spec.carbon_delay_s, spec.carbon_outages)
    scenario = Scenario(refresh_s=spec.refresh_s, region_outages=spec.region_outages, truth=spec.truth,
                        autoscaling=spec.autoscaling, plan=None if spec.plan is None else load_schedule(spec.plan))
    return Simulation(regions, fleet.policy(policy), workload, carbon, scenario, spec.seed,
                      hour_origin=origin, span_until=until, first_row=start).outcome(progress=False)


def compare(spec: ScenarioSpec, policies: Sequence[str], jobs: int = 1) -> list[PolicyResult]:
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    for name in policies:
        fleet.policy(name)  # fail fast on an unknown name, before any run
    modes = spec.affinity_modes()
    names = [name for name in policies for _ in modes]
    affinity = [mode for _ in policies for mode in modes]
    if jobs <= 1 or len(names) <= 1:
        results = [run_mode(spec, name, mode) for name, mode in zip(names, affinity, strict=True)]
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(names))) as pool:
            results = list(pool.map(run_mode, [spec] * len(names), names, affinity))
    k = len(modes)
    return [_merged(results[i:i + k]) for i in range(0, len(results), k)]
