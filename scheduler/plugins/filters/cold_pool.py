"""Cold-pool filter: a pool with no warm replica takes only requests whose TTFT budget allows
its cold start.

keep c  iff  c's pool is warm (a replica serves: cold_start_s = 0)
        or   rtt_s + cold_start_s <= the request's TTFT budget
cold_start_s = the pool's cold start (pool setting ``cold_start_s``, else derived:
scheduler.energy.cold_start) when the region reports no warm replica of it, starting or not
(``CandidatePerf.cold_start_s``, data layer). The TTFT budget is the request's own SLO, else
its workload class's (policy.slo): a deferrable request's, an hour by default, is its deadline.
Reads: snapshot.perf (warmth, cold_start_s), the view's rtt_s and TTFT budget.
The rest of its TTFT (queue, prefill) is the SLO filter's to judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, perf_column
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import FleetSnapshot

TYPE = "cold-pool"
_COLD_START_S = attrgetter("cold_start_s")


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("cold_start_s",)
    # per candidate: seconds until a replica of its pool serves (0: warm)
    cold_start_s: FloatArray
    # whether any candidate of the fleet is cold or starting (else every one is kept at once)
    any_cold: bool


@dataclass(frozen=True)
class ColdPoolFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    READS: ClassVar[frozenset[str]] = frozenset({"perf"})

    def update(self, snapshot: FleetSnapshot, state: None, last: Columns | None) -> Columns:
        seconds = perf_column(snapshot, None if last is None else last.cold_start_s, _COLD_START_S)
        if last is not None and np.array_equal(seconds, last.cold_start_s):
            return last
        return Columns(cold_start_s=seconds, any_cold=bool(np.any(seconds > 0.0)))

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        if not cols.any_cold:
            return None
        keep: BoolArray = (cols.cold_start_s == 0.0) | (view.rtt_s + cols.cold_start_s <= view.ttft_budget_s)
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        perf = view.snapshot.perf[int(view.base[position])]
        state = "one starting" if perf.warmth == "starting" else "none starting"
        return ("no warm replica ({}): cold start {:.0f} s + RTT {:.0f} ms > TTFT budget {:.0f} ms",
                (state, float(cols.cold_start_s[position]), float(view.rtt_s[position]) * 1e3,
                 view.ttft_budget_s * 1e3))
