"""Lowest-cost picker: the cheapest candidate first; exact ties ordered by the tie-break key.

order = candidates sorted by (cost, tiebreak) ascending
Reads: each survivor's cost in USD and its tie-break key (the framework mixes the candidate's
key with the request id's, so ties fall differently per request and never depend on the
other candidates). The full ranking is returned (for failover).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import FloatArray, HashArray, IndexArray
from scheduler.framework.plugin import Plugin

TYPE = "lowest-cost-picker"


@dataclass(frozen=True)
class LowestCostPicker(Plugin):
    TYPE: ClassVar[str] = TYPE

    def pick(self, costs: FloatArray, tiebreak: HashArray) -> IndexArray:
        order: IndexArray = np.lexsort((tiebreak, costs))
        return order
