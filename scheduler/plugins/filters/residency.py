"""Residency filter: the region's jurisdiction is one the request allows.

keep c  iff  request.allowed_jurisdictions is empty or c.region.jurisdiction in it
Reads: request.allowed_jurisdictions, region.jurisdiction (static columns). Never relaxed,
by anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "residency-filter"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("jurisdiction",)
    # jurisdiction -> which candidates' regions are in it
    jurisdiction: Mapping[str, BoolArray]


@dataclass(frozen=True)
class ResidencyFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        cands = fleet.candidates
        return Columns({j: np.asarray([c.region.jurisdiction == j for c in cands], dtype=bool)
                        for j in {c.region.jurisdiction for c in cands}})

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        allowed = view.request.allowed_jurisdictions
        if not allowed:
            return None
        if len(allowed) == 1:
            # One jurisdiction (the common case): its column itself (the framework never
            # writes into a mask a filter returns).
            (only,) = allowed
            mask = cols.jurisdiction.get(only)
            return mask if mask is not None else np.zeros(len(view.base), dtype=bool)
        keep = np.zeros(len(view.base), dtype=bool)
        for jurisdiction in allowed:
            mask = cols.jurisdiction.get(jurisdiction)
            if mask is not None:
                keep |= mask
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        return "jurisdiction {} not in {}", (c.region.jurisdiction, sorted(view.request.allowed_jurisdictions))
