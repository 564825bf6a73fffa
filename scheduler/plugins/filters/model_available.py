"""Model filter: the pool serves the requested model at an acceptable precision.

candidates = the deployments of request.model (a per-snapshot index), then
keep c  iff  (request.precision is None or c.deployment.precision == request.precision)
        and  (request.task_class not in policy.sensitive_task_classes
              or rank(c.deployment.precision) >= rank("bf16"))
One rejection per pool that serves no deployment of the model (not one per other model).
Reads: request.model, request.precision, request.task_class, policy.sensitive_task_classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.energy.models import PRECISION_RANK
from scheduler.framework.arrays import BoolArray, IndexArray
from scheduler.framework.plugin import Reason, RequestView
from scheduler.types import Candidate, FleetSnapshot, Rejection, Request

TYPE = "model-filter"
REFERENCE_RANK = PRECISION_RANK["bf16"]
_NONE: IndexArray = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True)
class ModelAvailableFilter:
    TYPE: ClassVar[str] = TYPE

    def select(self, request: Request, snapshot: FleetSnapshot) -> tuple[IndexArray, list[Rejection]]:
        model = request.model
        arrays = snapshot.arrays
        rejected = [
            Rejection(first, TYPE, "serves no {} (serves {})", (model, _served_by(snapshot, first)))
            for first in arrays.cache.pools_lacking(snapshot, model)
        ]
        return arrays.by_model.get(model, _NONE), rejected

    def keep(self, view: RequestView) -> BoolArray | None:
        request = view.request
        sensitive = _sensitive(view)
        if request.precision is None and not sensitive:
            return None
        candidates = view.snapshot.candidates
        keep = np.ones(len(view.base), dtype=bool)
        if request.precision is not None:
            keep &= np.asarray([candidates[i].deployment.precision == request.precision for i in view.base.tolist()])
        if sensitive:
            keep &= view.cols.precision_rank >= REFERENCE_RANK
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        precision = c.deployment.precision
        if view.request.precision is not None and precision != view.request.precision:
            return "{} at {}, not the requested {}", (c.deployment.name, precision, view.request.precision)
        return "task class {} may not run at reduced precision {}", (view.request.task_class, precision)


def _served_by(snapshot: FleetSnapshot, first: Candidate) -> str:
    return ", ".join(
        c.deployment.name for c in snapshot.candidates if c.region is first.region and c.pool is first.pool
    )


def _sensitive(view: RequestView) -> bool:
    task = view.request.task_class
    return task is not None and task in view.snapshot.policy.sensitive_task_classes
