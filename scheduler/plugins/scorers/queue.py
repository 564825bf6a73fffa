"""Queue scorer: how long the request would wait in each pool's queue before it starts.

wait [ms] = 1000 x predicted queue wait (the data layer's estimate from the pool's live
            queue depth, running sequences and KV usage: scheduler.datalayer.snapshot)
Reads: view.queue_wait_s, view.live. Abstains when any survivor's region state is missing
or older than policy.max_age.region_state (the wait would be a guess).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, NoColumns, Positions, RequestView

TYPE = "queue-scorer"


@dataclass(frozen=True)
class QueueScorer(NoColumns):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "ms"
    QUANTITY: ClassVar[str] = "queue"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Abstain:
        fresh = view.live[positions]
        if not fresh.all():
            snapshot = view.snapshot
            region = snapshot.candidates[view.base[positions][int(fresh.argmin())]].region.name
            state = snapshot.live.get(region)
            age = None if state is None else snapshot.now - state.observed_at
            return Abstain("region_state", age, snapshot.policy.max_age.region_state, f"live state of {region}")
        ms: FloatArray = view.queue_wait_s[positions] * 1000.0
        return ms
