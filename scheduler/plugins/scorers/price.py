"""Electricity cost scorer: what the request's energy costs at each region's price.

cost [USD] = E [J] x region.pue x region.price_per_kwh [USD/kWh] / 3.6e6 [J/kWh]
Reads: view.energy_j, region.pue and region.price_per_kwh (static columns, from the region
files). Reports USD, so a policy prices it with a bare multiplier (1: count each dollar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView
from scheduler.types import FleetSnapshot
from scheduler.units import J_PER_KWH

TYPE = "price-scorer"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("usd_per_j",)
    usd_per_j: FloatArray


@dataclass(frozen=True)
class PriceScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "USD"
    QUANTITY: ClassVar[str] = "electricity"
    ENERGY_LAYER: ClassVar[bool] = False

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        return Columns(np.asarray([c.region.pue * c.region.price_per_kwh / J_PER_KWH for c in fleet.candidates],
                                  dtype=np.float64))

    def score(self, view: RequestView, cols: Columns, positions: Positions) -> FloatArray | Abstain:
        usd: FloatArray = view.energy_j[positions] * cols.usd_per_j[positions]
        return usd
