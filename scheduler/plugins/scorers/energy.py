"""Energy scorer: predicted joules for this request on each candidate pool.

E = uncached x e_prefill + e_start + N x (e_step + e_kv x (C + N/2)) + idle_w x wait
    (scheduler.energy.model coefficients per pool and live batch, evaluated by the framework)
score = 1 - (E - E_min) / (E_max - E_min)
Reads: view.energy_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import FloatArray
from scheduler.framework.plugin import Abstain, Positions, RequestView, normalized_low_is_best

TYPE = "energy-scorer"


@dataclass(frozen=True)
class EnergyScorer:
    TYPE: ClassVar[str] = TYPE
    WEIGHT: ClassVar[str] = "energy"
    ENERGY_LAYER: ClassVar[bool] = True

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        return normalized_low_is_best(view.energy_j[positions])
