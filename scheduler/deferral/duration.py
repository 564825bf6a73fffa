"""What a released request needs before its deadline, the same in the router
(scheduler.server.deferral_api) and the simulator (scheduler.sim.deferral):

    needs_s  = DURATION_FACTOR x predicted completion + GUARD_S
    decode_s = N x TPOT at the mid-output context          (N = max_tokens)
             = N x (tpot_s + (C + N / 2) x tpot_s_per_context_token)

the predicted completion being the time to the first token plus ``decode_s``, on the
candidate the policy ranks first (the energy model's latency coefficients).
"""

from __future__ import annotations

from scheduler.types import Candidate, FleetSnapshot, Request

# Twice the predicted completion time, plus 5 minutes: a margin for a busier fleet at release.
DURATION_FACTOR = 2.0
GUARD_S = 300.0


def decode_s(snapshot: FleetSnapshot, request: Request, candidate: Candidate) -> float:
    """The predicted time from the first token to the last on ``candidate``."""
    latency = snapshot.perf[candidate.index].latency
    n = request.max_tokens
    return n * (latency.tpot_s + (request.prompt_tokens + n * 0.5) * latency.tpot_s_per_context_token)


def needs_s(completion_s: float, factor: float = DURATION_FACTOR, guard_s: float = GUARD_S) -> float:
    """How long before its deadline a request predicted to take ``completion_s`` must start."""
    return factor * completion_s + guard_s
