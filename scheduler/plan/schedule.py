"""The plan file and the daily schedule of warm replicas it holds.

A plan covers one day in ``slices`` equal time slices from ``start`` (UTC midnight of the day
it was made for). It is a **daily** schedule: applied to another day, slice k holds from the
same UTC time of day, so ``warm_replicas_at(schedule, region, pool, t)`` looks at t's time
since ``start`` modulo the plan's span. Each pool's slice says how many replicas Ray Serve's
autoscaler keeps at least (``min_replicas``: warm all slice long) and may grow to
(``max_replicas``), and the per-replica load it scales at (``target_ongoing_requests``).

The file (``scheduler plan --json``; ``PlanFile`` is its schema, ``plan_json_schema()`` the
JSON Schema) is read at the edge with pydantic and compiled into a frozen ``DailySchedule``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION: Literal[1] = 1
# The sizings a plan compares: its own, each pool's largest planned size all day, the region files' counts.
PlanName = Literal["planned", "flat", "fixed"]
PLAN_NAMES: tuple[PlanName, ...] = ("planned", "flat", "fixed")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SliceFigures(_Strict):
    """What one plan is expected to cost and deliver on one pool in one slice."""

    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=0)
    demand_rps: float = Field(ge=0, description="mean requests/s the pool is expected to serve")
    batch: float = Field(ge=0, description="expected running sequences per replica a request meets (itself included)")
    energy_j: float = Field(ge=0, description="requests + idle + cold starts, at the GPUs (before PUE)")
    gco2e: float = Field(ge=0, description="energy x PUE x the forecast intensity of the slice")
    gco2e_actual: float = Field(ge=0, description="the same at the slice's true intensity (hindsight)")
    usd: float = Field(ge=0, description="energy x PUE x the region's electricity price")
    slo_attainment: float = Field(ge=0, le=1, description="expected share of its requests within the TTFT SLO")
    cold_starts: int = Field(ge=0, description="replicas started at the slice's start")


class PoolSlice(_Strict):
    start: float = Field(description="epoch seconds (UTC) the slice starts on the plan's day")
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=0)
    target_ongoing_requests: float = Field(gt=0)
    figures: dict[PlanName, SliceFigures]

    @model_validator(mode="after")
    def _ordered(self) -> PoolSlice:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} is below min_replicas {self.min_replicas}")
        return self


class PoolPlan(_Strict):
    region: str
    pool: str
    gpu: str
    gpus_per_replica: int = Field(ge=1)
    fixed_replicas: int = Field(ge=0, description="the pool's replicas in its region file (count / tensor_parallel)")
    slices: tuple[PoolSlice, ...] = Field(min_length=1)


class RegionIntensity(_Strict):
    region: str
    grid_zone: str
    pue: float
    price_per_kwh: float
    forecast_g_per_kwh: tuple[float, ...] = Field(description="per slice, as the planner saw it")
    actual_g_per_kwh: tuple[float, ...]


class Totals(_Strict):
    energy_j: float
    gco2e: float
    gco2e_actual: float
    usd: float
    slo_attainment: float = Field(ge=0, le=1)
    requests: float
    unserved_rps_max: float = Field(ge=0, description="the largest demand in any slice no pool had room for")
    warm_gpu_hours: float
    cold_starts: int


class DemandSlice(_Strict):
    start: float
    mean_rps: dict[str, float] = Field(description="per workload class")
    warm_rps: float = Field(description="all classes, at the warm quantile of the burst windows")
    peak_rps: float = Field(description="all classes, at the max quantile times the headroom")


class PlanFile(_Strict):
    """``scheduler plan --json``."""

    schema_version: Literal[1]
    day: str
    start: float
    slice_s: float = Field(gt=0)
    slices: int = Field(ge=1)
    model: str
    policy: str
    trace: str
    assumptions: dict[str, Any]
    demand: tuple[DemandSlice, ...]
    regions: tuple[RegionIntensity, ...]
    pools: tuple[PoolPlan, ...] = Field(min_length=1)
    totals: dict[PlanName, Totals]

    @model_validator(mode="after")
    def _one_slice_each(self) -> PlanFile:
        for pool in self.pools:
            if len(pool.slices) != self.slices:
                raise ValueError(f"pool {pool.region}/{pool.pool} has {len(pool.slices)} slices, the plan {self.slices}")
        return self


def plan_json_schema() -> dict[str, Any]:
    return PlanFile.model_json_schema()


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class DailySchedule:
    """Per (region, pool): (min_replicas, max_replicas) of each slice, repeating every
    ``slice_s x slices`` seconds from ``start``."""

    start: float
    slice_s: float
    slices: int
    replicas: Mapping[tuple[str, str], tuple[tuple[int, int], ...]]
    target_ongoing_requests: Mapping[tuple[str, str], tuple[float, ...]]

    def slice_index(self, t: float) -> int:
        """The slice that holds ``t`` (any day: time since ``start`` modulo the span)."""
        span_s = self.slice_s * self.slices
        # min: a float remainder a hair below the span must not index past the last slice
        return min(int(((t - self.start) % span_s) // self.slice_s), self.slices - 1)


def schedule_from(plan: PlanFile) -> DailySchedule:
    replicas = {(p.region, p.pool): tuple((s.min_replicas, s.max_replicas) for s in p.slices) for p in plan.pools}
    targets = {(p.region, p.pool): tuple(s.target_ongoing_requests for s in p.slices) for p in plan.pools}
    return DailySchedule(plan.start, plan.slice_s, plan.slices, MappingProxyType(replicas), MappingProxyType(targets))


def read_plan(path: Path) -> PlanFile:
    """The plan file at ``path``; a PlanError names the file, the field and the bad value."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return PlanFile.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise PlanError(f"{path}: {where}: {first['msg']}, got {first.get('input')!r}"
                        f" ({exc.error_count()} problem(s); `scheduler plan --json` writes this file)") from None


def load_schedule(path: Path) -> DailySchedule:
    return schedule_from(read_plan(path))


def warm_replicas_at(schedule: DailySchedule, region: str, pool: str, t: float) -> tuple[int, int]:
    """(min_replicas, max_replicas) the plan gives ``region``/``pool`` at epoch time ``t``."""
    slices = schedule.replicas.get((region, pool))
    if slices is None:
        known = ", ".join(f"{r}/{p}" for r, p in schedule.replicas)
        raise KeyError(f"the plan has no pool {region}/{pool} (planned: {known})")
    return slices[schedule.slice_index(t)]


def target_ongoing_requests_at(schedule: DailySchedule, region: str, pool: str, t: float) -> float:
    """The per-replica load Ray Serve's autoscaler aims at on ``region``/``pool`` at ``t``."""
    warm_replicas_at(schedule, region, pool, t)  # the same KeyError for a pool the plan lacks
    return schedule.target_ongoing_requests[(region, pool)][schedule.slice_index(t)]


@dataclass(frozen=True)
class AutoscalingWindow:
    """A time-of-day window (UTC, ``[start, end)``) and the autoscaling settings that hold in it."""

    start: str
    end: str
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float


def autoscaling_windows(schedule: DailySchedule, region: str, pool: str) -> tuple[AutoscalingWindow, ...]:
    """The pool's slices, consecutive equal ones merged, as time-of-day windows."""
    slices = schedule.replicas[(region, pool)]
    targets = schedule.target_ongoing_requests[(region, pool)]
    windows: list[AutoscalingWindow] = []
    first = 0
    for k in range(1, len(slices) + 1):
        if k < len(slices) and slices[k] == slices[first] and targets[k] == targets[first]:
            continue
        low, high = slices[first]
        windows.append(AutoscalingWindow(_clock(schedule, first), _clock(schedule, k), low, high, targets[first]))
        first = k
    return tuple(windows)


def _clock(schedule: DailySchedule, k: int) -> str:
    """HH:MM (UTC) at which slice k starts; the span's end is 24:00."""
    seconds = round(k * schedule.slice_s)
    if seconds >= 86400:
        return "24:00"
    return datetime.fromtimestamp(schedule.start + seconds, tz=UTC).strftime("%H:%M")


def autoscaling_document(plan: PlanFile) -> dict[str, Any]:
    """Per region and pool, the planned model's deployment's autoscaling windows in Ray
    Serve's field names (``min_replicas``, ``max_replicas``, ``target_ongoing_requests``). Ray Serve needs
    max_replicas >= 1: where the plan gives a pool none, the window says min 0, max 1 (at zero,
    woken only by a request the router still sends there)."""
    schedule = schedule_from(plan)
    regions: dict[str, Any] = {}
    for p in plan.pools:
        windows = [
            {"start": w.start, "end": w.end,
             "autoscaling": {"min_replicas": w.min_replicas, "max_replicas": max(1, w.max_replicas),
                             "target_ongoing_requests": w.target_ongoing_requests}}
            for w in autoscaling_windows(schedule, p.region, p.pool)
        ]
        regions.setdefault(p.region, {"pools": {}})["pools"][p.pool] = {"model": plan.model, "windows": windows}
    return {"plan": {"day": plan.day, "model": plan.model, "policy": plan.policy, "trace": plan.trace,
                     "timezone": "UTC"},
            "regions": regions}


def dump_plan(plan: PlanFile) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2)
