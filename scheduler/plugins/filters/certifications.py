"""Certification filter: the region holds every certification the request requires.

keep c  iff  request.required_certifications is a subset of c.region.certifications
Reads: request.required_certifications, region.certifications (static columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "certification-filter"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("certification",)
    # certification -> which candidates' regions hold it
    certification: Mapping[str, BoolArray]


@dataclass(frozen=True)
class CertificationFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        cands = fleet.candidates
        held = {cert for c in cands for cert in c.region.certifications}
        return Columns({k: np.asarray([k in c.region.certifications for c in cands], dtype=bool) for k in held})

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        required = view.request.required_certifications
        if not required:
            return None
        keep = np.ones(len(view.base), dtype=bool)
        for certification in required:
            mask = cols.certification.get(certification)
            if mask is None:
                return np.zeros(len(view.base), dtype=bool)
            keep &= mask
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        c = view.snapshot.candidates[view.base[position]]
        missing = sorted(view.request.required_certifications.difference(c.region.certifications))
        return "lacks certification {}", (", ".join(missing),)
