"""Model index (the candidate source): the candidates serving the requested model, and one
rejection per pool that serves no deployment of it (not one per other model), under the model
filter's name (its precision rules then run as a filter, scheduler.plugins.filters.model_available).

candidates = the deployments of request.model
Reads: request.model, the candidates' models (once per fleet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import IndexArray, by_model
from scheduler.framework.plugin import Plugin
from scheduler.plugins.filters import model_available
from scheduler.types import FleetSnapshot, Rejection, Request

TYPE = model_available.TYPE
Selected = tuple[IndexArray, tuple[Rejection, ...]]
_NONE: IndexArray = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True)
class ModelIndex(Plugin):
    TYPE: ClassVar[str] = TYPE

    def prepare(self, fleet: FleetSnapshot) -> Mapping[str, Selected]:
        """Per served model: its candidates and rejections."""
        return {model: (index, _rejections(fleet, model)) for model, index in by_model(fleet.candidates).items()}

    def select(self, request: Request, snapshot: FleetSnapshot, served: Mapping[str, Selected]) -> Selected:
        selected = served.get(request.model)
        return (_NONE, _rejections(snapshot, request.model)) if selected is None else selected


def _rejections(snapshot: FleetSnapshot, model: str) -> tuple[Rejection, ...]:
    """One rejection per pool that serves no deployment of ``model``."""
    return tuple(Rejection(pool[0], TYPE, "serves no {} (serves {})", (model, ", ".join(c.deployment.name for c in pool)))
                 for pool in snapshot.pools if not any(c.deployment.name == model for c in pool))
