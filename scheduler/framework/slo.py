"""A request's latency budgets under the snapshot's policy (its own SLOs, else its workload
class's):

    ttft budget [s] = request.ttft_slo_ms, or slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens x prompt / 1000
    tpot budget [s] = request.tpot_slo_ms, or slo.tpot_ms
Reads: the request's SLOs, workload class and prompt tokens; policy.slo. The SLO filter and the
SLO-risk scorer read the TTFT budget from the request view (``RequestView.ttft_budget_s``: once per
decision).
"""

from __future__ import annotations

from scheduler.policy import Policy
from scheduler.types import FleetSnapshot, Request, WorkloadClass


def ttft_budget_s(request: Request, snapshot: FleetSnapshot) -> float:
    if request.ttft_slo_ms is not None:
        return request.ttft_slo_ms / 1000.0
    return class_ttft_budget_s(snapshot.policy, request.workload_class, request.prompt_tokens)


def class_ttft_budget_s(policy: Policy, workload_class: WorkloadClass, prompt_tokens: int) -> float:
    """The policy's TTFT budget of ``workload_class`` for a prompt: ttft_ms + per 1k tokens [s]."""
    slo = policy.slo_for(workload_class)
    return (slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens * prompt_tokens / 1000.0) / 1000.0


def tpot_budget_s(request: Request, snapshot: FleetSnapshot) -> float:
    if request.tpot_slo_ms is not None:
        return request.tpot_slo_ms / 1000.0
    return snapshot.policy.slo_for(request.workload_class).tpot_ms / 1000.0
