"""Per-request predictions over the candidates that serve the model, as columns.

Every prediction is linear in the request features (scheduler.framework.columns):

    features = (1, U, U x (C - U / 2), C + N / 2, N, N x (C + N / 2))
               U uncached prompt tokens, C prompt tokens, N output tokens (max_tokens)
    energy_j = the step model's EnergyCoefficients at the pool's expected batch
               (scheduler.energy.step.predict, via the data layer's CandidatePerf)
    ttft_s   = rtt_s + queue_wait_s + prefill_s (LatencyCoefficients)
    queue_wait_s = the pool's predicted wait (data layer, from live state)
                   + the wait the router's own pending dispatches add (snapshot.pending_wait_s)
    tpot_s   = decode step time at the mid-output context

so one matrix-vector product (the frame's (3 x candidates) x 6 coefficients by the
features) gives them all.
"""

from __future__ import annotations

import numpy as np

from scheduler.framework.columns import IndexArray, frame
from scheduler.framework.network import rtt_s
from scheduler.framework.plugin import RequestView
from scheduler.types import FleetSnapshot, Request


def request_view(request: Request, snapshot: FleetSnapshot, base: IndexArray) -> RequestView:
    cols = frame(snapshot, request.model, base)
    prompt = float(request.prompt_tokens)
    uncached = max(0.0, prompt - min(float(request.cached_tokens), prompt))
    out = float(request.max_tokens)
    mid_context = prompt + out * 0.5
    features = np.array((1.0, uncached, uncached * (prompt - uncached * 0.5), mid_context, out, out * mid_context))
    # energy_j of every candidate, then ttft_s without RTT, then tpot_s
    predicted = np.dot(cols.prediction, features)
    n = len(base)
    rtt = rtt_s(snapshot, cols, request.client_location)
    ttft = predicted[n:2 * n] if rtt is None else predicted[n:2 * n] + rtt
    queue_wait = cols.queue_wait_s
    pending = snapshot.pending_wait_s
    if pending is not None:
        extra = pending[base]
        queue_wait = queue_wait + extra
        ttft = ttft + extra
    return RequestView.of(
        request, snapshot, base, np.zeros(n) if rtt is None else rtt, queue_wait, ttft, predicted[2 * n:],
        predicted[:n], cols.live, cols.key_hash,
    )
