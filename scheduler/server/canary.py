"""The router's side of the canary (scheduler.canary): how a proxied stream went, for its arm's
window, and the canary's status as the RouterAdmin answer carries it.

A stream's outcome (``stream_outcome``), from how ``scheduler.server.core.ProxyRun`` ended:

    complete                         met the TTFT SLO iff its first token came within the budget
    region failed, deadline passed   an error; its TTFT verdict as above when text came, else a miss
    (before or after the first token)
    the client left                  not an error; a TTFT verdict only when text came

The budget is the request's TTFT SLO, or the policy's for its workload class with the prefill
allowance for its prompt (scheduler.plugins.filters.slo_reachable): the control's SLOs, which the
canary arm decides under too. A failover counts as a retry; joules and grams come from the
receipt, when one was booked.
"""

from __future__ import annotations

from scheduler import errors
from scheduler.canary.runtime import CanaryStatus, WindowFigures
from scheduler.canary.stats import ArmFigures, Outcome
from scheduler.types import EnergyReceipt, FleetSnapshot, Request
from scheduler.v1 import admin_pb2

_ERROR_ENDS = frozenset({"region-error", "deadline", "error"})


def ttft_budget_ms(request: Request, snapshot: FleetSnapshot) -> float:
    if request.ttft_slo_ms is not None:
        return request.ttft_slo_ms
    slo = snapshot.policy.slo_for(request.workload_class)
    return slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens * request.prompt_tokens / 1000.0


def stream_outcome(request: Request, snapshot: FleetSnapshot, receipt: EnergyReceipt | None, retried: bool,
                   failed: bool, deadline_passed: bool) -> Outcome:
    """How a proxied stream went, as it leaves its ``async with``: ``receipt`` the one booked
    (None: no text went out), ``retried`` whether it failed over, ``failed`` whether it ended on
    an exception or a region failure, ``deadline_passed`` whether the client's deadline had."""
    budget = ttft_budget_ms(request, snapshot)
    if receipt is not None:
        ttft = receipt.ttft_ms
        return Outcome(ttft_ok=None if ttft is None else ttft <= budget, error=receipt.end_reason in _ERROR_ENDS,
                       retried=retried, energy_j=receipt.energy_j, carbon_g=receipt.carbon_g)
    # No text went out.
    if failed or deadline_passed:
        return Outcome(ttft_ok=False, error=True, retried=retried)
    # The client left before the first token: no verdict.
    return Outcome(ttft_ok=None, error=False, retried=retried)


def _arm_stats(arm: str, policy: str, figures: ArmFigures) -> admin_pb2.CanaryArmStats:
    message = admin_pb2.CanaryArmStats(arm=arm, policy=policy, requests=int(figures.requests))
    for name, value in figures.summary().items():
        if name != "requests" and value is not None:
            setattr(message, name, value)
    return message


def _window(status: CanaryStatus, window: WindowFigures) -> admin_pb2.CanaryWindow:
    return admin_pb2.CanaryWindow(start_unix_s=window.start, length_s=window.length_s, arms=[
        _arm_stats("control", status.policy, window.control), _arm_stats("canary", status.arm, window.canary)])


def status_to_proto(status: CanaryStatus) -> admin_pb2.GetCanaryStatusResponse:
    message = admin_pb2.GetCanaryStatusResponse(
        configured=status.configured, policy=status.policy, arm=status.arm, fraction=status.fraction,
        assign_by=status.assign_by, enabled=status.enabled, state=status.state if status.configured else "",
        reason=status.reason, epoch=status.epoch, updated_at_unix_s=status.updated_at, updated_by=status.updated_by,
        windows=[_window(status, w) for w in status.windows], thresholds=list(status.thresholds),
        read_at_unix_s=status.read_at,
    )
    if status.judged is not None:
        message.judged.CopyFrom(_window(status, status.judged))
    return message


def no_canary(policy: str) -> errors.InvalidRequest:
    return errors.InvalidRequest([errors.FieldViolation(
        "enabled", f"the router's policy {policy!r} has no canary section (docs/canary.md)")])
