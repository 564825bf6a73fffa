"""SLO filter: the predicted time to first token and per output token meet the request's SLO.

ttft = RTT(client, region) + queue wait + prefill time   (scheduler.framework.predict)
budget_ttft = request.ttft_slo_ms, or slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens x prompt / 1000
keep c  iff  ttft <= budget_ttft  and  tpot <= (request.tpot_slo_ms or slo.tpot_ms)
Reads: the view's ttft_s and tpot_s, request SLOs and workload class, policy.slo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.framework.columns import BoolArray
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.framework.slo import tpot_budget_s

TYPE = "slo-reachable"


@dataclass(frozen=True)
class SloReachableFilter(Plugin):
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView, cols: None) -> BoolArray | None:
        keep: BoolArray = view.ttft_s <= view.ttft_budget_s
        keep &= view.tpot_s <= tpot_budget_s(view.request, view.snapshot)
        return keep

    def reason(self, view: RequestView, cols: None, position: int) -> Reason:
        ttft_budget = view.ttft_budget_s
        ttft = float(view.ttft_s[position])
        if ttft > ttft_budget:
            return "predicted TTFT {:.0f} ms > SLO {:.0f} ms", (ttft * 1e3, ttft_budget * 1e3)
        tpot_budget = tpot_budget_s(view.request, view.snapshot)
        return "predicted TPOT {:.1f} ms > SLO {:.1f} ms", (float(view.tpot_s[position]) * 1e3, tpot_budget * 1e3)
