"""Hourly grid carbon intensity from Electricity Maps data-portal CSV files.

One file per zone, ``<ZONE>_<YEAR>_hourly.csv``, one row per UTC hour. The value for hour
``h`` describes ``h`` (its ``observed_at``) and is known from then on; replay at time ``t``
returns the row of the hour that contains ``t``.
"""

from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scheduler.types import Signal

SHIPPED_CARBON_DIR = Path(__file__).resolve().parent.parent / "data" / "carbon"
LCA_COLUMN = "Carbon Intensity gCO₂eq/kWh (LCA)"
DIRECT_COLUMN = "Carbon Intensity gCO₂eq/kWh (direct)"
DATETIME_COLUMN = "Datetime (UTC)"
KIND = "carbon_intensity"
UNIT = "gCO2eq/kWh"


class CarbonCsvError(ValueError):
    pass


@dataclass(frozen=True)
class ZoneSeries:
    zone: str
    path: Path
    times: tuple[float, ...]
    values: tuple[float, ...]
    estimated: tuple[bool, ...]

    def at(self, t: float, fetched_at: float | None = None) -> Signal | None:
        """The signal describing the hour that contains ``t`` (None before the first row)."""
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return None
        return self._signal(i, 0.0, t if fetched_at is None else fetched_at)

    def replay(self, t: float) -> Signal:
        """The file's year replayed at ``t``'s time of year: the row for the same UTC month,
        day and hour in the data's year, with ``observed_at`` moved into ``t``'s year, so
        that a 2023 file serves as a live feed today. Ages stay true: the value describes
        the start of the hour that contains ``t``."""
        offset = _year_start(t) - _year_start(self.times[0])
        i = bisect.bisect_right(self.times, t - offset) - 1
        i = min(max(i, 0), len(self.times) - 1)
        return self._signal(i, offset, t)

    def _signal(self, i: int, offset: float, fetched_at: float) -> Signal:
        return Signal(
            kind=KIND,
            key=self.zone,
            value=self.values[i],
            unit=UNIT,
            observed_at=self.times[i] + offset,
            fetched_at=fetched_at,
            source=f"csv:{self.path.name}",
            is_estimated=self.estimated[i],
        )


def _year_start(t: float) -> float:
    year = datetime.fromtimestamp(t, tz=UTC).year
    return datetime(year, 1, 1, tzinfo=UTC).timestamp()


def zone_file(directory: Path, zone: str, year: int | None = None) -> Path:
    pattern = f"{zone}_{year}_hourly.csv" if year else f"{zone}_*_hourly.csv"
    matches = sorted(directory.glob(pattern))
    if not matches:
        raise CarbonCsvError(f"{directory}: no file {pattern} for zone {zone}")
    return matches[-1]


def load_zone(path: Path, zone: str, column: str = LCA_COLUMN) -> ZoneSeries:
    times: list[float] = []
    values: list[float] = []
    estimated: list[bool] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in reader.fieldnames or DATETIME_COLUMN not in reader.fieldnames:
            raise CarbonCsvError(f"{path}: expected columns {DATETIME_COLUMN!r} and {column!r}, got {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            raw = row[column]
            if raw in ("", None):
                continue  # a gap in the data stays a gap: the signal ages through it
            try:
                when = datetime.fromisoformat(row[DATETIME_COLUMN]).replace(tzinfo=UTC).timestamp()
                value = float(raw)
            except ValueError as exc:
                raise CarbonCsvError(f"{path}:{line}: {exc}") from None
            if times and when <= times[-1]:
                raise CarbonCsvError(f"{path}:{line}: rows out of order at {row[DATETIME_COLUMN]}")
            times.append(when)
            values.append(value)
            estimated.append(row.get("Data Estimated", "").strip().lower() == "true")
    if not times:
        raise CarbonCsvError(f"{path}: no rows with a value in {column!r}")
    return ZoneSeries(zone, path, tuple(times), tuple(values), tuple(estimated))
