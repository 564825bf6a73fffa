"""A routing policy as decisions read it: plain, frozen, slotted objects.

``scheduler.config.compile`` makes a ``Policy`` from a validated policy file
(``config.schema.PolicyConfig``); the fields keep the file's names and meanings (the schema
documents each, with its bounds and defaults). Like ``scheduler.fleet``, this module imports
nothing of the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.rates import ClassRates, Rate


@dataclass(frozen=True, slots=True)
class PluginRef:
    """A plugin of the registry, by its TYPE, with its (checked) parameters."""

    type: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ScorerTerm:
    """One term of the objective: the scorer's quantity times ``rate`` (USD per its unit)."""

    type: str
    parameters: Mapping[str, Any]
    rate: Rate | ClassRates

    def rate_for(self, workload_class: str) -> Rate:
        return self.rate.of(workload_class)


@dataclass(frozen=True, slots=True)
class MaxAge:
    """How old each kind of live signal may be (seconds) before it is not used."""

    carbon: float
    region_state: float
    price: float
    prefix_cache: float
    forecast: float


@dataclass(frozen=True, slots=True)
class StaleBounds:
    carbon_window: float


@dataclass(frozen=True, slots=True)
class Fallback:
    scorers: tuple[ScorerTerm, ...]


@dataclass(frozen=True, slots=True)
class UnknownRegionState:
    stale: str  # unhealthy | assume-healthy
    missing: str
    missing_warmup: float


@dataclass(frozen=True, slots=True)
class SloClass:
    ttft_ms: float
    ttft_ms_per_1k_prompt_tokens: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class SloDefaults:
    interactive: SloClass
    batch: SloClass
    deferrable: SloClass


@dataclass(frozen=True, slots=True)
class AttainmentBounds:
    min: float | None
    max_drop: float | None


@dataclass(frozen=True, slots=True)
class RateBounds:
    max: float | None
    max_rise: float | None


@dataclass(frozen=True, slots=True)
class PerRequestBounds:
    max: float | None
    max_ratio: float | None


@dataclass(frozen=True, slots=True)
class CanaryRollback:
    window: float
    min_requests: int
    ttft_slo_attainment: AttainmentBounds | None
    error_rate: RateBounds | None
    retry_rate: RateBounds | None
    energy_j_per_request: PerRequestBounds | None
    gco2e_per_request: PerRequestBounds | None


@dataclass(frozen=True, slots=True)
class Canary:
    arm: str
    fraction: float
    assign_by: str  # tenant | request_id
    rollback: CanaryRollback


@dataclass(frozen=True, slots=True)
class QualityPoint:
    max_tokens: int
    quality: float


@dataclass(frozen=True, slots=True)
class OutputBudgetTable:
    model: str
    task_class: str
    quality: tuple[QualityPoint, ...]

    def points(self) -> tuple[tuple[int, float], ...]:
        return tuple((p.max_tokens, p.quality) for p in self.quality)


@dataclass(frozen=True, slots=True)
class OutputBudget:
    mode: str  # suggest | enforce
    tables: tuple[OutputBudgetTable, ...]

    def table(self, model: str, task_class: str | None) -> OutputBudgetTable | None:
        if task_class is None:
            return None
        return next((t for t in self.tables if t.model == model and t.task_class == task_class), None)


@dataclass(frozen=True, slots=True)
class GatePass:
    pool: str  # region/pool
    measurement_sha256: str
    note: str


@dataclass(frozen=True, slots=True)
class TelemetryGate:
    modelled_only: str  # allow | canary-only
    passed: tuple[GatePass, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    scorers: tuple[ScorerTerm, ...]
    matchers: tuple[PluginRef, ...]
    max_age: MaxAge
    stale_bounds: StaleBounds
    fallback: Fallback
    unknown_region_state: UnknownRegionState
    slo: SloDefaults
    sensitive_task_classes: tuple[str, ...]
    critical_workload_classes: tuple[str, ...]
    precision_floor: Mapping[str, str]
    output_budget: OutputBudget | None
    prefix_key_tokens: int
    chat_default_max_tokens: int
    canary: Canary | None
    embodied_in_carbon: bool
    telemetry_gate: TelemetryGate | None

    def slo_for(self, workload_class: str) -> SloClass:
        slo: SloClass = getattr(self.slo, workload_class)
        return slo
