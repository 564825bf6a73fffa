"""Fleets, pools and signals written as literals, for table-driven tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.config.schema import RegionConfig
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.types import Signal

NOW = 1_780_000_000.0  # 2026-05-28, a fixed clock for every unit test


def region(
    name: str,
    jurisdiction: str = "US",
    *,
    zone: str | None = None,
    pools: Sequence[Mapping[str, Any]] | None = None,
    certifications: Sequence[str] = ("SOC2",),
    lat: float = 40.0,
    lon: float = -75.0,
    pue: float = 1.2,
    price: float = 0.1,
) -> RegionConfig:
    """A region literal: one H100 pool serving llama-3.1-8b unless ``pools`` says otherwise."""
    zone = zone or f"Z-{name.upper()}"
    pools = pools or [pool("h100", "H100-80GB")]
    return RegionConfig.model_validate(
        {
            "name": name,
            "jurisdiction": jurisdiction,
            "certifications": list(certifications),
            "grid_zone": zone,
            "pue": pue,
            "price_per_kwh": price,
            "location": {"lat": lat, "lon": lon},
            "endpoint": f"http://127.0.0.1:1/{name}",
            "carbon": {"provider": "csv", "zone": zone, "poll_interval_s": 300},
            "pools": [dict(p) for p in pools],
        }
    )


def pool(name: str, gpu: str, *, count: int = 8, models: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "gpu": gpu,
        "count": count,
        "power_cap_w": GPU_CATALOGUE[gpu].tdp_w,
        "models": [dict(m) for m in (models or [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072}])],
    }


def carbon(zone: str, value: float, age_s: float = 0.0) -> Signal:
    return Signal(
        kind="carbon_intensity", key=zone, value=value, unit="gCO2eq/kWh",
        observed_at=NOW - age_s, fetched_at=NOW - age_s, source="test",
    )
