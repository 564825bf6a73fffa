"""Model filter: the pool serves the requested model at an acceptable precision.

candidates = the deployments of request.model (scheduler.plugins.filters.model_index), then
keep c  iff  (request.precision is None
              ? rank(c.deployment.precision) >= rank(policy.precision_floor.get(request.workload_class, "bf16"))
              : c.deployment.precision == request.precision)
        and  (request.task_class not in policy.sensitive_task_classes or rank(c.deployment.precision) >= rank("bf16"))
A request naming no precision runs at bf16 or better unless the policy lets its class go lower for energy
(``precision_floor``); one naming a precision gets exactly it; a sensitive task class never runs below bf16.
Reads: request.precision, .workload_class, .task_class, policy.precision_floor, .sensitive_task_classes, precisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.energy.model_catalogue import PRECISION_RANK
from scheduler.framework.columns import BoolArray, FloatArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "model-filter"
REFERENCE_RANK = PRECISION_RANK["bf16"]


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("precision_rank", "precision")
    precision_rank: FloatArray
    lowest_rank: float  # the least faithful precision any candidate serves at (a floor at or below it keeps all)
    precision: Mapping[str, BoolArray]  # precision name -> which candidates serve at it


@dataclass(frozen=True)
class ModelAvailableFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        cands = fleet.candidates
        precisions = {c.deployment.precision for c in cands}
        return Columns(np.asarray([PRECISION_RANK[c.deployment.precision] for c in cands], dtype=np.float64),
                       float(min((PRECISION_RANK[p] for p in precisions), default=REFERENCE_RANK)),
                       {p: np.asarray([c.deployment.precision == p for c in cands], dtype=bool) for p in precisions})

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        request = view.request
        floor = _floor_rank(view) if request.precision is None else -1
        if request.task_class is not None and _sensitive(view):
            floor = max(floor, REFERENCE_RANK)
        if request.precision is None and floor <= cols.lowest_rank:
            return None  # every candidate serves at the floor or better (the common case)
        keep = np.ones(len(view.base), dtype=bool)
        if request.precision is not None:
            keep &= cols.precision.get(request.precision, False)
        if floor > 0:
            keep &= cols.precision_rank >= floor
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c, request = view.snapshot.candidates[view.base[position]], view.request
        precision = c.deployment.precision
        if request.precision is not None and precision != request.precision:
            return "{} at {}, not the requested {}", (c.deployment.name, precision, request.precision)
        if _sensitive(view):
            return "task class {} may not run at reduced precision {}", (request.task_class, precision)
        floor = view.snapshot.policy.precision_floor.get(request.workload_class, "bf16")
        return "{} at {}, below the {} class's precision floor {}", (c.deployment.name, precision, request.workload_class, floor)


def _floor_rank(view: RequestView) -> int:  # of the least faithful precision this request's class may run at
    return PRECISION_RANK[view.snapshot.policy.precision_floor.get(view.request.workload_class, "bf16")]


def _sensitive(view: RequestView) -> bool:
    return view.request.task_class in view.snapshot.policy.sensitive_task_classes
