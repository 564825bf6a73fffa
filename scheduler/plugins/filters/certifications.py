"""Certification filter: the region holds every certification the request requires.

keep c  iff  request.required_certifications is a subset of c.region.certifications
Reads: request.required_certifications, region.certifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import BoolArray
from scheduler.framework.plugin import Reason, RequestView

TYPE = "certification-filter"


@dataclass(frozen=True)
class CertificationFilter:
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView) -> BoolArray | None:
        required = view.request.required_certifications
        if not required:
            return None
        masks = view.cols.certification
        keep = np.ones(len(view.base), dtype=bool)
        for certification in required:
            mask = masks.get(certification)
            if mask is None:
                return np.zeros(len(view.base), dtype=bool)
            keep &= mask
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        missing = sorted(view.request.required_certifications.difference(c.region.certifications))
        return "lacks certification {}", (", ".join(missing),)
