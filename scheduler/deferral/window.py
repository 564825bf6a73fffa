"""The release-window choice: the lowest-carbon window of a forecast before a request's deadline.

A pure function, shared by the simulator and the router. Inputs:

- ``forecast``: points ``(start, value)`` in ascending ``start`` (epoch seconds; a value in
  any unit, e.g. gCO2eq/kWh, x PUE if the caller wants it). Point i holds over
  [start_i, min(start_{i+1}, start_i + step_s)); what no point covers (a gap, before the
  first, after the last) is unknown. A provider's hourly forecast gives ``step_s`` = 1 h.
- ``now``; ``deadline``, when the request must be done; ``duration_s``, the time it needs
  from release to done (the caller's prediction and its safety margin).

Then

    latest  = deadline - duration_s                 the last release that meets the deadline
    cost(t) = mean forecast value over [t, t + duration_s]   (the value at t if duration_s = 0),
              defined where the forecast covers all of it
    best    = the t in [now, latest] of least cost, the earliest among equal ones

cost is piecewise linear in t, with breakpoints where t or t + duration_s crosses a point's
start or end, so ``best`` is found among now, latest and those breakpoints: exact, no grid.

The release:

    latest <= now                                       -> now, DEADLINE (waiting would miss it)
    no t in [now, latest] has a defined cost            -> now, NO_FORECAST
    best = now, or cost(now) - cost(best) <= min_gain x cost(now)
                                                        -> now, NOW (now is the lowest window)
    otherwise                                           -> best, WINDOW (held until then)

When the forecast does not cover now but covers a later window, that window is taken (WINDOW):
an unknown now is not preferred to a known later value.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.units import HOUR_S

# Why a request is released when it is.
WINDOW = "window"  # held until the forecast's lowest-carbon window before its deadline
NOW = "now"  # released at once: now is already the lowest window (or within min_gain of it)
DEADLINE = "deadline"  # released at once: waiting any longer would miss the deadline
NO_FORECAST = "no-forecast"  # released at once: no forecast covers a window before the deadline
REASONS = (WINDOW, NOW, DEADLINE, NO_FORECAST)

ForecastPoint = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Release:
    """When to release a request, and why."""

    at: float
    reason: str
    # The last release that meets the deadline (deadline - duration_s).
    latest: float
    # Forecast mean over the run released at ``at``, and over a run released now (None: unknown).
    value: float | None
    now_value: float | None

    @property
    def held(self) -> bool:
        """True when the request waits (released later than asked)."""
        return self.reason == WINDOW

    def describe(self) -> str:
        """One line for a decision or receipt."""
        if self.reason == WINDOW:
            now = "unknown" if self.now_value is None else f"{self.now_value:.4g}"
            return f"held for the forecast's lowest window before the deadline ({self.value:.4g} against {now} now)"
        if self.reason == NOW:
            return "released at once: now is the forecast's lowest window before the deadline"
        if self.reason == DEADLINE:
            return "released at once: waiting would miss the deadline"
        return "released at once: no forecast covers a window before the deadline"


class _Curve:
    """The forecast as a step function: its integral F and its unknown length U, both
    piecewise linear over the breakpoints ``xs``."""

    __slots__ = ("area", "unknown", "values", "xs")

    def __init__(self, forecast: Sequence[ForecastPoint], step_s: float) -> None:
        xs: list[float] = []
        values: list[float] = []  # value over [xs[j], xs[j + 1]); NaN: unknown
        for i, (at, value) in enumerate(forecast):
            start = float(at)
            end = start + step_s
            if i + 1 < len(forecast):
                if forecast[i + 1][0] < start:
                    raise ValueError(f"forecast points must be in ascending time: {forecast[i + 1][0]} after {start}")
                end = min(end, forecast[i + 1][0])
            if not end > start:
                continue
            if xs and start > xs[-1]:
                values.append(math.nan)  # a gap
                xs.append(start)
            elif not xs:
                xs.append(start)
            values.append(float(value) if math.isfinite(value) else math.nan)
            xs.append(end)
        self.xs = xs
        self.values = values
        area = [0.0]
        unknown = [0.0]
        for j, v in enumerate(values):
            width = xs[j + 1] - xs[j]
            if math.isnan(v):
                area.append(area[-1])
                unknown.append(unknown[-1] + width)
            else:
                area.append(area[-1] + v * width)
                unknown.append(unknown[-1])
        self.area = area
        self.unknown = unknown

    def _at(self, x: float) -> tuple[float, float]:
        """(F(x), U(x)) for x inside [xs[0], xs[-1]]."""
        xs = self.xs
        j = min(max(bisect.bisect_right(xs, x) - 1, 0), len(self.values) - 1)
        v = self.values[j]
        dx = x - xs[j]
        if math.isnan(v):
            return self.area[j], self.unknown[j] + dx
        return self.area[j] + v * dx, self.unknown[j]

    def cost(self, t: float, duration: float) -> float | None:
        """Mean value over [t, t + duration] (the value at t when duration = 0); None where
        any of it is unknown."""
        xs = self.xs
        if not xs or t < xs[0] or t + duration > xs[-1] or (duration == 0.0 and t >= xs[-1]):
            return None
        if duration == 0.0:
            v = self.values[bisect.bisect_right(xs, t) - 1]
            return None if math.isnan(v) else v
        a0, u0 = self._at(t)
        a1, u1 = self._at(t + duration)
        if u1 - u0 > 1e-9 * duration:
            return None
        return (a1 - a0) / duration


def choose_release(
    forecast: Sequence[ForecastPoint],
    now: float,
    deadline: float,
    duration_s: float,
    *,
    step_s: float = HOUR_S,
    min_gain: float = 0.0,
) -> Release:
    """When to release a request that must be done by ``deadline`` and needs ``duration_s``
    (module docstring)."""
    if step_s <= 0:
        raise ValueError(f"step_s must be positive, got {step_s}")
    if min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {min_gain}")
    duration = max(0.0, float(duration_s))
    latest = deadline - duration
    curve = _Curve(forecast, step_s)
    now_value = curve.cost(now, duration) if curve.xs else None
    if latest <= now:
        return Release(now, DEADLINE, latest, now_value, now_value)
    # Breakpoints of cost(t) inside (now, latest]: where t or t + duration meets a point's edge.
    candidates = {latest}
    lo, hi = bisect.bisect_right(curve.xs, now), bisect.bisect_right(curve.xs, latest)
    candidates.update(curve.xs[lo:hi])
    if duration > 0.0:
        lo, hi = bisect.bisect_right(curve.xs, now + duration), bisect.bisect_right(curve.xs, latest + duration)
        candidates.update(x - duration for x in curve.xs[lo:hi])
    best_t, best = now, now_value
    for t in sorted(c for c in candidates if now < c <= latest):
        cost = curve.cost(t, duration)
        if cost is not None and (best is None or cost < best - 1e-9 * max(1.0, abs(best))):
            best_t, best = t, cost
    if best is None:
        return Release(now, NO_FORECAST, latest, None, None)
    if best_t == now or (now_value is not None and now_value - best <= min_gain * now_value):
        return Release(now, NOW, latest, now_value, now_value)
    return Release(best_t, WINDOW, latest, best, now_value)
