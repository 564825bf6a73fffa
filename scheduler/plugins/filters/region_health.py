"""Health filter: the region is up, as its last published live state says.

keep c  iff  live[region] is fresh (age <= policy.max_age.region_state) and healthy,
        or   it is stale and policy.unknown_region_state.stale == "assume-healthy",
        or   it was never seen and policy.unknown_region_state.missing == "assume-healthy"
Reads: snapshot.live (observed_at, healthy), snapshot.now, policy.max_age.region_state,
policy.unknown_region_state. Judged once per region per snapshot (prepare), spread to its
candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, IndexArray
from scheduler.framework.plugin import Lifetime, Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "region-health"

Verdict = Reason | None


@dataclass(frozen=True)
class Columns:
    healthy: BoolArray
    # per candidate: its region's position in ``verdicts``
    region: IndexArray
    # per region: None (may take requests) or why not
    verdicts: tuple[Verdict, ...]


@dataclass(frozen=True)
class RegionHealthFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    LIFETIME: ClassVar[Lifetime | None] = "live"

    def prepare(self, snapshot: FleetSnapshot) -> Columns:
        names = [r.name for r in snapshot.regions]
        verdicts = tuple(region_verdict(snapshot, name) for name in names)
        position = {name: i for i, name in enumerate(names)}
        region = np.asarray([position[c.region.name] for c in snapshot.candidates], dtype=np.intp)
        healthy = np.asarray([v is None for v in verdicts], dtype=bool)[region]
        return Columns(healthy, region, verdicts)

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        return cols.healthy

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        verdict = cols.verdicts[int(cols.region[position])]
        return verdict if verdict is not None else ("healthy", ())


def region_verdict(snapshot: FleetSnapshot, region: str) -> Verdict:
    """None when ``region`` may take requests, else why not."""
    unknown = snapshot.policy.unknown_region_state
    state = snapshot.live.get(region)
    if state is None:
        return None if unknown.missing == "assume-healthy" else ("no live state ever seen", ())
    age = snapshot.now - state.observed_at
    max_age = snapshot.policy.max_age.region_state
    if age > max_age:
        return None if unknown.stale == "assume-healthy" else ("live state {:.1f} s old > limit {:.1f} s", (age, max_age))
    return None if state.healthy else ("region reports unhealthy", ())
