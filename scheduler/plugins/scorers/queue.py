"""Queue scorer: how long the request would wait in each pool's queue before it starts.

wait [ms] = 1000 x predicted queue wait (the data layer's estimate from the pool's live
            queue depth, running sequences and KV usage: scheduler.datalayer.snapshot)
Reads: view.queue_wait_s, view.live, view.ttft_budget_s. A survivor whose region's state is
missing or older than policy.max_age.region_state (its wait would be a guess) is priced at a
conservative bound, the whole TTFT budget (the longest it may wait and still meet its SLO),
and named (``Bounded``); abstains when no survivor's state is fresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Bounded, Plugin, Positions, RequestView

TYPE = "queue-scorer"


@dataclass(frozen=True)
class QueueScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "ms"
    QUANTITY: ClassVar[str] = "queue"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Bounded | Abstain:
        ms: FloatArray = view.queue_wait_s[positions] * 1000.0
        fresh = view.live[positions]
        if fresh.all():
            return ms
        snapshot = view.snapshot
        bound_ms = view.ttft_budget_s * 1000.0
        bounded = np.flatnonzero(~fresh)
        candidates = view.base[positions][bounded].tolist()
        notes = []
        for index in candidates:
            region = snapshot.candidates[index].region.name
            state = snapshot.live.get(region)
            age = None if state is None else snapshot.now - state.observed_at
            notes.append(Abstain("region_state", age, snapshot.policy.max_age.region_state,
                                 f"live state of {region}; its wait priced at the TTFT budget, {bound_ms:g} ms",
                                 key=region, bound=bound_ms, bound_unit="ms"))
        if len(bounded) == len(fresh):
            return notes[0]
        ms[bounded] = bound_ms
        return Bounded(ms, bounded, tuple(notes))
