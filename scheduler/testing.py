"""Snapshot literals: a fleet, its signals and a request in a few lines, for tests, notebooks
and the REPL.

    >>> from scheduler.testing import pool, region, request, scheduler, snapshot
    >>> snap = snapshot(
    ...     region("eu-north", "EU", zone="NO", carbon=30, lat=59.9, lon=10.7),
    ...     region("us-east", "US", zone="US-MIDA-PJM", carbon=380, lat=39.0, lon=-77.5,
    ...            pools=[pool("h200-long", "H200-141GB")]),
    ... )
    >>> decision = scheduler().schedule(request(prompt_tokens=512, client=(40.7, -74.0)), snap)
    >>> decision.chosen.candidate.region.name
    'eu-north'

Every region gets one carbon signal for its zone (``carbon`` gCO2e/kWh, ``carbon_age_s`` old;
``carbon=None``: no signal). ``snapshot(..., policy=)`` takes a shipped policy's name or any
``PolicyConfig``. Nothing here does I/O but reading the shipped policy files.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import EMBEDDED_POLICIES
from scheduler.config.schema import CarbonSource, GeoLocation, ModelDeployment, PolicyConfig, PoolConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.types import FleetSnapshot, GeoPoint, PoolLiveState, RegionLiveState, Request, Signal, WorkloadClass

# 2023-06-01 12:00 UTC: inside the shipped hourly carbon data.
T0 = 1685620800.0


def pool(
    name: str = "h100-chat",
    gpu: str = "H100-80GB",
    count: int = 8,
    models: Sequence[str] = ("llama-3.1-8b",),
    precision: str = "bf16",
    max_context: int = 131072,
    tensor_parallel: int = 1,
) -> PoolConfig:
    return PoolConfig(
        name=name, gpu=gpu, count=count, power_cap_w=GPU_CATALOGUE[gpu].tdp_w,
        models=tuple(ModelDeployment(name=m, precision=precision, max_context=max_context,
                                     tensor_parallel=tensor_parallel) for m in models),
    )


@dataclass(frozen=True)
class RegionLiteral:
    config: RegionConfig
    # gCO2e/kWh of its zone's signal (None: no signal) and how old that signal is.
    carbon: float | None
    carbon_age_s: float


def region(
    name: str,
    jurisdiction: str = "US",
    *,
    zone: str | None = None,
    carbon: float | None = 300.0,
    carbon_age_s: float = 0.0,
    pue: float = 1.2,
    price_per_kwh: float = 0.1,
    lat: float = 0.0,
    lon: float = 0.0,
    certifications: Iterable[str] = (),
    pools: Sequence[PoolConfig] | None = None,
) -> RegionLiteral:
    grid_zone = zone or name.upper()
    config = RegionConfig(
        name=name, jurisdiction=jurisdiction, certifications=tuple(certifications), grid_zone=grid_zone,
        pue=pue, price_per_kwh=price_per_kwh, location=GeoLocation(lat=lat, lon=lon),
        endpoint=f"http://127.0.0.1:8000/{name}",
        carbon=CarbonSource(provider="csv", zone=grid_zone, poll_interval_s=300.0),
        pools=tuple(pools) if pools is not None else (pool(),),
    )
    return RegionLiteral(config, carbon, carbon_age_s)


@lru_cache(maxsize=8)
def shipped_policy(name: str = "default") -> PolicyConfig:
    """A shipped policy (policies/), checked against the registry."""
    return load_checked_fleet(policies_dir=EMBEDDED_POLICIES).policy(name)


def carbon_signal(zone: str, value: float, observed_at: float, source: str = "testing") -> Signal:
    return Signal(kind="carbon_intensity", key=zone, value=value, unit="gCO2eq/kWh", observed_at=observed_at,
                  fetched_at=observed_at, source=source)


def live_state(region_name: str, observed_at: float, pools: Mapping[str, PoolLiveState] | None = None,
               healthy: bool = True) -> RegionLiveState:
    return RegionLiveState(region=region_name, healthy=healthy, observed_at=observed_at, pools=dict(pools or {}))


def snapshot(
    *regions: RegionLiteral,
    policy: PolicyConfig | str = "default",
    now: float = T0,
    live: Mapping[str, RegionLiveState] | None = None,
    energy_routing_enabled: bool = True,
) -> FleetSnapshot:
    chosen = shipped_policy(policy) if isinstance(policy, str) else policy
    carbon = {
        r.config.grid_zone: carbon_signal(r.config.grid_zone, r.carbon, now - r.carbon_age_s)
        for r in regions if r.carbon is not None
    }
    builder = SnapshotBuilder(compile_fleet(tuple(r.config for r in regions)), compile_policy(chosen))
    return builder.build(now, carbon=carbon, live=live, energy_routing_enabled=energy_routing_enabled)


def request(
    model: str = "llama-3.1-8b",
    prompt_tokens: int = 512,
    max_tokens: int = 256,
    *,
    request_id: str = "req-1",
    workload_class: WorkloadClass = "interactive",
    client: tuple[float, float] | None = None,
    jurisdictions: Iterable[str] = (),
    certifications: Iterable[str] = (),
    cached_tokens: int = 0,
    precision: str | None = None,
    task_class: str | None = None,
    ttft_slo_ms: float | None = None,
) -> Request:
    return Request(
        request_id=request_id, model=model, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        workload_class=workload_class, client_location=None if client is None else GeoPoint(*client),
        allowed_jurisdictions=frozenset(jurisdictions), required_certifications=frozenset(certifications),
        cached_tokens=cached_tokens, precision=precision, task_class=task_class, ttft_slo_ms=ttft_slo_ms,
    )


def scheduler(seed: int = 0) -> Scheduler:
    """The decision function with every registered plugin."""
    return Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(seed))
