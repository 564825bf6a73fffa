"""What the scheduler predicted for a request on the pool it ran on, and the RTT it assumed.

An adapter over the decision function's inputs, the one place the simulator reads them: the
candidate's ``CandidatePerf`` in the snapshot the decision used (the step model's
coefficients at the pool's published batch, ``scheduler.energy.step.predict``) and the
framework's network model (``scheduler.framework.network``):

    energy_j = perf.energy.joules(P, cached, N)
    ttft_s   = RTT + perf.queue_wait_s + prefill_s + U x prefill_s_per_token + pairs x prefill_s_per_pair
    U = P - cached, pairs = U (P - U / 2)          (P prompt, N output tokens)
    cached   = max(the request's cached tokens, min(the snapshot's published hit of its prefix
               key on that pool, P))             (the framework's credit, scheduler.framework.predict)
    RTT      = 2 x great-circle km x 1.4 / 200,000 km/s + 2 ms

The simulator records these beside what it measured, for the report's prediction errors.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scheduler.datalayer.pending import prefill_s
from scheduler.framework.network import rtt_row
from scheduler.framework.predict import warm_tokens
from scheduler.types import Candidate, FleetSnapshot, GeoPoint, Request


class Predictions:
    def __init__(self) -> None:
        self._rtt: dict[tuple[float, float, str], float] = {}

    def rtt_s(self, client: GeoPoint | None, candidate: Candidate) -> float:
        if client is None:
            return 0.0
        key = (client.lat, client.lon, candidate.region.name)
        rtt = self._rtt.get(key)
        if rtt is None:
            where = candidate.region.location
            rtt = float(rtt_row(np.radians([where.lat]), np.radians([where.lon]), client)[0])
            self._rtt[key] = rtt
        return rtt

    def energy_and_ttft(self, snapshot: FleetSnapshot, request: Request, candidate: Candidate) -> tuple[float, float]:
        """Predicted joules and TTFT [s] of ``request`` on ``candidate`` in ``snapshot``."""
        energy_j, ttft_s, _, _ = self.at_dispatch(snapshot, request, candidate)
        return energy_j, ttft_s

    def at_dispatch(self, snapshot: FleetSnapshot, request: Request,
                    candidate: Candidate) -> tuple[float, float, float, float]:
        """``energy_and_ttft``'s joules and TTFT [s], the RTT [s] and ``prefill_s(snapshot,
        candidate, request)`` (the request's own cached tokens: what the router's pending
        dispatches count), each looked up once for a dispatch."""
        perf = snapshot.perf[candidate.index]
        prompt = request.prompt_tokens
        rtt = self.rtt_s(request.client_location, candidate)
        own = prefill_s(snapshot, candidate, request)
        cached = credited_tokens(snapshot, request, candidate)
        if cached > request.cached_tokens:
            credited = dataclasses.replace(request, cached_tokens=cached)
            energy_j = perf.energy.joules(prompt, min(cached, prompt), request.max_tokens)
            return energy_j, rtt + perf.queue_wait_s + prefill_s(snapshot, candidate, credited), rtt, own
        energy_j = perf.energy.joules(prompt, min(request.cached_tokens, prompt), request.max_tokens)
        return energy_j, rtt + perf.queue_wait_s + own, rtt, own


def credited_tokens(snapshot: FleetSnapshot, request: Request, candidate: Candidate) -> int:
    """The cached tokens the framework credits ``request`` with on ``candidate``: its own, or
    what ``scheduler.framework.predict.warm_tokens`` credits it with on that pool."""
    cached = request.cached_tokens
    if not snapshot.prefix_warm and not snapshot.workflows:
        return cached
    warm = warm_tokens(request, snapshot).get((candidate.region.name, candidate.pool.name), 0)
    return max(cached, warm)
