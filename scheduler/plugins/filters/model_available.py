"""Model filter: the pool serves the requested model at an acceptable precision.

candidates = the deployments of request.model (the framework's per-snapshot index), then
keep c  iff  (request.precision is None
              ? rank(c.deployment.precision) >= rank(policy.precision_floor.get(request.workload_class, "bf16"))
              : c.deployment.precision == request.precision)
        and  (request.task_class not in policy.sensitive_task_classes
              or rank(c.deployment.precision) >= rank("bf16"))
A request that names no precision runs at bf16 or better unless the policy lets its workload
class go lower for energy (``precision_floor``); one that names a precision gets exactly it; a
sensitive task class never runs below bf16, whatever it asks and whatever the policy says.
One rejection per pool that serves no deployment of the model (not one per other model).
Reads: request.model, request.precision, request.workload_class, request.task_class,
policy.precision_floor, policy.sensitive_task_classes, the deployments' precisions (static columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.energy.models import PRECISION_RANK
from scheduler.framework.columns import BoolArray, FloatArray, IndexArray, by_model, memo
from scheduler.framework.plugin import Lifetime, Plugin, Reason, RequestView
from scheduler.types import Candidate, FleetSnapshot, Rejection, Request

TYPE = "model-filter"
REFERENCE_RANK = PRECISION_RANK["bf16"]
_NONE: IndexArray = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True)
class Columns:
    precision_rank: FloatArray
    # The least faithful precision any candidate serves at (a floor at or below it keeps all).
    lowest_rank: float
    # precision name -> which candidates serve at it
    precision: Mapping[str, BoolArray]


@dataclass(frozen=True)
class ModelAvailableFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    LIFETIME: ClassVar[Lifetime | None] = "static"

    def select(self, request: Request, snapshot: FleetSnapshot) -> tuple[IndexArray, tuple[Rejection, ...]]:
        model = request.model
        cache = snapshot.column_cache
        entry = cache.get(("model-select", model))
        if isinstance(entry, tuple) and entry[0] is snapshot.candidates:
            selected: tuple[IndexArray, tuple[Rejection, ...]] = entry[1]
            return selected
        selected = by_model(snapshot).get(model, _NONE), _rejections(snapshot, model)
        if len(selected[0]):  # once per served model (not per name a client sends)
            cache[("model-select", model)] = (snapshot.candidates, selected)
        return selected

    def prepare(self, snapshot: FleetSnapshot) -> Columns:
        cands = snapshot.candidates
        precisions = {c.deployment.precision for c in cands}
        return Columns(
            precision_rank=np.asarray([PRECISION_RANK[c.deployment.precision] for c in cands], dtype=np.float64),
            lowest_rank=float(min((PRECISION_RANK[p] for p in precisions), default=REFERENCE_RANK)),
            precision={p: np.asarray([c.deployment.precision == p for c in cands], dtype=bool) for p in precisions},
        )

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        request = view.request
        if request.precision is None and request.task_class is None and _floor_rank(view) <= cols.lowest_rank:
            return None  # the common case, as below: no precision asked, not a sensitive task class
        floor = REFERENCE_RANK if _sensitive(view) else -1
        if request.precision is None:
            floor = max(floor, _floor_rank(view))
            if floor <= cols.lowest_rank:
                return None
        keep = np.ones(len(view.base), dtype=bool)
        if request.precision is not None:
            served = cols.precision.get(request.precision)
            keep &= served if served is not None else False
        if floor > 0:
            keep &= cols.precision_rank >= floor
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        precision = c.deployment.precision
        if view.request.precision is not None and precision != view.request.precision:
            return "{} at {}, not the requested {}", (c.deployment.name, precision, view.request.precision)
        if _sensitive(view):
            return "task class {} may not run at reduced precision {}", (view.request.task_class, precision)
        floor = view.snapshot.policy.precision_floor.get(view.request.workload_class, "bf16")
        return "{} at {}, below the {} class's precision floor {}", (
            c.deployment.name, precision, view.request.workload_class, floor)


def _rejections(snapshot: FleetSnapshot, model: str) -> tuple[Rejection, ...]:
    """One rejection per pool that serves no deployment of ``model`` (once per candidate tuple)."""
    def compute() -> tuple[Rejection, ...]:
        pools: dict[tuple[str, str], list[Candidate]] = {}
        for c in snapshot.candidates:
            pools.setdefault((c.region.name, c.pool.name), []).append(c)
        return tuple(
            Rejection(pool[0], TYPE, "serves no {} (serves {})", (model, ", ".join(c.deployment.name for c in pool)))
            for pool in pools.values() if not any(c.deployment.name == model for c in pool)
        )

    rejections: tuple[Rejection, ...] = memo(snapshot, ("model-rejections", model), snapshot.candidates, compute)
    return rejections


def _floor_rank(view: RequestView) -> int:
    """The rank of the least faithful precision the policy lets this request's class run at."""
    return PRECISION_RANK[view.snapshot.policy.precision_floor.get(view.request.workload_class, "bf16")]


def _sensitive(view: RequestView) -> bool:
    task = view.request.task_class
    return task is not None and task in view.snapshot.policy.sensitive_task_classes
