"""SLO filter: the predicted time to first token and per output token meet the request's SLO.

ttft = RTT(client, region) + queue wait + prefill time   (scheduler.framework.predict)
budget_ttft = request.ttft_slo_ms, or slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens x prompt / 1000
keep c  iff  ttft <= budget_ttft  and  tpot <= (request.tpot_slo_ms or slo.tpot_ms)
Reads: the view's ttft_s and tpot_s, request SLOs and workload class, policy.slo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from scheduler.config.schema import PolicyConfig
from scheduler.framework.columns import BoolArray
from scheduler.framework.plugin import NoColumns, Reason, RequestView
from scheduler.types import FleetSnapshot, Request, WorkloadClass

TYPE = "slo-reachable"


def ttft_budget_s(request: Request, snapshot: FleetSnapshot) -> float:
    if request.ttft_slo_ms is not None:
        return request.ttft_slo_ms / 1000.0
    return class_ttft_budget_s(snapshot.policy, request.workload_class, request.prompt_tokens)


def class_ttft_budget_s(policy: PolicyConfig, workload_class: WorkloadClass, prompt_tokens: int) -> float:
    """The policy's TTFT budget of ``workload_class`` for a prompt: ttft_ms + per 1k tokens [s]."""
    slo = policy.slo_for(workload_class)
    return (slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens * prompt_tokens / 1000.0) / 1000.0


def tpot_budget_s(request: Request, snapshot: FleetSnapshot) -> float:
    if request.tpot_slo_ms is not None:
        return request.tpot_slo_ms / 1000.0
    return snapshot.policy.slo_for(request.workload_class).tpot_ms / 1000.0


@dataclass(frozen=True)
class SloReachableFilter(NoColumns):
    TYPE: ClassVar[str] = TYPE

    def keep(self, view: RequestView, cols: None) -> BoolArray | None:
        keep: BoolArray = view.ttft_s <= ttft_budget_s(view.request, view.snapshot)
        keep &= view.tpot_s <= tpot_budget_s(view.request, view.snapshot)
        return keep

    def reason(self, view: RequestView, cols: None, position: int) -> Reason:
        ttft_budget = ttft_budget_s(view.request, view.snapshot)
        ttft = float(view.ttft_s[position])
        if ttft > ttft_budget:
            return "predicted TTFT {:.0f} ms > SLO {:.0f} ms", (ttft * 1e3, ttft_budget * 1e3)
        tpot_budget = tpot_budget_s(view.request, view.snapshot)
        return "predicted TPOT {:.1f} ms > SLO {:.1f} ms", (float(view.tpot_s[position]) * 1e3, tpot_budget * 1e3)
