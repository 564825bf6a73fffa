"""The simulated deferral queue: deferrable requests with a deadline wait for the lowest-carbon
window of the forecast before their deadline.

At arrival a deferrable request is decided as any other (``Scheduler.schedule``); its deadline
is arrival + ``--deferrable-deadline`` (default: the policy's deferrable TTFT SLO). Then

    where    = the region the decision ranks first (where the policy would run it now)
    forecast = that region's grid forecast in force now (``scheduler.sim.forecast``: the hourly
               files with a seeded error, never the truth)
    needs    = duration_factor x predicted completion + guard_s
               predicted completion = predicted TTFT (RTT, queue, prefill) + N x predicted TPOT
    release  = choose_release(forecast, now, deadline, needs)   (scheduler.deferral.window)

A release now (reason ``now``, ``deadline`` or ``no-forecast``) dispatches with the arrival's
decision. A held one (``window``) waits in the queue until its release time, then is decided
afresh on the snapshot of that time (the policy may pick another region then) with a TTFT SLO
of min(the class's, the time left to its deadline), and dispatched. Requests released at the
same time are dispatched together, as a router releasing its queue would: they share batches.

A deferrable request that may not be held (``Request.holdable`` is False: a workflow's chain
or DAG step, on which the next steps wait) is dispatched with its arrival's decision, whatever
the forecast (counted as ``deferred_not_holdable``).

Measured per deferrable request: its grams and joules where and when it really ran, whether
it finished (last token at the client) by its deadline, and its wait in the queue (release -
arrival). Its TTFT, queue wait and completion time in the general figures count from its
release. ``missed_deadlines`` counts deferrable requests that finished after their deadline or
never ran (unschedulable, failed).

``scheduler.sim.scenario.run_policy`` runs every policy twice on the same workload, once with
the queue and once deciding the same deferrable requests at arrival, and reports both
(``deferred_*`` and ``deferred_*_at_arrival``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.deferral.duration import DURATION_FACTOR, GUARD_S, decode_s, needs_s
from scheduler.deferral.window import REASONS
from scheduler.sim.forecast import DEFAULT_ERROR, DEFAULT_HORIZON_H
from scheduler.sim.predicted import Predictions
from scheduler.types import Candidate, FleetSnapshot, Request
from scheduler.units import J_PER_KWH


@dataclass(frozen=True)
class Deferral:
    """The queue's settings (module docstring)."""

    # Lognormal sigma of the forecast's error a day ahead (scheduler.sim.forecast; 0: perfect foresight).
    forecast_error: float = DEFAULT_ERROR
    horizon_h: int = DEFAULT_HORIZON_H
    # A request needs duration_factor x its predicted completion time + guard_s before its deadline.
    duration_factor: float = DURATION_FACTOR
    guard_s: float = GUARD_S
    # Hold a request only for a window at least this much cleaner (relative) than now.
    min_gain: float = 0.0

    def __post_init__(self) -> None:
        if not self.forecast_error >= 0:
            raise ValueError(f"forecast error must be >= 0, got {self.forecast_error}")
        if self.duration_factor < 1 or self.guard_s < 0 or self.min_gain < 0:
            raise ValueError("duration_factor must be >= 1, guard_s and min_gain >= 0")

    def needs_s(self, predicted_completion_s: float) -> float:
        return needs_s(predicted_completion_s, self.duration_factor, self.guard_s)


def predicted_completion_s(predictions: Predictions, snapshot: FleetSnapshot, request: Request,
                           candidate: Candidate) -> float:
    """The scheduler's predicted time from dispatch to the last token on ``candidate``:
    TTFT + N x TPOT at the mid-output context (scheduler.framework.predict)."""
    _, ttft = predictions.energy_and_ttft(snapshot, request, candidate)
    return ttft + decode_s(snapshot, request, candidate)


def summary(
    rows: Sequence[int],
    arrival_s: Sequence[float],
    deadline_s: Sequence[float],
    released_s: Sequence[float],
    ran_in: np.ndarray,
    latency_s: np.ndarray,
    energy_j: np.ndarray,
    grams: np.ndarray,
    reasons: Mapping[str, int],
) -> dict[str, Any]:
    """The deferrable work's figures. ``released_s``: when each row was dispatched (its
    arrival unless it was held); ``latency_s``: release to last token at the client."""
    idx = np.asarray(rows, dtype=np.int64)
    n = len(idx)
    arrival = np.asarray(arrival_s, dtype=float)[idx] if n else np.zeros(0)
    deadline = np.asarray(deadline_s, dtype=float)[idx] if n else np.zeros(0)
    released = np.asarray(released_s, dtype=float)[idx] if n else np.zeros(0)
    ran = ran_in[idx] >= 0 if n else np.zeros(0, dtype=bool)
    done = released + latency_s[idx] if n else np.zeros(0)
    # A microsecond of slack: times are sums of floats.
    on_time = ran & (done <= deadline + 1e-6)
    energy = energy_j[idx][ran] if n else np.zeros(0)
    g = grams[idx][ran] if n else np.zeros(0)
    wait = (released - arrival)[ran] if n else np.zeros(0)
    kwh = float(energy.sum()) / J_PER_KWH
    held_at = released[released > arrival] if n else np.zeros(0)
    largest = int(np.unique(held_at, return_counts=True)[1].max()) if len(held_at) else 0

    def pct(values: np.ndarray, q: float) -> float | None:
        return float(np.percentile(values, q)) if len(values) else None

    return {
        "deferrable_requests": n,
        "deferred_held": int(reasons.get("window", 0)),
        # deferrable requests that may not be held (a workflow's chain or DAG step): run at once
        "deferred_not_holdable": int(reasons.get("chain", 0)),
        "deferred_release_reasons": {r: int(reasons.get(r, 0)) for r in REASONS},
        "deferred_ran": int(ran.sum()),
        "deferred_gco2e_per_request": float(g.mean()) if len(g) else None,
        "deferred_j_per_request": float(energy.mean()) if len(energy) else None,
        # grams per kWh of the deferrable work, PUE included: the grid it ran on
        "deferred_g_per_kwh": float(g.sum()) / kwh if kwh > 0 else None,
        "missed_deadlines": int(n - on_time.sum()),
        "deferred_wait_p50_s": pct(wait, 50),
        "deferred_wait_p99_s": pct(wait, 99),
        "deferred_wait_max_s": float(wait.max()) if len(wait) else None,
        "deferred_slack_min_s": float((deadline - done)[ran].min()) if ran.any() else None,
        # the most held requests released in one instant
        "deferred_largest_release": largest,
    }


AT_ARRIVAL_KEYS = (
    "deferred_gco2e_per_request", "deferred_j_per_request", "deferred_g_per_kwh", "missed_deadlines",
    "deferred_slack_min_s",
)


def merge(deferred: Mapping[str, Any], at_arrival: Mapping[str, Any]) -> dict[str, Any]:
    """The queue's figures beside the at-arrival run's (suffix ``_at_arrival``) and the change."""
    out = dict(deferred)
    for key in AT_ARRIVAL_KEYS:
        out[f"{key}_at_arrival"] = at_arrival.get(key)
    for key, name in (("deferred_gco2e_per_request", "deferred_gco2e_change"),
                      ("deferred_j_per_request", "deferred_j_change"),
                      ("deferred_g_per_kwh", "deferred_g_per_kwh_change")):
        now, before = out.get(key), at_arrival.get(key)
        out[name] = now / before - 1.0 if now is not None and before else None
    return out
