"""Max-score picker: highest weighted total first; exact ties broken by the injected RNG.

order = candidates sorted by total, descending (a stable sort); among equal totals, the order
        of a rotation of the candidates by an offset drawn from the injected RNG
Reads: the totals the framework computed. The full ranking is returned (for failover).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from scheduler.framework.arrays import FloatArray, IndexArray

TYPE = "max-score-picker"


@dataclass(frozen=True)
class MaxScorePicker:
    TYPE: ClassVar[str] = TYPE

    def pick(self, totals: FloatArray, rng: random.Random) -> IndexArray:
        n = len(totals)
        start = int(rng.random() * n)
        positions = _positions(n)
        rotation = np.concatenate((positions[start:], positions[:start]))
        order: IndexArray = rotation[np.argsort(-totals[rotation], kind="stable")]
        return order


@lru_cache(maxsize=64)
def _positions(n: int) -> IndexArray:
    positions = np.arange(n)
    positions.flags.writeable = False
    return positions
