"""Helpers for the simulator tests: small fleets, policies, carbon files and traces whose simulated outcome can be worked out
by hand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler.config.loader import default_region, load_fleet, validate
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.framework.scheduler import Scheduler
from scheduler.sim.carbon_feed import CarbonReplay, ProviderOutage
from scheduler.sim.deferral import Deferral
from scheduler.sim.engine import RegionOutage, Scenario, Simulation
from scheduler.sim.report import PolicyResult
from scheduler.sim.truth import EXACT_TRUTH, TruthModel
from scheduler.sim.workload import City, Continent, Workload, WorkloadConfig, build_workload, load_trace

START = datetime(2023, 6, 1, tzinfo=UTC)
PARIS = (48.86, 2.35)
OSLO = (59.91, 10.75)
NEW_YORK = (40.71, -74.01)
CARBON_COLUMNS = (
    "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
    "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
    "Data Estimated,Data Estimation Method"
)


def region(name: str, zone: str, where: tuple[float, float], jurisdiction: str = "EU", gpus: int = 8) -> RegionConfig:
    raw: dict[str, Any] = {
        "name": name,
        "jurisdiction": jurisdiction,
        "grid_zone": zone,
        "pue": 1.2,
        "price_per_kwh": 0.1,
        "location": {"lat": where[0], "lon": where[1]},
        "endpoint": f"http://127.0.0.1:8000/{name}",
        "carbon": {"provider": "csv", "zone": zone, "poll_interval_s": "5m"},
        "pools": [{"name": "h100", "gpu": "H100-80GB", "count": gpus,
                   "models": [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072}]}],
    }
    return validate(RegionConfig, default_region(raw), f"<test region {name}>")


def policy(ttft_ms: float = 2000.0, ttft_ms_per_1k: float = 100.0) -> PolicyConfig:
    """The shipped carbon-first policy (carbon far above every other term; fallback: TTFT only;
    carbon max age 2 h, region state 5 s; a stale region is down) with its interactive TTFT
    SLO set to ``ttft_ms`` + ``ttft_ms_per_1k`` per 1k prompt tokens."""
    shipped = load_fleet().policy("carbon-first")
    interactive = shipped.slo.interactive.model_copy(
        update={"ttft_ms": ttft_ms, "ttft_ms_per_1k_prompt_tokens": ttft_ms_per_1k})
    return shipped.model_copy(update={"slo": shipped.slo.model_copy(update={"interactive": interactive})})


def europe_only(city: tuple[float, float] = PARIS) -> tuple[Continent, ...]:
    return (Continent("europe", 1.0, (City("client", *city),), jurisdiction="EU"),)


@dataclass(frozen=True)
class Files:
    carbon_dir: Path
    trace: Path


def make_files(tmp_path: Path) -> Files:
    """CLEAN at 20 g/kWh and DIRTY at 500 g/kWh for two days; a trace of identical requests
    (100 prompt tokens, 50 output tokens), one a second for a minute."""
    carbon_dir = tmp_path / "carbon"
    carbon_dir.mkdir()
    for zone, value in (("CLEAN", 20.0), ("DIRTY", 500.0)):
        rows = [CARBON_COLUMNS]
        for h in range(48):
            when = (START + timedelta(hours=h)).strftime("%Y-%m-%d %H:%M:%S")
            rows.append(f"{when},X,{zone},{zone},{value},{value},50,50,test,false,")
        (carbon_dir / f"{zone}_2023_hourly.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return Files(carbon_dir, write_trace(tmp_path / "trace.csv", prompt_tokens=100, output_tokens=50))


def write_zone(carbon_dir: Path, zone: str, hourly: list[float]) -> None:
    """A zone's hourly file from START: hour h at ``hourly[h]`` g/kWh."""
    rows = [CARBON_COLUMNS]
    for h, value in enumerate(hourly):
        when = (START + timedelta(hours=h)).strftime("%Y-%m-%d %H:%M:%S")
        rows.append(f"{when},X,{zone},{zone},{value},{value},50,50,test,false,")
    (carbon_dir / f"{zone}_2023_hourly.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def write_trace(path: Path, prompt_tokens: int, output_tokens: int) -> Path:
    """A trace of identical requests, one a second for a minute."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for s in range(60):
        lines.append(f"2023-11-16 18:{s // 60:02d}:{s % 60:02d}.0000000,{prompt_tokens},{output_tokens}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def simulate(
    files: Files,
    regions: tuple[RegionConfig, ...],
    pol: PolicyConfig,
    *,
    hours: float = 1.0,
    rate: float = 1.0,
    continents: tuple[Continent, ...] | None = None,
    residency_share: float = 0.0,
    region_outages: tuple[RegionOutage, ...] = (),
    carbon_outages: tuple[ProviderOutage, ...] = (),
    carbon_delay_s: float = 0.0,
    seed: int = 0,
    scheduler: Scheduler | None = None,
    truth: TruthModel = EXACT_TRUTH,
    prefix_share: float = 0.0,
    deferrable_share: float = 0.0,
    deferrable_deadline_s: float | None = None,
    deferral: Deferral | None = None,
) -> tuple[PolicyResult, Workload]:
    workload = build_workload(
        load_trace(str(files.trace)),
        WorkloadConfig(
            start=START.timestamp(), hours=hours, rate=rate, continents=continents or europe_only(),
            residency_share=residency_share, prefix_share=prefix_share, deferrable_share=deferrable_share,
            deferrable_deadline_s=deferrable_deadline_s,
        ),
        seed,
    )
    carbon = CarbonReplay.from_dir(
        files.carbon_dir, [r.grid_zone for r in regions], 2023, carbon_delay_s, carbon_outages
    )
    scenario = Scenario(region_outages=region_outages, truth=truth, deferral=deferral)
    sim = Simulation(regions, pol, workload, carbon, scenario, seed, scheduler)
    return sim.run(progress=False), workload
