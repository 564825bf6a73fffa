"""Max-score picker: highest weighted total first; exact ties broken by the injected RNG.

order = candidates sorted by total, descending (a stable sort); among equal totals, the order
        of a rotation of the candidates by an offset drawn from the injected RNG
Reads: the totals the framework computed. The full ranking is returned (for failover).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import FloatArray, IndexArray

TYPE = "max-score-picker"


@dataclass(frozen=True)
class MaxScorePicker:
    TYPE: ClassVar[str] = TYPE

    def pick(self, totals: FloatArray, rng: random.Random) -> IndexArray:
        n = len(totals)
        rotation = np.arange(n) + int(rng.random() * n)
        rotation %= n
        order: IndexArray = rotation[np.argsort(-totals[rotation], kind="stable")]
        return order
