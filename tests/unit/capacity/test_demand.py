"""Demand from a trace and from a forecast file."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from scheduler.capacity.assumptions import load_assumptions
from scheduler.capacity.demand import DemandError, burst_ratios, client_groups, from_forecast_file, from_trace
from scheduler.sim.workload import City, Continent, Trace

DAY = datetime(2023, 6, 1, tzinfo=UTC)


def write_forecast(path: Path, hours: range, rps: float = 2.5) -> Path:
    rows = ["start,workload_class,mean_rps"]
    rows += [f"{(DAY + timedelta(hours=h)).isoformat()},interactive,{rps + h}" for h in hours]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_forecast_file_gives_each_slice_its_rate(tmp_path: Path) -> None:
    slices = from_forecast_file(write_forecast(tmp_path / "d.csv", range(24)), load_assumptions(), DAY.timestamp())
    assert [s.mean_rps["interactive"] for s in slices] == [2.5 + h for h in range(24)]
    assert [s.start for s in slices] == [DAY.timestamp() + 3600 * h for h in range(24)]


def test_a_forecast_file_missing_a_slice_is_refused(tmp_path: Path) -> None:
    path = write_forecast(tmp_path / "d.csv", range(23))
    with pytest.raises(DemandError, match=r"d\.csv: no row for slice 23 \(23 h UTC\), class interactive"):
        from_forecast_file(path, load_assumptions(), DAY.timestamp())


def test_the_trace_rate_follows_the_hourly_profile() -> None:
    trace = Trace("t", np.arange(100, dtype=float), np.full(100, 10), np.full(100, 10))
    profile = tuple(0.5 if h < 12 else 2.0 for h in range(24))
    a = dataclasses.replace(load_assumptions(), rate=4.0, hourly_profile=profile,
                            class_shares=(("interactive", 0.75), ("batch", 0.25), ("deferrable", 0.0)))
    slices = from_trace(trace, a, DAY.timestamp())
    assert slices[0].mean_rps == {"interactive": 1.5, "batch": 0.5, "deferrable": 0.0}
    assert slices[12].total_rps == 8.0


def test_burst_ratios_are_window_rates_over_the_mean() -> None:
    # 10 requests in the first minute, 30 in the second: a mean of 20 a minute (the trace's
    # span is its last offset plus one mean gap: 117 x 40 / 39 = 120 s).
    offsets = np.concatenate([np.linspace(0, 59, 10), np.linspace(60, 117, 30)])
    trace = Trace("t", offsets, np.ones(40, dtype=np.int64), np.ones(40, dtype=np.int64))
    assert burst_ratios(trace, 60.0) == pytest.approx([0.5, 1.5])


def test_clients_bound_by_residency_form_their_own_group() -> None:
    continents = (Continent("europe", 0.5, (City("paris", 48.86, 2.35),), "EU"),
                  Continent("america", 0.5, (City("ny", 40.71, -74.01),), None))
    bound, free = client_groups(continents, 0.4)
    assert (bound.name, bound.jurisdiction) == ("bound-EU", "EU")
    assert bound.share == pytest.approx(0.2)
    assert (free.name, free.jurisdiction) == ("unbound", None)
    assert free.share == pytest.approx(0.8)
    assert [w for _, _, w in free.cities] == pytest.approx([0.3 / 0.8, 0.5 / 0.8])
