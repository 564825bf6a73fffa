"""Grid intensity per region and slice of the planned day: the forecast the planner ranks on
(``scheduler.sim.forecast``: the hourly carbon files' next hours with a seeded lognormal error,
issued at the start of each ``replan_every`` window), and the true value for hindsight."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from scheduler.capacity.assumptions import Assumptions
from scheduler.capacity.planner import Intensities, PlanningError
from scheduler.config.schema import RegionConfig
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.forecast import CarbonForecast
from scheduler.units import DAY_S, HOUR_S


def day_intensities(regions: Sequence[RegionConfig], day_start: float, a: Assumptions, carbon_dir: Path,
                    seed: int) -> Intensities:
    year = datetime.fromtimestamp(day_start, tz=UTC).year
    replay = CarbonReplay.from_dir(carbon_dir, [r.grid_zone for r in regions], year)
    for zone, series in replay.series.items():
        if not series.times[0] <= day_start or day_start + DAY_S > series.times[-1] + HOUR_S:
            raise PlanningError(f"{series.path}: zone {zone} has no hourly data for the whole day "
                                f"{datetime.fromtimestamp(day_start, tz=UTC):%Y-%m-%d}")
    horizon_h = max(1, round(a.replan_every_s / HOUR_S) + 1)
    forecast = CarbonForecast(replay, a.forecast_error, seed, horizon_h=max(24, horizon_h))
    planned: dict[str, tuple[float, ...]] = {}
    actual: dict[str, tuple[float, ...]] = {}
    for region in regions:
        zone = region.grid_zone
        values = []
        for k in range(a.slices):
            start = day_start + k * a.slice_s
            issued = day_start + (k * a.slice_s // a.replan_every_s) * a.replan_every_s
            points = forecast.points(zone, issued)
            values.append(next((v for at, v in points if at <= start < at + HOUR_S), points[-1][1]))
        planned[region.name] = tuple(values)
        actual[region.name] = tuple(replay.intensity(zone, day_start + k * a.slice_s) for k in range(a.slices))
    return Intensities(planned, actual)
