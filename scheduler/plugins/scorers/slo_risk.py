"""SLO-risk scorer: the chance this request misses its TTFT SLO on each candidate.

P(miss) [miss] = P(TTFT > budget) = 1 - Phi(ln(budget / ttft) / sigma)
sigma  = sqrt(ttft_log_sigma^2 + (queue_cv x queue wait / ttft)^2)
ttft   = the predicted time to first token (scheduler.framework.predict: RTT + queue wait,
         the router's pending dispatches included, + prefill)
budget = the request's TTFT SLO (scheduler.framework.slo.ttft_budget_s)
The prediction's error is taken as lognormal: ``ttft_log_sigma`` for the parts that are
physics (RTT, prefill: the simulator reports the measured spread, `scheduler simulate` ->
TTFT err), widened by the queue wait's share of the TTFT, the part that depends on arrivals
not yet seen (a queue's wait has a coefficient of variation near ``queue_cv`` = 1, as an M/M/1
queue's does). The SLO filter has already removed the candidates predicted past the budget
(P > 0.5); this prices how close the others are to it, so that a policy can concentrate load
on a clean pool until its queue makes the SLO uncertain, and spill before it is missed.
Reads: view.ttft_s, view.queue_wait_s, the request's TTFT budget. Parameters:
ttft_log_sigma, queue_cv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView

TYPE = "slo-risk-scorer"


SQRT_HALF = math.sqrt(0.5)


def normal_sf(z: FloatArray) -> FloatArray:
    """1 - Phi(z) = erfc(z / sqrt(2)) / 2, the standard normal's upper tail, from the C
    library's erfc (math.erfc): absolute error below 2e-16, relative error below 1e-13 for
    |z| <= 10 (tests/unit/plugins/test_normal_sf.py). Element by element in Python: on the
    few dozen survivors of a decision that is several times faster than any closed-form
    approximation as numpy operations (each costs ~1 us whatever the length)."""
    erfc = math.erfc
    tail: FloatArray = np.array([0.5 * erfc(x * SQRT_HALF) for x in z.tolist()], dtype=np.float64)
    return tail


@dataclass(frozen=True)
class SloRiskScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "miss"
    QUANTITY: ClassVar[str] = "slo risk"
    ENERGY_LAYER: ClassVar[bool] = False
    # Lognormal spread of the TTFT prediction's error without queueing, and the queue wait's
    # coefficient of variation.
    ttft_log_sigma: Annotated[float, Field(gt=0, le=3)] = 0.25
    queue_cv: Annotated[float, Field(ge=0, le=5)] = 1.0

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Abstain:
        budget = view.ttft_budget_s
        ttft = np.maximum(view.ttft_s[positions], 1e-6)
        share = view.queue_wait_s[positions] / ttft
        if self.queue_cv != 1.0:  # (x 1, the default, is the identity: one array operation less)
            share *= self.queue_cv
        # sqrt(ttft_log_sigma^2 + (queue_cv x queue share)^2)
        sigma = np.hypot(self.ttft_log_sigma, share)
        return normal_sf(np.log(budget / ttft) / sigma)
