"""The policy the canary arm decides under: the arm's objective, the control's hard limits.

A canary changes how the survivors are ranked, never which candidates survive. The arm policy
is the control policy with the arm's objective put in:

- the arm's: ``name``, ``description``, ``scorers`` (and their rates), ``matchers``,
  ``fallback``, and how old the carbon and price signals may be (``max_age.carbon``,
  ``max_age.price``: when its scorers abstain);
- the stricter of the two: ``sensitive_task_classes`` (the union: a class sensitive to either
  runs at full precision on both arms) and ``precision_floor`` (per workload class, the more
  faithful precision);
- the control's, everything else: what the hard filters read (``max_age.region_state`` and
  ``unknown_region_state`` for region health and pools served, which the snapshot's live state
  was judged fresh by too; ``slo`` for the SLO filter, and the TTFT SLO both arms are measured
  against), the budget exemptions (``critical_workload_classes``: admission runs before the arm
  decides), and any field added to policies later;
- no ``canary`` (an arm has none of its own; the loader refuses one).

So a request the control would refuse a pool for (a medical prompt on a quantized pool, a
region outside its jurisdictions, a region down, a pool too slow for its SLO) is refused that
pool on the canary arm too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from scheduler.energy.model_catalogue import PRECISION_RANK
from scheduler.policy import Policy
from scheduler.types import WORKLOAD_CLASSES

# What the arm brings: its objective. Everything else is the control's (or the stricter).
OBJECTIVE_FIELDS = ("name", "description", "scorers", "matchers", "fallback")
# The precision a workload class without a floor runs at or above (scheduler.plugins.filters.model_available).
DEFAULT_FLOOR = "bf16"


def _stricter_floors(control: Mapping[Any, str], arm: Mapping[Any, str]) -> dict[str, str]:
    floors: dict[str, str] = {}
    for klass in WORKLOAD_CLASSES:
        if klass not in control and klass not in arm:
            continue
        ours, theirs = control.get(klass, DEFAULT_FLOOR), arm.get(klass, DEFAULT_FLOOR)
        floors[klass] = ours if PRECISION_RANK[ours] >= PRECISION_RANK[theirs] else theirs
    return floors


def arm_policy(control: Policy, arm: Policy) -> Policy:
    """``control`` with ``arm``'s objective (and the stricter of their hard limits)."""
    update: dict[str, Any] = {name: getattr(arm, name) for name in OBJECTIVE_FIELDS}
    update["max_age"] = dataclasses.replace(control.max_age, carbon=arm.max_age.carbon, price=arm.max_age.price)
    update["sensitive_task_classes"] = tuple(dict.fromkeys((*control.sensitive_task_classes,
                                                            *arm.sensitive_task_classes)))
    update["precision_floor"] = MappingProxyType(_stricter_floors(control.precision_floor, arm.precision_floor))
    update["canary"] = None
    return dataclasses.replace(control, **update)


def replaced_limits(control: Policy, arm: Policy) -> list[str]:
    """The fields of the arm's own file that it does not decide under (to log them once)."""
    effective = arm_policy(control, arm)
    replaced = ["max_age.region_state"] if arm.max_age.region_state != effective.max_age.region_state else []
    for name in (f.name for f in dataclasses.fields(Policy)):
        if name in (*OBJECTIVE_FIELDS, "max_age", "canary"):
            continue
        if getattr(arm, name) != getattr(effective, name):
            replaced.append(name)
    return replaced
