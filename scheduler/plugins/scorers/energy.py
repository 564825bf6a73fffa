"""Energy scorer: predicted joules for this request on each candidate pool.

E [J] = U (e_token + e_step / (B M')) + pairs (e_pair + e_kv / M') + e_step / B
        + (N - 1) (e_step / B + e_token) + (N - 1) (C + N / 2) (e_kv + e_pair)
(scheduler.energy.step: the pool's step model at its expected batch B, evaluated by the
framework for U uncached of C prompt tokens and N output tokens)
Reads: view.energy_j. Never abstains: the prediction comes from configured hardware and the
pool's live batch, which the data layer replaces by the nominal batch when stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView

TYPE = "energy-scorer"


@dataclass(frozen=True)
class EnergyScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "J"
    QUANTITY: ClassVar[str] = "energy"
    ENERGY_LAYER: ClassVar[bool] = True

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Abstain:
        return view.energy_j[positions]
