"""TTFT scorer: predicted time to first token on each candidate.

ttft [ms] = 1000 x (RTT + queue wait + prefill)   (scheduler.framework.predict)
Reads: view.ttft_s (RTT from the client's location, the pool's predicted queue wait and the
step model's prefill time at its live batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView

TYPE = "ttft-scorer"


@dataclass(frozen=True)
class TtftScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "ms"
    QUANTITY: ClassVar[str] = "ttft"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Abstain:
        ms: FloatArray = view.ttft_s[positions] * 1000.0
        return ms
