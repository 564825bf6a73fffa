"""Price scorer: electricity cost of the request on each candidate.

cost = E_j x region.pue x region.price_per_kwh / 3.6e6
score = 1 - (cost - cost_min) / (cost_max - cost_min)
Reads: view.energy_j, region.pue, region.price_per_kwh (from the region file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import FloatArray
from scheduler.framework.plugin import Abstain, Positions, RequestView, normalized_low_is_best

TYPE = "price-scorer"


@dataclass(frozen=True)
class PriceScorer:
    TYPE: ClassVar[str] = TYPE
    WEIGHT: ClassVar[str] = "price"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        c = view.cols
        return normalized_low_is_best(view.energy_j[positions] * (c.pue[positions] * c.price_per_kwh[positions]))
