"""Replay of the Electricity Maps data-portal hourly CSVs shipped with the project: the
embedded default provider, needing no network or key.

The file's year is replayed at the current time of year (as ``ZoneSeries.replay``): the value for
10:00 on 3 March is the 2023 row for 10:00 on 3 March, observed at 10:00 today. With
``speed`` > 1 the replay runs faster than the wall clock, from ``origin`` (when the provider
was made): after one wall minute at speed 60 it serves the row an hour later. Times are
mapped back to the wall clock, so ages stay true: a row is at most one hour / ``speed`` old.
The LCA (lifecycle) column is the default, as in Electricity Maps' API. The "forecast" is the
file's next hours: perfect foresight, and its ``source`` says so.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from scheduler.datalayer.carbon.base import Fetched, fetch_parts
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock
from scheduler.datalayer.carbon_csv import (
    LCA_COLUMN,
    SHIPPED_CARBON_DIR,
    CarbonCsvError,
    ZoneSeries,
    load_zone,
    zone_file,
)
from scheduler.types import Signal

NAME = "csv"
ENDPOINT = "replay"
FORECAST_HOURS = 24


def _year_start(t: float) -> float:
    return datetime(datetime.fromtimestamp(t, tz=UTC).year, 1, 1, tzinfo=UTC).timestamp()


@dataclass
class CsvReplayProvider:
    directory: Path = SHIPPED_CARBON_DIR
    column: str = LCA_COLUMN
    speed: float = 1.0
    clock: Clock = time.time
    origin: float | None = None
    name: str = NAME
    _series: dict[str, ZoneSeries] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError(f"csv replay speed must be positive, got {self.speed}")
        if self.origin is None:
            self.origin = self.clock()

    async def _load(self, zone: str) -> ZoneSeries:
        series = self._series.get(zone)
        if series is None:
            try:
                path = zone_file(self.directory, zone)
            except CarbonCsvError as exc:
                raise ProviderError(NAME, ENDPOINT, "unknown_zone", str(exc)) from None
            try:
                series = await asyncio.to_thread(load_zone, path, zone, self.column)
            except CarbonCsvError as exc:
                raise ProviderError(NAME, ENDPOINT, "bad_field", str(exc)) from None
            self._series[zone] = series
        return series

    def _frame(self, now: float) -> tuple[float, float]:
        """(replay time, wall time) of now: they differ only when ``speed`` != 1."""
        origin = self.origin if self.origin is not None else now
        return origin + (now - origin) * self.speed, now

    def _to_wall(self, replayed_at: float, replay_now: float, now: float) -> float:
        return now - (replay_now - replayed_at) / self.speed

    def _source(self, series: ZoneSeries, what: str) -> str:
        speed = "" if self.speed == 1 else f" x{self.speed:g}"
        return f"{NAME}:{series.path.name}{speed}{what}"

    async def rows(self, zone: str, start: int, stop: int) -> list[Signal]:
        """Rows ``start``..``stop`` relative to the current one (0), on the wall clock."""
        series = await self._load(zone)
        replay_now, now = self._frame(self.clock())
        offset = _year_start(replay_now) - _year_start(series.times[0])
        current = min(max(bisect.bisect_right(series.times, replay_now - offset) - 1, 0), len(series.times) - 1)
        out = []
        for i in range(max(0, current + start), min(len(series.times), current + stop + 1)):
            ahead = i > current
            out.append(
                Signal(
                    kind="carbon_intensity", key=zone, value=series.values[i], unit="gCO2eq/kWh",
                    observed_at=self._to_wall(series.times[i] + offset, replay_now, now), fetched_at=now,
                    source=self._source(series, " (file's next hours)" if ahead else ""), is_forecast=ahead,
                    is_estimated=series.estimated[i],
                )
            )
        return out

    async def latest(self, zone: str) -> list[Signal]:
        return await self.rows(zone, 0, 0)

    async def forecast(self, zone: str) -> list[Signal]:
        ahead = await self.rows(zone, 1, FORECAST_HOURS)
        if not ahead:
            raise ProviderError(NAME, ENDPOINT, "no_data", f"zone {zone}: the file ends here, nothing ahead")
        return ahead

    async def history(self, zone: str) -> list[Signal]:
        return await self.rows(zone, -24, 0)

    async def fetch(self, zone: str) -> Fetched:
        return await fetch_parts(lambda: self.latest(zone), lambda: self.forecast(zone))

    async def aclose(self) -> None:
        return None
