"""The planning assumptions file (``assumptions.yaml`` beside this module, or ``scheduler plan
--assumptions FILE``): parsed and validated with the config loader's steps (errors name the
file, the field path and the bad value), then compiled into a frozen ``Assumptions``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from scheduler.config.loader import parse, validate
from scheduler.config.schema import WORKLOAD_CLASS_NAMES, Duration, ModelName, Slug, Strict
from scheduler.units import DAY_S

SHIPPED_ASSUMPTIONS = Path(__file__).resolve().parent / "assumptions.yaml"

Share = Annotated[float, Field(ge=0.0, le=1.0)]


def _divides_a_day(seconds: float) -> float:
    slices = DAY_S / seconds
    if abs(slices - round(slices)) > 1e-9:
        raise ValueError(f"a slice must divide a day into whole slices, got {seconds:g} s ({slices:.3f} a day)")
    return seconds


class DemandAssumptions(Strict):
    rate: float | None = Field(gt=0)
    hourly_profile: tuple[Annotated[float, Field(ge=0)], ...] = Field(min_length=24, max_length=24)
    burst_window: Duration
    warm_quantile: float = Field(gt=0, le=1)
    max_quantile: float = Field(gt=0, le=1)
    max_headroom: float = Field(ge=1)
    classes: dict[str, Share]
    residency_share: Share

    @model_validator(mode="after")
    def _consistent(self) -> DemandAssumptions:
        unknown = sorted(set(self.classes) - set(WORKLOAD_CLASS_NAMES))
        if unknown:
            raise ValueError(f"classes: unknown workload class(es) {unknown} (known: {', '.join(WORKLOAD_CLASS_NAMES)})")
        total = sum(self.classes.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes: the shares must add up to 1, got {total:g} ({self.classes})")
        if self.max_quantile < self.warm_quantile:
            raise ValueError(f"max_quantile {self.max_quantile} is below warm_quantile {self.warm_quantile}")
        return self


class ServingAssumptions(Strict):
    target_utilisation: float = Field(gt=0, lt=1)
    min_replicas_per_pool: int = Field(ge=0)
    slo_target: Share


class ColdStartAssumptions(Strict):
    time: Duration
    power_share_of_tdp: Share


class CarbonAssumptions(Strict):
    forecast_error: float = Field(ge=0)
    replan_every: Annotated[Duration, AfterValidator(_divides_a_day)]
    keep_warm_lookahead: Duration


class AssumptionsFile(Strict):
    model: ModelName
    policy: Slug
    slice: Annotated[Duration, AfterValidator(_divides_a_day)]
    demand: DemandAssumptions
    serving: ServingAssumptions
    cold_start: ColdStartAssumptions
    carbon: CarbonAssumptions

    @model_validator(mode="after")
    def _replan_on_slices(self) -> AssumptionsFile:
        if self.carbon.replan_every < self.slice or abs(self.carbon.replan_every / self.slice
                                                        - round(self.carbon.replan_every / self.slice)) > 1e-9:
            raise ValueError(f"carbon.replan_every ({self.carbon.replan_every:g} s) must be a whole number of "
                             f"slices ({self.slice:g} s)")
        return self


@dataclass(frozen=True)
class Assumptions:
    """The validated file, as plain values (durations in seconds)."""

    source: str
    model: str
    policy: str
    slice_s: float
    rate: float | None
    hourly_profile: tuple[float, ...]
    burst_window_s: float
    warm_quantile: float
    max_quantile: float
    max_headroom: float
    class_shares: tuple[tuple[str, float], ...]
    residency_share: float
    target_utilisation: float
    min_replicas_per_pool: int
    slo_target: float
    cold_start_s: float
    cold_start_power_share: float
    forecast_error: float
    replan_every_s: float
    keep_warm_lookahead_s: float

    @property
    def slices(self) -> int:
        return round(DAY_S / self.slice_s)

    def describe(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def load_assumptions(path: Path = SHIPPED_ASSUMPTIONS) -> Assumptions:
    """Read, validate and compile ``path``; a ``ConfigError`` lists every problem found."""
    raw = validate(AssumptionsFile, parse(path), str(path))
    d, s, c = raw.demand, raw.serving, raw.carbon
    return Assumptions(
        source=str(path),
        model=raw.model,
        policy=raw.policy,
        slice_s=raw.slice,
        rate=d.rate,
        hourly_profile=tuple(d.hourly_profile),
        burst_window_s=d.burst_window,
        warm_quantile=d.warm_quantile,
        max_quantile=d.max_quantile,
        max_headroom=d.max_headroom,
        class_shares=tuple((name, d.classes.get(name, 0.0)) for name in WORKLOAD_CLASS_NAMES),
        residency_share=d.residency_share,
        target_utilisation=s.target_utilisation,
        min_replicas_per_pool=s.min_replicas_per_pool,
        slo_target=s.slo_target,
        cold_start_s=raw.cold_start.time,
        cold_start_power_share=raw.cold_start.power_share_of_tdp,
        forecast_error=c.forecast_error,
        replan_every_s=c.replan_every,
        keep_warm_lookahead_s=c.keep_warm_lookahead,
    )
