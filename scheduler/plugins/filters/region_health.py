"""Health filter: the region may take requests, as scheduler.plugins.health judges it from
its last published live state, its last-seen record and, whenever that state is not fresh (or
the store is not steady), the router's own probe of it.

keep c  iff  region_verdict(snapshot, c.region) is None
Reads: as scheduler.plugins.health says, ``now`` among them: judged at every snapshot, once
per region, and spread to its candidates; while the store is steady and every region's state
fresh and healthy (as the snapshot builder found them) every region may take requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, IndexArray, fresh_pools, region_positions
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.plugins.health import Verdict, region_verdicts, store_steady
from scheduler.types import FleetSnapshot

TYPE = "region-health"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("healthy", "region")
    healthy: BoolArray
    region: IndexArray  # per candidate: its region's position in ``verdicts``
    verdicts: tuple[Verdict, ...]  # per region: None (may take requests) or why not
    all_healthy: bool = False  # every region may take requests


@dataclass(frozen=True)
class RegionHealthFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    READS: ClassVar[frozenset[str]] = frozenset({"clock"})

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        """The columns when every region may take requests (the same for every such snapshot)."""
        return Columns(np.ones(len(fleet.candidates), dtype=bool), region_positions(fleet),
                       (None,) * len(fleet.regions), True)

    def update(self, snapshot: FleetSnapshot, every: Columns, last: Columns | None) -> Columns:
        if store_steady(snapshot) and fresh_pools(snapshot)[1]:
            return every
        verdicts = tuple(region_verdicts(snapshot))
        if verdicts.count(None) == len(verdicts):
            return every
        return Columns(np.asarray([v is None for v in verdicts], dtype=bool)[every.region], every.region, verdicts)

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        return None if cols.all_healthy else cols.healthy

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        verdict = cols.verdicts[int(cols.region[position])]
        return verdict if verdict is not None else ("healthy", ())
