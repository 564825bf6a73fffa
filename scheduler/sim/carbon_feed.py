"""Carbon signals replayed from hourly CSV files, as a provider would have published them.

The value for hour h becomes known at h + publication delay; during a provider outage
(``ProviderOutage``, ``scheduler simulate --carbon-outage``) no new value arrives: from the
outage's start until its end the zone's signal is the last value published before the start
(strictly before: the provider is quiet from that instant on), with its true ``observed_at``,
so it ages past the policy's ``max_age.carbon`` (the scorer then abstains and the ranking
falls back). Overlapping outages of a zone make one quiet period, from the earliest start.
After the end the provider publishes again: the latest value published by then, fresh.
Accounting (grams a request really cost) uses the true value of the hour the request ran in,
never the published one.

``trailing_max(zone, now, window_s)``: the highest accepted value (``signal_check``: finite,
within the physical bounds) among those a router had received by ``now`` (published by then,
and during an outage before its start) that were observed in the window [now - window_s, now].
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from scheduler.datalayer.carbon_csv import ZoneSeries, load_zone, zone_file
from scheduler.signal_check import value_problem
from scheduler.types import Signal


@dataclass(frozen=True)
class ProviderOutage:
    """No new carbon value for ``zone`` (None: every zone) between ``start`` and ``end``."""

    zone: str | None
    start: float
    end: float

    def covers(self, zone: str, t: float) -> bool:
        return (self.zone is None or self.zone == zone) and self.start <= t < self.end


class CarbonReplay:
    def __init__(
        self,
        series: Mapping[str, ZoneSeries],
        delay_s: float = 0.0,
        outages: Iterable[ProviderOutage] = (),
    ) -> None:
        self.series = dict(series)
        self.delay_s = delay_s
        self.outages = tuple(outages)
        self._signals: dict[tuple[str, int], Signal] = {}
        self._last_rows: tuple[int, ...] = ()
        self._last_published: dict[str, Signal] = {}
        # The last answer holds for every t in [_valid_from, _valid_until): no row is
        # published and no outage starts or ends in between.
        self._valid_from = math.inf
        self._valid_until = -math.inf
        # zone -> (from, until, value) of the row ``intensity`` answered last
        self._current: dict[str, tuple[float, float, float]] = {}

    @classmethod
    def from_dir(
        cls,
        directory: Path,
        zones: Iterable[str],
        year: int | None = None,
        delay_s: float = 0.0,
        outages: Iterable[ProviderOutage] = (),
    ) -> CarbonReplay:
        series = {zone: load_zone(zone_file(directory, zone, year), zone) for zone in sorted(set(zones))}
        return cls(series, delay_s, outages)

    def published_row(self, zone: str, t: float) -> int:
        """The index of the latest row of ``zone`` published by ``t`` (-1: none yet)."""
        return self._published_row(zone, t)

    def _published_row(self, zone: str, t: float) -> int:
        times = self.series[zone].times
        quiet = self.quiet_since(zone, t)
        if quiet is not None:  # what was known when the provider went quiet
            return bisect.bisect_left(times, quiet - self.delay_s) - 1
        return bisect.bisect_right(times, t - self.delay_s) - 1

    def quiet_since(self, zone: str, t: float) -> float | None:
        """The start of the quiet period of ``zone`` (outages, overlapping ones joined) that
        ``t`` is in; None when its provider publishes at ``t``."""
        since = None
        while True:
            at = t if since is None else since
            earlier = [o.start for o in self.outages if o.covers(zone, at) and (since is None or o.start < since)]
            if not earlier:
                return since
            since = min(earlier)

    def trailing_max(self, zone: str, now: float, window_s: float) -> float | None:
        """The highest accepted value of ``zone`` a router had received by ``now`` among those
        observed in [now - window_s, now] (module doc); None when there is none (or no file
        for the zone)."""
        if zone not in self.series:
            return None
        last = self._published_row(zone, now)
        times = self.series[zone].times
        first = bisect.bisect_left(times, now - window_s, 0, last + 1)
        accepted = [self._signal(zone, row).value for row in range(first, last + 1)
                    if value_problem(self._signal(zone, row)) is None]
        return max(accepted, default=None)

    def published(self, t: float) -> Mapping[str, Signal]:
        """Zone -> the latest signal a provider had published by ``t`` (absent: none yet)."""
        if self._valid_from <= t < self._valid_until:
            return self._last_published
        rows = tuple(self._published_row(zone, t) for zone in self.series)
        self._valid_from, self._valid_until = t, self._next_change(t, rows)
        if rows == self._last_rows:
            return self._last_published
        published: dict[str, Signal] = {}
        for zone, row in zip(self.series, rows, strict=True):
            if row >= 0:
                published[zone] = self._signal(zone, row)
        self._last_rows, self._last_published = rows, published
        return published

    def _next_change(self, t: float, rows: tuple[int, ...]) -> float:
        """The first time after ``t`` at which a new row is published or an outage starts or
        ends (a conservative bound: the answer may still be the same then)."""
        candidates = [o.start for o in self.outages if o.start > t] + [o.end for o in self.outages if o.end > t]
        for zone, row in zip(self.series, rows, strict=True):
            times = self.series[zone].times
            if row + 1 < len(times):
                candidates.append(max(times[row + 1] + self.delay_s, math.nextafter(t, math.inf)))
        return min(candidates, default=math.inf)

    def _signal(self, zone: str, row: int) -> Signal:
        signal = self._signals.get((zone, row))
        if signal is None:
            s = self.series[zone]
            observed = s.times[row]
            signal = Signal(
                kind="carbon_intensity",
                key=zone,
                value=s.values[row],
                unit="gCO2eq/kWh",
                observed_at=observed,
                fetched_at=observed + self.delay_s,
                source=f"csv:{s.path.name}",
                is_estimated=s.estimated[row],
            )
            self._signals[(zone, row)] = signal
        return signal

    def intensity(self, zone: str, t: float) -> float:
        """The true intensity of the hour containing ``t`` (the first hour's before the data)."""
        low, high, value = self._current.get(zone, (1.0, 0.0, 0.0))
        if low <= t < high:
            return value
        s = self.series[zone]
        row = max(0, bisect.bisect_right(s.times, t) - 1)
        high = s.times[row + 1] if row + 1 < len(s.times) else math.inf
        low = s.times[row] if row > 0 else -math.inf
        self._current[zone] = (low, high, s.values[row])
        return s.values[row]
