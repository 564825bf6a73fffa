"""``scheduler plan --json`` on the shipped fleet: the plan file's schema, the daily schedule the
simulator reads from it, and the Ray Serve autoscaling windows."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from scheduler.cli import main
from scheduler.plan.schedule import (
    PLAN_NAMES,
    AutoscalingWindow,
    DailySchedule,
    PlanError,
    PlanFile,
    autoscaling_windows,
    load_schedule,
    plan_json_schema,
    read_plan,
    target_ongoing_requests_at,
    warm_replicas_at,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shipped_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("plan")
    plan, autoscaling = folder / "plan.json", folder / "autoscaling.yaml"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--trace", "conv", "--day", "2023-06-01", "--json", "--regions", str(ROOT / "regions"),
                     "--policies", str(ROOT / "policies"), "--autoscaling-out", str(autoscaling)])
    assert code == 0
    plan.write_text(out.getvalue(), encoding="utf-8")
    return plan, autoscaling


@pytest.mark.timeout(120)
def test_the_shipped_fleet_gets_warm_replicas_per_pool_and_hour(shipped_plan: tuple[Path, Path]) -> None:
    raw = json.loads(shipped_plan[0].read_text(encoding="utf-8"))
    plan = PlanFile.model_validate(raw)
    assert plan.day == "2023-06-01" and plan.slices == 24 and plan.slice_s == 3600
    assert plan.start == datetime(2023, 6, 1, tzinfo=UTC).timestamp()
    assert set(plan.totals) == set(PLAN_NAMES)
    assert len(plan.pools) == 14  # every pool of regions/ that serves llama-3.1-8b
    for pool in plan.pools:
        assert [s.start for s in pool.slices] == [plan.start + 3600 * k for k in range(24)]
        for s in pool.slices:
            assert 0 <= s.min_replicas <= s.max_replicas <= pool.fixed_replicas
            assert s.figures["fixed"].min_replicas == pool.fixed_replicas
    warm = [sum(p.slices[k].min_replicas for p in plan.pools) for k in range(24)]
    assert all(w >= 1 for w in warm), warm  # the trace's 5.5 requests/s are always served warm
    assert plan.totals["planned"].unserved_rps_max == 0
    assert plan.totals["planned"].warm_gpu_hours < plan.totals["fixed"].warm_gpu_hours
    # The file is what its JSON Schema says.
    schema = plan_json_schema()
    assert set(schema["required"]) <= set(raw)
    assert set(raw) == set(schema["properties"])


@pytest.mark.timeout(120)
def test_the_schedule_applies_by_time_of_day_on_any_day(shipped_plan: tuple[Path, Path]) -> None:
    plan = read_plan(shipped_plan[0])
    schedule = load_schedule(shipped_plan[0])
    pool = max(plan.pools, key=lambda p: sum(s.min_replicas for s in p.slices))
    for day in (datetime(2023, 6, 1, tzinfo=UTC), datetime(2023, 9, 14, tzinfo=UTC)):
        for hour in (0, 5, 23):
            t = day.timestamp() + hour * 3600 + 1800
            expected = (pool.slices[hour].min_replicas, pool.slices[hour].max_replicas)
            assert warm_replicas_at(schedule, pool.region, pool.pool, t) == expected
            assert target_ongoing_requests_at(schedule, pool.region, pool.pool, t) == \
                pool.slices[hour].target_ongoing_requests
    with pytest.raises(KeyError, match="no pool nowhere/none"):
        warm_replicas_at(schedule, "nowhere", "none", plan.start)


@pytest.mark.timeout(120)
def test_autoscaling_windows_cover_the_day_in_ray_serve_field_names(shipped_plan: tuple[Path, Path]) -> None:
    plan = read_plan(shipped_plan[0])
    document = yaml.safe_load(shipped_plan[1].read_text(encoding="utf-8"))
    for pool in plan.pools:
        deployment = document["regions"][pool.region]["pools"][pool.pool]
        assert deployment["model"] == plan.model
        windows = deployment["windows"]
        assert windows[0]["start"] == "00:00" and windows[-1]["end"] == "24:00"
        assert all(a["end"] == b["start"] for a, b in itertools.pairwise(windows))
        for window in windows:
            settings = window["autoscaling"]
            assert set(settings) == {"min_replicas", "max_replicas", "target_ongoing_requests"}
            assert settings["max_replicas"] >= 1 and settings["min_replicas"] <= settings["max_replicas"]
            hour = int(window["start"][:2])
            assert settings["min_replicas"] == pool.slices[hour].min_replicas


def test_a_bad_plan_file_is_refused_with_field_and_value(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 2}), encoding="utf-8")
    with pytest.raises(PlanError, match=r"plan\.json: schema_version: Input should be 1, got 2"):
        read_plan(path)


@pytest.mark.timeout(120)
def test_a_plan_applies_to_a_day_it_was_not_made_for(shipped_plan: tuple[Path, Path]) -> None:
    plan = read_plan(shipped_plan[0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--trace", "conv", "--day", "2023-09-14", "--json", "--apply", str(shipped_plan[0]),
                     "--regions", str(ROOT / "regions"), "--policies", str(ROOT / "policies")])
    assert code == 0
    comparison = json.loads(out.getvalue())
    assert comparison["day"] == "2023-09-14" and comparison["applied"] == "2023-06-01"
    applied = comparison["totals"]["applied (2023-06-01)"]
    # The same replicas by time of day, so the same warm GPU-hours; another day's grid.
    assert applied["warm_gpu_hours"] == plan.totals["planned"].warm_gpu_hours
    assert applied["gco2e_actual"] != plan.totals["planned"].gco2e_actual
    assert set(comparison["totals"]) == {"applied (2023-06-01)", *PLAN_NAMES}


def test_equal_neighbouring_slices_merge_into_one_window() -> None:
    start = datetime(2023, 6, 1, tzinfo=UTC).timestamp()
    sizes = ((1, 2),) * 6 + ((3, 4),) * 12 + ((1, 2),) * 6
    schedule = DailySchedule(start, 3600.0, 24, MappingProxyType({("r", "p"): sizes}),
                             MappingProxyType({("r", "p"): (8.0,) * 24}))
    assert autoscaling_windows(schedule, "r", "p") == (
        AutoscalingWindow("00:00", "06:00", 1, 2, 8.0),
        AutoscalingWindow("06:00", "18:00", 3, 4, 8.0),
        AutoscalingWindow("18:00", "24:00", 1, 2, 8.0),
    )
    assert warm_replicas_at(schedule, "r", "p", start - 1) == (1, 2)  # 23:59:59 the day before
    assert warm_replicas_at(schedule, "r", "p", start + 6 * 3600) == (3, 4)
