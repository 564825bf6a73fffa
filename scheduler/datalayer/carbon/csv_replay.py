"""Replay of the Electricity Maps data-portal hourly CSVs shipped with the project: the
embedded default provider, needing no network or key.

The file's year is replayed at the current date (as ``ZoneSeries.replay``): the value for
10:00 on 3 March is the 2023 row for 10:00 on 3 March, observed at 10:00 today, in leap years
too (29 February replays 28 February from a file without one; see ``scheduler.datalayer.carbon_csv``). With
``speed`` > 1 the replay runs faster than the wall clock, from ``origin`` (when the provider
was made): after one wall minute at speed 60 it serves the row an hour later. Times are
mapped back to the wall clock, so ages stay true: a row is at most one hour / ``speed`` old.
The LCA (lifecycle) column is the default, as in Electricity Maps' API. The "forecast" is the
file's next hours: perfect foresight, and its ``source`` says so.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.datalayer.carbon.base import NO_SKIP, Fetched, fetch_parts
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock
from scheduler.datalayer.carbon_csv import (
    LCA_COLUMN,
    SHIPPED_CARBON_DIR,
    CarbonCsvError,
    ZoneSeries,
    factors_of,
    load_zone,
    zone_file,
)
from scheduler.types import Signal

NAME = "csv"
ENDPOINT = "replay"
FORECAST_HOURS = 24


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
        """The rows replayed at the hours ``start``..``stop`` from now (0: the current one), on
        the wall clock; an hour that replays the same row as the one before (a gap in the file)
        is left out."""
        series = await self._load(zone)
        replay_now, now = self._frame(self.clock())
        out: list[Signal] = []
        before = series.replay_row(replay_now + (start - 1) * 3600.0)
        previous = None if before is None else before[1]
        for hour in range(start, stop + 1):
            row = series.replay_row(replay_now + hour * 3600.0)
            if row is None or row[1] == previous:
                continue  # before the file's first row, or the same row again
            i, observed_at = row
            previous = observed_at
            ahead = hour > 0
            out.append(
                Signal(
                    kind="carbon_intensity", key=zone, value=series.values[i], unit="gCO2eq/kWh",
                    observed_at=self._to_wall(observed_at, replay_now, now), fetched_at=now,
                    source=self._source(series, " (file's next hours)" if ahead else ""), is_forecast=ahead,
                    is_estimated=series.estimated[i], signal_type="average",
                    emission_factors=factors_of(series.column),
                )
            )
        return out

    async def latest(self, zone: str) -> list[Signal]:
        current = await self.rows(zone, 0, 0)
        if not current:
            raise ProviderError(NAME, ENDPOINT, "no_data", f"zone {zone}: now is before the file's first row")
        return current

    async def forecast(self, zone: str) -> list[Signal]:
        ahead = await self.rows(zone, 1, FORECAST_HOURS)
        if not ahead:
            raise ProviderError(NAME, ENDPOINT, "no_data", f"zone {zone}: no row ahead in the file")
        return ahead

    async def history(self, zone: str) -> list[Signal]:
        return await self.rows(zone, -24, 0)

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        return await fetch_parts(lambda: self.latest(zone), lambda: self.forecast(zone), skip)

    async def aclose(self) -> None:
        return None
