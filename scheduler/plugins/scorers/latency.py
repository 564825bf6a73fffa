"""Latency scorer: predicted end-to-end time of the request on each candidate.

t = ttft + max_tokens x tpot   (scheduler.framework.latency: RTT + queue + prefill; decode step)
score = 1 - (t - t_min) / (t_max - t_min)
Reads: view.ttft_s, view.tpot_s, request.max_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.arrays import FloatArray
from scheduler.framework.plugin import Abstain, Positions, RequestView, normalized_low_is_best

TYPE = "latency-scorer"


@dataclass(frozen=True)
class LatencyScorer:
    TYPE: ClassVar[str] = TYPE
    WEIGHT: ClassVar[str] = "latency"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        return normalized_low_is_best(view.ttft_s[positions] + view.request.max_tokens * view.tpot_s[positions])
