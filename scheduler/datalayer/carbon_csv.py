"""Hourly grid carbon intensity from Electricity Maps data-portal CSV files.

One file per zone, ``<ZONE>_<YEAR>_hourly.csv``, one row per UTC hour. The value for hour
``h`` describes ``h`` (its ``observed_at``) and is known from then on; replay at time ``t``
returns the row of the hour that contains ``t``.

Replaying the file's year in another year maps by calendar date: the same UTC month, day and
hour (``same_date_in``), never by a fixed number of days, so a leap year on either side does
not shift the rest of the year by a day. 29 February replayed in a year without one is never
served; replayed from a file without one, it serves 28 February again. Weekdays are not kept
(a Tuesday's row may replay on a Wednesday): seasons and hours of daylight matter more to grid
intensity than the weekday, and a weekday-aligned shift would move dates by up to three days.
"""

from __future__ import annotations

import bisect
import calendar
import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scheduler.signal_check import BOUNDS
from scheduler.types import Signal

SHIPPED_CARBON_DIR = Path(__file__).resolve().parent.parent / "data" / "carbon"
LCA_COLUMN = "Carbon Intensity gCO₂eq/kWh (LCA)"
DIRECT_COLUMN = "Carbon Intensity gCO₂eq/kWh (direct)"
DATETIME_COLUMN = "Datetime (UTC)"
KIND = "carbon_intensity"
UNIT = "gCO2eq/kWh"


class CarbonCsvError(ValueError):
    pass


def factors_of(column: str) -> str:
    """The emission factors of an Electricity Maps CSV column: "lifecycle" or "direct"."""
    return "direct" if column == DIRECT_COLUMN else "lifecycle"


@dataclass(frozen=True)
class ZoneSeries:
    zone: str
    path: Path
    times: tuple[float, ...]
    values: tuple[float, ...]
    estimated: tuple[bool, ...]
    # the column the values came from (lifecycle or direct emission factors)
    column: str = LCA_COLUMN

    def at(self, t: float, fetched_at: float | None = None) -> Signal | None:
        """The signal describing the hour that contains ``t`` (None before the first row)."""
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return None
        return self._signal(i, 0.0, t if fetched_at is None else fetched_at)

    @property
    def year(self) -> int:
        """The data's year (its first row's)."""
        return datetime.fromtimestamp(self.times[0], tz=UTC).year

    def replay_row(self, t: float) -> tuple[int, float] | None:
        """The row replayed at ``t`` (the row for ``t``'s UTC month, day and hour in the data's
        year) and its ``observed_at`` in ``t``'s frame: ``t`` minus the row's age then, so
        ages stay true (the start of the hour that contains ``t``, unless the file has a gap).
        None when that date is before the file's first row."""
        shifted = same_date_in(t, self.year)
        i = bisect.bisect_right(self.times, shifted) - 1
        if i < 0:
            return None
        return i, t - (shifted - self.times[i])

    def replay(self, t: float) -> Signal:
        """The file's year replayed at ``t``'s date (see the module docstring), so that a 2023
        file serves as a live feed today; before the file's first row, that row."""
        row = self.replay_row(t)
        if row is None:
            return self._signal(0, t - same_date_in(t, self.year), t)
        i, observed_at = row
        return self._signal(i, observed_at - self.times[i], t)

    def highest(self, t: float, window_s: float) -> float | None:
        """The highest value within the physical bounds of an intensity observed in the
        ``window_s`` before ``t`` (the file's year replayed at ``t``'s date, as ``replay``);
        None when no row falls in it."""
        shifted = same_date_in(t, self.year)
        low, high = BOUNDS[KIND]
        start = bisect.bisect_right(self.times, shifted - window_s)
        end = bisect.bisect_right(self.times, shifted)
        return max((v for v in self.values[start:end] if low <= v <= high), default=None)

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
            signal_type="average",
            emission_factors=factors_of(self.column),
        )


def same_date_in(t: float, year: int) -> float:
    """``t``'s UTC month, day and time of day in ``year``; 29 February in a year without one
    is 28 February."""
    at = datetime.fromtimestamp(t, tz=UTC)
    if (at.month, at.day) == (2, 29) and not calendar.isleap(year):
        at = at.replace(day=28)
    return at.replace(year=year).timestamp()


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
    return ZoneSeries(zone, path, tuple(times), tuple(values), tuple(estimated), column)
