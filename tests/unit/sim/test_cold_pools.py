"""Cold pools in the simulator (issue 31): its pools publish their warm and starting replicas, so
the router's cold-pool filter and cold-start pricing apply as in production; its cold starts
cost what the router's ``scheduler.energy.cold_start`` says; a region file's ``autoscaling:``
block reaches its autoscaler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import default_region, validate
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.cold_start import cold_start
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.sim.autoscale import AutoscalingSettings, PoolAutoscaler
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.engine import Scenario, Simulation
from scheduler.sim.workload import WorkloadConfig, build_workload, load_trace
from scheduler.types import Decision, FleetSnapshot, Request
from tests.unit.sim.kit import OSLO, PARIS, START, Files, europe_only, policy

pytestmark = pytest.mark.timeout(120)

T0 = START.timestamp()
MODEL = "llama-3.1-8b"


def region_with(name: str, zone: str, where: tuple[float, float], gpus: int, autoscaling: dict[str, Any] | None = None,
                model_name: str = MODEL, tensor_parallel: int = 1, **pool: Any) -> RegionConfig:
    """A one-pool region of ``gpus`` H100s serving one model in bf16, with the model's
    ``autoscaling:`` block and the pool's other fields as given."""
    model: dict[str, Any] = {"name": model_name, "precision": "bf16", "max_context": 131072,
                             "tensor_parallel": tensor_parallel}
    if autoscaling is not None:
        model["autoscaling"] = autoscaling
    raw: dict[str, Any] = {
        "name": name, "jurisdiction": "EU", "grid_zone": zone, "pue": 1.2, "price_per_kwh": 0.1,
        "location": {"lat": where[0], "lon": where[1]}, "endpoint": f"http://127.0.0.1:8000/{name}",
        "carbon": {"provider": "csv", "zone": zone, "poll_interval_s": "5m"},
        "pools": [{"name": "h100", "gpu": "H100-80GB", "count": gpus, "models": [model], **pool}],
    }
    return validate(RegionConfig, default_region(raw), f"<test region {name}>")


@dataclass(frozen=True)
class Seen:
    """One decision of the run: when, the request's class, what the snapshot said of the
    clean pool, and where the request went (None: nowhere)."""

    at: float
    workload_class: str
    warmth: str
    cold_start_s: float
    wake_j: float
    chosen: str | None
    rejected_by: str | None


@dataclass
class Recording(Scheduler):
    """The router, noting what each decision saw of the "clean" region's pool."""

    seen: list[Seen] = field(default_factory=list)

    def schedule(self, request: Request, snapshot: FleetSnapshot) -> Decision:
        decision = super().schedule(request, snapshot)
        (clean,) = (c for c in snapshot.candidates if c.region.name == "clean")
        perf = snapshot.perf[clean.index]
        chosen = decision.chosen
        rejected = next((r.plugin for r in decision.rejected if r.candidate.region.name == "clean"), None)
        self.seen.append(Seen(snapshot.now, request.workload_class, perf.warmth, perf.cold_start_s, perf.wake_j,
                              None if chosen is None else chosen.candidate.region.name, rejected))
        return decision


def test_a_pool_at_zero_is_seen_cold_then_starting_then_warm_and_filtered_by_the_ttft_budget(files: Files) -> None:
    """A clean pool whose region file lets it scale to zero, beside a dirty one always up;
    carbon-first prefers the clean pool. While it is cold an interactive request (2 s budget)
    is kept from it by the cold-pool filter, a deferrable one (an hour) is sent and wakes it;
    the snapshots then show it starting for its cold start, then warm, and interactive
    requests go there too."""
    regions = (region_with("near", "DIRTY", PARIS, gpus=1),
               region_with("clean", "CLEAN", OSLO, gpus=2, autoscaling={"min_replicas": 0, "max_replicas": 2}))
    pol = policy()
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.05, rate=2.0, continents=europe_only(),
                                             deferrable_share=0.2, prefix_share=0.0), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    router = Recording.from_registry(default_scheduler_registry())
    assert isinstance(router, Recording)
    outcome = Simulation(regions, pol, workload, carbon, Scenario(autoscaling=AutoscalingSettings(), deferral=None),
                         0, router).outcome(False)
    assert (outcome.ran_in >= 0).all()

    clean = SnapshotBuilder(compile_fleet(regions), compile_policy(pol)).candidates[1]
    assert clean.region.name == "clean"
    start = cold_start(clean.gpu, clean.model, "bf16", 1)
    seen = router.seen
    states = [s.warmth for s in seen]
    print(f"\ncold start {start}; warmth seen: cold {states.count('cold')}, starting {states.count('starting')}, "
          f"warm {states.count('warm')}")
    # cold until the first request sent there, starting for its cold start, then warm
    first_starting = states.index("starting")
    first_warm = states.index("warm")
    assert set(states[:first_starting]) == {"cold"}
    assert set(states[first_starting:first_warm]) == {"starting"}
    assert set(states[first_warm:]) == {"warm"}
    # the request that woke it: deferrable, sent while it was cold
    (waker,) = [s for s in seen[:first_starting] if s.chosen == "clean"]
    assert waker.workload_class == "deferrable"
    # starting for the cold start (the snapshots are up to refresh_s = 1 s old)
    assert seen[first_warm - 1].at < waker.at + 1.0 + start.seconds < seen[first_warm].at + 1.0
    # the router priced the cold start with the router's function: its seconds while cold or
    # starting, its joules only while cold
    for s in seen[:first_warm]:
        assert s.cold_start_s == pytest.approx(start.seconds)
        assert s.wake_j == pytest.approx(start.joules if s.warmth == "cold" else 0.0)
    # while not warm: interactive requests filtered out by the cold pool filter, deferrable ones kept
    waiting = seen[:first_warm]
    interactive = [s for s in waiting if s.workload_class == "interactive"]
    deferrable = [s for s in waiting if s.workload_class == "deferrable"]
    assert interactive and deferrable
    assert all(s.rejected_by == "cold-pool" and s.chosen == "near" for s in interactive)
    assert all(s.rejected_by is None for s in deferrable)
    # once warm, the clean pool takes the interactive requests as well
    assert all(s.chosen == "clean" for s in seen[first_warm:])
    # one wake-up, charged what the router's function says
    pools = {p.region: p for p in outcome.pool_energy}
    assert pools["clean"].cold_starts == 1
    assert pools["clean"].cold_start_j == pytest.approx(start.joules)


def test_the_simulators_cold_start_is_the_routers(files: Files) -> None:
    """For a pool with no cold-start settings, and for one whose region file gives them, the
    simulated autoscaler's cold start [s, J] equals what the router's snapshot prices a cold
    pool at (``CandidatePerf.cold_start_s``, ``wake_j``)."""
    from scheduler.types import PoolLiveState, RegionLiveState

    regions = (region_with("derived", "CLEAN", PARIS, gpus=4),
               region_with("given", "CLEAN", OSLO, gpus=4, cold_start_s="12s", cold_start_j=2500.0),
               region_with("tp2", "CLEAN", OSLO, gpus=4, model_name="llama-3.1-70b", tensor_parallel=2))
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy()), models=frozenset({MODEL, "llama-3.1-70b"}))
    cold = {r.name: RegionLiveState(region=r.name, healthy=True, observed_at=T0,
                                    pools={"h100": PoolLiveState(replicas=0, starting_replicas=0)}) for r in regions}
    snapshot = builder.build(T0, live=cold)
    settings = AutoscalingSettings()
    starts = {}
    for c in builder.candidates:
        costs = builder.energy_model.rated_costs(c.model, c.gpu, c.deployment.precision,
                                                 c.deployment.tensor_parallel).costs
        pool = settings.for_pool(c, costs.max_num_seqs)
        perf = snapshot.perf[c.index]
        assert perf.warmth == "cold"
        assert (pool.cold_start_s, pool.cold_start_j) == pytest.approx((perf.cold_start_s, perf.wake_j))
        starts[c.region.name] = (pool.cold_start_s, pool.cold_start_j)
    print(f"\ncold starts [s, J]: {starts}")
    assert starts["given"] == (12.0, 2500.0)
    # derived: an 8B model in bf16 on one GPU loads faster and draws less than a 70B on two
    assert starts["derived"][0] < starts["tp2"][0] and starts["derived"][1] < starts["tp2"][1]
    # the run's overrides win over both (``simulate`` tests, not the CLI)
    given = next(c for c in builder.candidates if c.region.name == "given")
    forced = AutoscalingSettings(cold_start_s=5.0).for_pool(given, 256)
    assert (forced.cold_start_s, forced.cold_start_j) == (5.0, 2500.0)


def test_a_region_files_autoscaling_block_reaches_the_simulated_autoscaler(files: Files) -> None:
    """The block's min/max replicas, target and delays are the simulated autoscaler's; a pool
    without one gets the default the Ray Serve app gets (scheduler.config.autoscaling)."""
    block = {"min_replicas": 2, "max_replicas": 3, "target_ongoing_requests": 7, "upscale_delay_s": "15s",
             "downscale_delay_s": "2m", "metrics_interval_s": "5s", "look_back_period_s": "20s"}
    regions = (region_with("blocked", "CLEAN", PARIS, gpus=4, autoscaling=block),
               region_with("plain", "DIRTY", PARIS, gpus=4))
    pol = policy()
    workload = build_workload(load_trace(str(files.trace)),
                              WorkloadConfig(start=T0, hours=0.02, rate=1.0, continents=europe_only()), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, ["DIRTY", "CLEAN"], 2023)
    sim = Simulation(regions, pol, workload, carbon, Scenario(autoscaling=AutoscalingSettings()), 0)
    outcome = sim.outcome(False)
    scalers = {p.region: p for p in outcome.pool_energy}
    settings = {c.region.name: AutoscalingSettings().for_pool(c, 256) for c in SnapshotBuilder(compile_fleet(regions),
                                                                                               compile_policy(pol)).candidates}
    blocked, plain = settings["blocked"], settings["plain"]
    assert (blocked.min_replicas, blocked.max_replicas, blocked.target_ongoing_requests) == (2, 3, 7.0)
    assert (blocked.upscale_delay_s, blocked.downscale_delay_s) == (15.0, 120.0)
    assert (blocked.metrics_interval_s, blocked.look_back_period_s) == (5.0, 20.0)
    # the default: one replica up, every GPU of a one-model pool, 3/4 of max_num_seqs, Ray's delays
    assert (plain.min_replicas, plain.max_replicas, plain.target_ongoing_requests) == (1, 4, 192.0)
    assert (plain.upscale_delay_s, plain.downscale_delay_s, plain.metrics_interval_s) == (30.0, 600.0, 10.0)
    # in the run: the blocked pool keeps its two replicas warm from the start, the plain one one
    span = workload.arrival_s[-1] - workload.arrival_s[0]
    assert scalers["blocked"].warm_s >= 2 * span
    assert span <= scalers["plain"].warm_s < 2 * span
    # the autoscaler runs on them: 100 requests in flight at a target of 7 want 15 replicas; the
    # wish is taken after the 15 s upscale delay (samples every 5 s) and capped at max 3
    scaler = PoolAutoscaler(blocked, replicas=4)
    assert scaler.target == 2
    decisions = [scaler.decide(t, 2, scaler.observe(t, 100.0)) for t in (0.0, 5.0, 10.0, 15.0)]
    assert decisions == [2, 2, 2, 3]
    # a run-wide override replaces the block's value, the rest stays the block's
    low = AutoscalingSettings(min_replicas=0).for_pool(SnapshotBuilder(compile_fleet(regions),
                                                                       compile_policy(pol)).candidates[0], 256)
    assert (low.min_replicas, low.initial_replicas, low.max_replicas, low.target_ongoing_requests) == (0, 0, 3, 7.0)
