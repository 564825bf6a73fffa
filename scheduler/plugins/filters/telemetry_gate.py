"""Telemetry gate: a pool whose energy is only modelled, never measured, takes canary traffic
only until its measurements pass the energy gate (policy ``telemetry_gate``, docs/gate.md).

metered(c)  iff  live[c.region] (its last published state, however old: whether a region
                 meters is a property of its hardware, not a live signal) lists c.pool with
                 gpu_power_w set (the gateway publishes it only while its NVML meter reads)
passed(c)   iff  "c.region/c.pool" is in policy.telemetry_gate.passed
keep c  iff  policy.telemetry_gate is None or its modelled_only == "allow"
        or   metered(c) or passed(c)
        or   snapshot.canary_arm == "canary"   (the canary arm's own snapshot)
A region never seen, a pool it does not list, and a plain vLLM region (its state is scraped
without power) count as modelled. Without a canary, modelled pools take no traffic at all.
Reads: policy.telemetry_gate, snapshot.live (pools, gpu_power_w), snapshot.canary_arm.
Judged when a region's published state changed (``update``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.canary.assign import CANARY
from scheduler.framework.columns import BoolArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import Candidate, FleetSnapshot

TYPE = "telemetry-gate"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("kept",)
    # per candidate: may take this snapshot's requests (None: every candidate may)
    kept: BoolArray | None


_ALL = Columns(None)


@dataclass(frozen=True)
class TelemetryGateFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    READS: ClassVar[frozenset[str]] = frozenset({"live"})

    def update(self, snapshot: FleetSnapshot, state: None, last: Columns | None) -> Columns:
        gate = snapshot.policy.telemetry_gate
        if gate is None or gate.modelled_only == "allow" or snapshot.canary_arm == CANARY:
            return _ALL
        passed = {p.pool for p in gate.passed}
        kept = np.asarray([c.key in passed or _metered(snapshot, c) for c in snapshot.candidates], dtype=bool)
        return _ALL if kept.all() else Columns(kept)

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        return cols.kept

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        key = view.snapshot.candidates[int(view.base[position])].key
        return ("{}: energy only modelled (its region publishes no GPU power) and not passed by the energy gate: "
                "canary traffic only", (key,))


def _metered(snapshot: FleetSnapshot, candidate: Candidate) -> bool:
    state = snapshot.live.get(candidate.region.name)
    pool = state.pools.get(candidate.pool.name) if state is not None else None
    return pool is not None and pool.gpu_power_w is not None
