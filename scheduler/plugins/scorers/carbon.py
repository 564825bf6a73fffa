"""Carbon scorer: grams of CO2e this request would cost on each candidate pool.

g = E_j x intensity(zone) [gCO2e/kWh] x region.pue / 3.6e6
score = 1 - (g - g_min) / (g_max - g_min)
Reads: view.energy_j, the snapshot's carbon signal per grid zone (value, observed_at), PUE.
Abstains when any candidate's zone signal is missing or older than policy.max_age.carbon
(age from the signal's observed_at): a stale value never moves a score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import FloatArray
from scheduler.framework.plugin import Abstain, Positions, RequestView, normalized_low_is_best

TYPE = "carbon-scorer"


@dataclass(frozen=True)
class CarbonScorer:
    TYPE: ClassVar[str] = TYPE
    WEIGHT: ClassVar[str] = "carbon"
    ENERGY_LAYER: ClassVar[bool] = True

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        max_age = view.snapshot.policy.max_age.carbon
        ages = view.cols.carbon_age_s[positions]
        worst = int(np.argmax(ages))
        if ages[worst] > max_age:
            region = view.snapshot.candidates[view.base[positions][worst]].region
            signal = view.snapshot.carbon.get(region.grid_zone)
            if signal is None:
                return Abstain("carbon", None, max_age, f"no carbon signal for zone {region.grid_zone}")
            return Abstain("carbon", float(ages[worst]), max_age, f"zone {region.grid_zone} signal from {signal.source}")
        return normalized_low_is_best(view.energy_j[positions] * view.cols.carbon_g_per_j[positions])
