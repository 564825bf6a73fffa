"""Generated fleets for benchmarks and the simulator's scale tests: N regions x M pools on
the grid zones shipped in scheduler/data/carbon (so every region has real carbon data)."""

from __future__ import annotations

import random

from scheduler.config.schema import CarbonSource, GeoLocation, ModelDeployment, PoolConfig, RegionConfig
from scheduler.energy.hardware import GPU_CATALOGUE

# (zone, jurisdiction, lat, lon, pue, price USD/kWh)
ZONES: tuple[tuple[str, str, float, float, float, float], ...] = (
    ("US-CAL-CISO", "US", 37.37, -121.92, 1.12, 0.18),
    ("US-MIDA-PJM", "US", 39.04, -77.49, 1.25, 0.09),
    ("US-TEX-ERCO", "US", 32.78, -96.80, 1.30, 0.07),
    ("US-NY-NYIS", "US", 40.71, -74.01, 1.20, 0.16),
    ("CA-ON", "CA", 43.65, -79.38, 1.15, 0.08),
    ("DE-LU", "EU", 50.11, 8.68, 1.30, 0.22),
    ("NO", "EU", 59.91, 10.75, 1.10, 0.06),
    ("ES", "EU", 40.42, -3.70, 1.25, 0.14),
    ("GB", "UK", 51.51, -0.13, 1.20, 0.25),
    ("JP-TK", "JP", 35.68, 139.69, 1.35, 0.20),
    ("SG", "SG", 1.35, 103.82, 1.40, 0.17),
    ("KR", "KR", 37.57, 126.98, 1.30, 0.12),
    ("AU-NSW", "AU", -33.87, 151.21, 1.30, 0.19),
    ("IN-WE", "IN", 19.08, 72.88, 1.45, 0.10),
    ("BR-SP", "BR", -23.55, -46.63, 1.40, 0.13),
    ("ZA", "ZA", -26.20, 28.05, 1.50, 0.09),
)
POOL_GPUS = ("H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L4", "B200")
MODELS = ("llama-3.1-8b", "llama-3.2-3b", "llama-3.1-70b")


def synthetic_fleet(n_regions: int = 12, pools_per_region: int = 4, seed: int = 0) -> tuple[RegionConfig, ...]:
    if not 1 <= n_regions <= len(ZONES):
        raise ValueError(f"n_regions must be 1..{len(ZONES)}, got {n_regions}")
    rng = random.Random(seed)
    regions = []
    for zone, jurisdiction, lat, lon, pue, price in ZONES[:n_regions]:
        name = f"r-{zone.lower()}"
        pools = []
        for p in range(pools_per_region):
            gpu = POOL_GPUS[(p + rng.randrange(len(POOL_GPUS))) % len(POOL_GPUS)] if p else "H100-80GB"
            spec = GPU_CATALOGUE[gpu]
            models = [ModelDeployment(name="llama-3.1-8b", precision="bf16", max_context=131072 if spec.hbm_gb >= 80 else 32768)]
            if spec.hbm_gb >= 80:
                models.append(ModelDeployment(name="llama-3.1-70b", precision="fp8", max_context=65536, tensor_parallel=2))
            pools.append(
                PoolConfig(name=f"pool-{p}", gpu=gpu, count=8 * rng.randint(4, 32), models=tuple(models),
                           power_cap_w=spec.tdp_w)
            )
        regions.append(
            RegionConfig(
                name=name, jurisdiction=jurisdiction, certifications=("SOC2", "ISO27001"), grid_zone=zone,
                pue=pue, price_per_kwh=price, location=GeoLocation(lat=lat, lon=lon),
                endpoint=f"http://127.0.0.1:8000/{name}",
                carbon=CarbonSource(provider="csv", zone=zone, poll_interval_s=300.0), pools=tuple(pools),
            )
        )
    return tuple(regions)
