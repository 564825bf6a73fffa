"""Residency filter: the region's jurisdiction is one the request allows.

keep c  iff  request.allowed_jurisdictions is empty or c.region.jurisdiction in it
Reads: request.allowed_jurisdictions, region.jurisdiction. Never relaxed, by anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import BoolArray
from scheduler.framework.plugin import Reason, RequestView

TYPE = "residency-filter"


@dataclass(frozen=True)
class ResidencyFilter:
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView) -> BoolArray | None:
        allowed = view.request.allowed_jurisdictions
        if not allowed:
            return None
        masks = view.cols.jurisdiction
        keep = np.zeros(len(view.base), dtype=bool)
        for jurisdiction in allowed:
            mask = masks.get(jurisdiction)
            if mask is not None:
                keep |= mask
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        return "jurisdiction {} not in {}", (c.region.jurisdiction, sorted(view.request.allowed_jurisdictions))
