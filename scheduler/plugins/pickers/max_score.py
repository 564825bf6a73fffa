"""Max-score picker: highest weighted total first; exact ties broken by the injected RNG.

order = candidates sorted by total, descending; among equal totals, a seeded rotation
        (key = frac(i x golden ratio + u), u drawn once from the injected RNG)
Reads: the totals the framework computed. The full ranking is returned (for failover).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import FloatArray, IndexArray

TYPE = "max-score-picker"
_GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class MaxScorePicker:
    TYPE: ClassVar[str] = TYPE

    def pick(self, totals: FloatArray, rng: random.Random) -> IndexArray:
        order: IndexArray = np.argsort(-totals, kind="stable")
        ranked = totals[order]
        if len(ranked) < 2 or not (ranked[1:] == ranked[:-1]).any():
            return order
        tie_break = (np.arange(len(totals)) * _GOLDEN + rng.random()) % 1.0
        shuffled: IndexArray = np.lexsort((tie_break, -totals))
        return shuffled
