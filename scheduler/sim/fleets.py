"""Fleets to simulate: the configured regions, scaled, or grown to 12 regions for the benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.config.loader import default_region, validate
from scheduler.config.schema import RegionConfig


def scale_fleet(regions: Sequence[RegionConfig], factor: float) -> tuple[RegionConfig, ...]:
    """Every pool's GPU count times ``factor`` (at least one replica's worth): a fleet sized
    to a simulated rate, since the scheduler and the pools both see the scaled counts."""
    if factor <= 0:
        raise ValueError(f"capacity scale must be positive, got {factor}")
    if factor == 1.0:
        return tuple(regions)
    scaled = []
    for region in regions:
        pools = []
        for pool in region.pools:
            floor = max(d.tensor_parallel for d in pool.models)
            pools.append(pool.model_copy(update={"count": max(floor, round(pool.count * factor))}))
        scaled.append(region.model_copy(update={"pools": tuple(pools)}))
    return tuple(scaled)


def _region(name: str, jurisdiction: str, zone: str, lat: float, lon: float, pue: float) -> dict[str, Any]:
    return {
        "name": name,
        "jurisdiction": jurisdiction,
        "certifications": ["SOC2", "ISO27001"],
        "grid_zone": zone,
        "pue": pue,
        "price_per_kwh": 0.1,
        "location": {"lat": lat, "lon": lon},
        "endpoint": f"http://127.0.0.1:8000/{name}",
        "carbon": {"provider": "csv", "zone": zone, "poll_interval_s": "5m"},
        "pools": [
            {"name": "h100-chat", "gpu": "H100-80GB", "count": 128,
             "models": [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072}]},
            {"name": "a100-batch", "gpu": "A100-80GB", "count": 64,
             "models": [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 65536}]},
        ],
    }


# Four more regions on grid zones the project ships data for.
EXTRA_REGIONS: tuple[dict[str, Any], ...] = (
    _region("ca-central", "CA", "CA-ON", 43.65, -79.38, 1.2),
    _region("eu-south", "EU", "ES", 40.42, -3.70, 1.25),
    _region("ap-korea", "KR", "KR", 37.57, 126.98, 1.3),
    _region("au-east", "AU", "AU-NSW", -33.87, 151.21, 1.3),
)


def twelve_region_fleet(regions: Sequence[RegionConfig]) -> tuple[RegionConfig, ...]:
    """The configured regions plus ``EXTRA_REGIONS`` (skipping names already present)."""
    names = {r.name for r in regions}
    extra = tuple(
        validate(RegionConfig, default_region(raw), f"<generated region {raw['name']}>")
        for raw in EXTRA_REGIONS
        if raw["name"] not in names
    )
    return (*regions, *extra)
