"""The release-window choice (scheduler.deferral.window) against a plain brute force, on
hand-made forecasts, on random ones (hypothesis) and on shipped grids and days that the
simulator's deferral figures were not measured on (docs/simulation.md uses the eight zones
of regions/ from 1 June; these use six other zones and other seasons)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, load_zone, zone_file
from scheduler.deferral import DEADLINE, NO_FORECAST, NOW, WINDOW, choose_release

H = 3600.0


def brute_cost(forecast: list[tuple[float, float]], t: float, d: float, step: float = H) -> float | None:
    """Mean of the step function over [t, t + d], from each point's overlap; None where any is unknown."""
    spans = []
    for i, (start, value) in enumerate(forecast):
        end = min(start + step, forecast[i + 1][0]) if i + 1 < len(forecast) else start + step
        spans.append((start, end, value))
    if d == 0:
        for start, end, value in spans:
            if start <= t < end:
                return value
        return None
    covered = area = 0.0
    for start, end, value in spans:
        overlap = min(end, t + d) - max(start, t)
        if overlap > 0:
            covered += overlap
            area += overlap * value
    return area / d if covered >= d * (1 - 1e-9) else None


def grid_min(forecast: list[tuple[float, float]], now: float, latest: float, d: float, n: int = 600) -> float | None:
    costs = [brute_cost(forecast, now + (latest - now) * k / n, d) for k in range(n + 1)]
    known = [c for c in costs if c is not None]
    return min(known) if known else None


def hourly(values: list[float], t0: float = 0.0) -> list[tuple[float, float]]:
    return [(t0 + i * H, v) for i, v in enumerate(values)]


def test_holds_for_the_lowest_hour_before_the_deadline() -> None:
    f = hourly([300, 250, 120, 90, 200, 40])
    r = choose_release(f, now=600.0, deadline=5 * H, duration_s=900.0)
    # Hour 5 (40) ends after the deadline; hour 3 (90) is the lowest that fits.
    assert (r.at, r.reason, r.value, r.now_value) == (3 * H, WINDOW, 90.0, 300.0)
    assert r.held and r.latest == 5 * H - 900.0
    assert "lowest window" in r.describe()


def test_a_run_that_would_straddle_the_deadline_starts_earlier() -> None:
    # The clean hour is the last one, but the request needs 30 min: it must start by
    # deadline - 30 min, inside the clean hour only if the hour began by then.
    f = hourly([500, 500, 10])
    r = choose_release(f, now=0.0, deadline=2 * H + 1200.0, duration_s=1800.0)
    assert r.reason == WINDOW
    assert r.at == pytest.approx(2 * H + 1200.0 - 1800.0)  # latest: 10 min of the run in the dirty hour
    assert r.value == pytest.approx((600 * 500 + 1200 * 10) / 1800)


def test_released_at_once_when_waiting_would_miss_the_deadline() -> None:
    f = hourly([500, 10])
    r = choose_release(f, now=100.0, deadline=1000.0, duration_s=900.0)
    assert (r.at, r.reason) == (100.0, DEADLINE)
    assert "miss the deadline" in r.describe()
    late = choose_release(f, now=100.0, deadline=500.0, duration_s=900.0)  # already too late: at once too
    assert (late.at, late.reason) == (100.0, DEADLINE)


def test_released_at_once_when_now_is_lowest_or_within_min_gain() -> None:
    f = hourly([100, 120, 97])
    assert choose_release(f, 0.0, 3 * H, 60.0).reason == WINDOW
    r = choose_release(f, 0.0, 3 * H, 60.0, min_gain=0.05)
    assert (r.at, r.reason) == (0.0, NOW)
    assert choose_release(hourly([50, 60, 70]), 10.0, 3 * H, 60.0).reason == NOW


def test_equal_windows_release_the_earliest() -> None:
    r = choose_release(hourly([80, 40, 40, 40]), 0.0, 4 * H, 60.0)
    assert (r.at, r.reason) == (H, WINDOW)


def test_no_forecast_or_a_gap_is_never_chosen() -> None:
    assert choose_release([], 0.0, 10 * H, 60.0).reason == NO_FORECAST
    # Hours 1 and 2 are missing: the run may not start in the gap, nor overlap it.
    f = [(0.0, 300.0), (3 * H, 100.0)]
    r = choose_release(f, 0.0, 5 * H, 1800.0)
    assert (r.at, r.reason) == (3 * H, WINDOW)
    # A forecast that starts later than now: its window is taken, now's value is unknown.
    r = choose_release([(2 * H, 50.0)], 0.0, 5 * H, 60.0)
    assert (r.at, r.reason, r.now_value) == (2 * H, WINDOW, None)
    # Only past points: nothing before the deadline is known.
    assert choose_release([(-5 * H, 50.0)], 0.0, 5 * H, 60.0).reason == NO_FORECAST


def test_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="ascending"):
        choose_release([(H, 1.0), (0.0, 2.0), (0.5 * H, 3.0)], 0.0, 5 * H, 60.0, step_s=600.0)
    with pytest.raises(ValueError, match="min_gain"):
        choose_release(hourly([1.0]), 0.0, H, 1.0, min_gain=-1)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[float, float]], float, float, float, float]:
    n = draw(st.integers(0, 14))
    t = draw(st.floats(-3 * H, 2 * H))
    points = []
    for _ in range(n):
        points.append((t, draw(st.floats(1.0, 900.0))))
        t += H * draw(st.sampled_from([1.0, 1.0, 1.0, 2.0, 0.5]))
    now = draw(st.floats(0.0, 3 * H))
    deadline = now + draw(st.floats(0.0, 12 * H))
    duration = draw(st.sampled_from([0.0, 30.0, 900.0, 1.5 * H, 4 * H]))
    min_gain = draw(st.sampled_from([0.0, 0.0, 0.1]))
    return points, now, deadline, duration, min_gain


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_release_is_the_least_cost_start_a_brute_force_finds(
    case: tuple[list[tuple[float, float]], float, float, float, float],
) -> None:
    forecast, now, deadline, duration, min_gain = case
    r = choose_release(forecast, now, deadline, duration, min_gain=min_gain)
    latest = deadline - duration
    assert r.latest == pytest.approx(latest)
    if latest <= now:
        assert (r.at, r.reason) == (now, DEADLINE)
        return
    assert now <= r.at <= latest
    best = grid_min(forecast, now, latest, duration)
    if best is None:
        # Nothing on the grid is known: only a window narrower than the grid step could be.
        assert r.reason in (NO_FORECAST, WINDOW)
        return
    assert r.reason != NO_FORECAST
    assert r.value is not None
    assert r.value == pytest.approx(brute_cost(forecast, r.at, duration), rel=1e-9)
    now_cost = brute_cost(forecast, now, duration)
    if r.reason == NOW:
        assert now_cost is not None
        assert now_cost - best <= min_gain * now_cost + 1e-6 * now_cost
    else:
        assert r.reason == WINDOW and r.at > now
        assert r.value <= best + 1e-6 * best  # no start on the grid is cheaper
        if r.now_value is not None:  # now known: the window is worth the wait
            assert r.now_value == pytest.approx(now_cost, rel=1e-9)
            assert r.now_value - r.value > min_gain * r.now_value - 1e-9


# Zones outside regions/ and days outside the simulator's reported runs.
UNSEEN = [("AU-NSW", (4, 20)), ("ZA", (8, 5)), ("IN-WE", (10, 27)), ("ES", (2, 14)), ("CL-SIC", (7, 3)), ("KR", (11, 18))]


@pytest.mark.parametrize(("zone", "day"), UNSEEN)
def test_on_shipped_grids_perfect_foresight_finds_the_lowest_hour(zone: str, day: tuple[int, int]) -> None:
    series = load_zone(zone_file(SHIPPED_CARBON_DIR, zone, 2023), zone)
    t0 = datetime(2023, *day, tzinfo=UTC).timestamp()
    i0 = next(i for i, t in enumerate(series.times) if t >= t0)
    truth = list(zip(series.times[i0:i0 + 40], series.values[i0:i0 + 40], strict=True))
    for minute in range(0, 24 * 60, 37):
        now = t0 + minute * 60.0
        deadline = now + 6 * H
        duration = 600.0
        # The forecast in force: from the hour that contains now.
        forecast = [p for p in truth if p[0] + H > now]
        r = choose_release(forecast, now, deadline, duration)
        latest = deadline - duration
        assert now <= r.at <= latest and r.reason in (WINDOW, NOW)
        best = grid_min(forecast, now, latest, duration, n=120)
        assert best is not None and r.value is not None
        assert r.value <= best * (1 + 1e-9)
        at_arrival = brute_cost(forecast, now, duration)
        assert at_arrival is not None
        assert r.value <= at_arrival * (1 + 1e-9)
