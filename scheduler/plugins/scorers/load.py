"""Load scorer: how busy each candidate pool is now.

load  = 0.5 x kv_cache_usage + 0.5 x min(1, queue_depth / replicas / 4)
score = 1 - load            (replicas = pool.count / tensor_parallel)
Reads: each pool's fresh live state (scheduler.framework.arrays: load, load_fresh).
Abstains when any candidate's region state is missing or older than policy.max_age.region_state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import FloatArray
from scheduler.framework.plugin import Abstain, Positions, RequestView

TYPE = "load-scorer"


@dataclass(frozen=True)
class LoadScorer:
    TYPE: ClassVar[str] = TYPE
    WEIGHT: ClassVar[str] = "load"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        fresh = view.cols.load_fresh[positions]
        if not fresh.all():
            snapshot = view.snapshot
            region = snapshot.candidates[view.base[positions][int(fresh.argmin())]].region.name
            max_age = snapshot.policy.max_age.region_state
            state = snapshot.live.get(region)
            age = None if state is None else snapshot.now - state.observed_at
            return Abstain("region_state", age, max_age, f"live state of {region}")
        score: FloatArray = 1.0 - view.cols.load[positions]
        return score
