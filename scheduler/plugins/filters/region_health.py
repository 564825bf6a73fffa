"""Health filter: the region is up, as its last published live state says.

keep c  iff  live[region] is fresh (age <= policy.max_age.region_state) and healthy,
        or   it is stale and policy.unknown_region_state.stale == "assume-healthy",
        or   it was never seen and policy.unknown_region_state.missing == "assume-healthy"
Reads: the snapshot's per-region verdict (scheduler.framework.arrays, from snapshot.live and
the policy), computed once per snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import BoolArray
from scheduler.framework.plugin import Reason, RequestView

TYPE = "region-health"


@dataclass(frozen=True)
class RegionHealthFilter:
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView) -> BoolArray | None:
        keep: BoolArray = view.cols.healthy
        return keep

    def reason(self, view: RequestView, position: int) -> Reason:
        verdict = view.cols.health(position)
        return verdict if verdict is not None else ("healthy", ())
