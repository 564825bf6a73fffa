"""Model filter: the pool serves the requested model at an acceptable precision.

candidates = the deployments of request.model (the framework's per-snapshot index), then
keep c  iff  (request.precision is None or c.deployment.precision == request.precision)
        and  (request.task_class not in policy.sensitive_task_classes
              or rank(c.deployment.precision) >= rank("bf16"))
One rejection per pool that serves no deployment of the model (not one per other model).
Reads: request.model, request.precision, request.task_class, policy.sensitive_task_classes,
the deployments' precisions (static columns).
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
            precision={p: np.asarray([c.deployment.precision == p for c in cands], dtype=bool) for p in precisions},
        )

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        request = view.request
        sensitive = _sensitive(view)
        if request.precision is None and not sensitive:
            return None
        keep = np.ones(len(view.base), dtype=bool)
        if request.precision is not None:
            served = cols.precision.get(request.precision)
            keep &= served if served is not None else False
        if sensitive:
            keep &= cols.precision_rank >= REFERENCE_RANK
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        precision = c.deployment.precision
        if view.request.precision is not None and precision != view.request.precision:
            return "{} at {}, not the requested {}", (c.deployment.name, precision, view.request.precision)
        return "task class {} may not run at reduced precision {}", (view.request.task_class, precision)


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


def _sensitive(view: RequestView) -> bool:
    task = view.request.task_class
    return task is not None and task in view.snapshot.policy.sensitive_task_classes
