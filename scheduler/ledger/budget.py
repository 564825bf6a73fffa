"""Per-tenant monthly budgets: a soft limit (warn, count) and a hard limit (refuse new work,
except workload classes the policy marks critical). Loaded from YAML:

    tenants:
      acme: {soft_kwh: 800, hard_kwh: 1000, hard_kg_co2e: 250}

Errors name the file, the field path and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scheduler.units import J_PER_KWH

Level = Literal["ok", "soft", "hard"]


@dataclass(frozen=True, slots=True)
class TenantBudget:
    soft_energy_j: float | None = None
    hard_energy_j: float | None = None
    soft_carbon_g: float | None = None
    hard_carbon_g: float | None = None

    def level(self, energy_j: float, carbon_g: float) -> tuple[Level, str, float, float]:
        """The highest limit reached: (level, what, used, limit); ("ok", "", 0, 0) if none."""
        checks = (
            ("hard", "energy_j", energy_j, self.hard_energy_j),
            ("hard", "carbon_g", carbon_g, self.hard_carbon_g),
            ("soft", "energy_j", energy_j, self.soft_energy_j),
            ("soft", "carbon_g", carbon_g, self.soft_carbon_g),
        )
        for level, what, used, limit in checks:
            if limit is not None and used >= limit:
                return level, what, used, limit  # type: ignore[return-value]
        return "ok", "", 0.0, 0.0


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    tenant: str
    month: str
    energy_j: float
    carbon_g: float
    level: Level
    # Which limit was reached ("energy_j" / "carbon_g"), how much was used and the limit.
    limit_kind: str
    used: float
    limit: float
    # The workload class is critical: a hard limit does not block it.
    exempt: bool
    # The store was unreachable: usage is the last value read plus this router's queue.
    stale: bool


class _TenantLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    soft_kwh: float | None = Field(default=None, gt=0)
    hard_kwh: float | None = Field(default=None, gt=0)
    soft_kg_co2e: float | None = Field(default=None, gt=0)
    hard_kg_co2e: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> _TenantLimits:
        for soft, hard in ((self.soft_kwh, self.hard_kwh), (self.soft_kg_co2e, self.hard_kg_co2e)):
            if soft is not None and hard is not None and soft > hard:
                raise ValueError(f"soft limit {soft} is above the hard limit {hard}")
        return self


class _BudgetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tenants: dict[str, _TenantLimits]


class BudgetError(ValueError):
    def __init__(self, issues: list[str]) -> None:
        super().__init__("\n".join(issues))
        self.issues = issues


def parse_budgets(data: Any, path: str) -> Mapping[str, TenantBudget]:
    try:
        doc = _BudgetsFile.model_validate(data)
    except ValidationError as exc:
        raise BudgetError([
            f"{path}: {'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
            + ("" if isinstance(e.get("input"), dict) else f" (got {e.get('input')!r})")
            for e in exc.errors()
        ]) from None
    return MappingProxyType({
        tenant: TenantBudget(
            soft_energy_j=_scaled(t.soft_kwh, J_PER_KWH),
            hard_energy_j=_scaled(t.hard_kwh, J_PER_KWH),
            soft_carbon_g=_scaled(t.soft_kg_co2e, 1000.0),
            hard_carbon_g=_scaled(t.hard_kg_co2e, 1000.0),
        )
        for tenant, t in doc.tenants.items()
    })


def load_budgets(path: Path) -> Mapping[str, TenantBudget]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BudgetError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_budgets(data, str(path))


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor
