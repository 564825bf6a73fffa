"""Per-request predictions over the candidates that serve the model, as columns.

    rtt_s    = 2 x great-circle km x 1.4 / 200,000 km/s + 2 ms  (0 without a client location;
               scheduler.framework.arrays)
    prefill  = uncached x prefill_s_per_token + uncached x (context - uncached / 2) x prefill_s_per_pair
    ttft_s   = rtt_s + queue_wait_s + prefill
    tpot_s   = decode_step_s + decode_step_s_per_context x (context + max_tokens / 2)
    energy_j = uncached x e_prefill + e_start + N x (e_step + e_step_per_context x (context + N / 2))
               + e_idle_w x queue_wait_s            (EnergyCoefficients.joules, as columns)
"""

from __future__ import annotations

import numpy as np

from scheduler.framework.arrays import FleetArrays, IndexArray
from scheduler.framework.plugin import RequestView
from scheduler.types import FleetSnapshot, Request


def request_view(request: Request, snapshot: FleetSnapshot, base: IndexArray) -> RequestView:
    c: FleetArrays = snapshot.arrays.restricted(request.model, base)
    prompt = float(request.prompt_tokens)
    uncached = max(0.0, prompt - request.cached_tokens)
    out = float(request.max_tokens)
    mid_context = prompt + out * 0.5
    features = np.array((1.0, uncached, uncached * (prompt - uncached * 0.5), mid_context, out, out * mid_context))
    predicted = c.prediction @ features  # candidate x (energy_j, ttft_s without RTT, tpot_s)
    rtt = c.rtt_s(request.client_location)
    ttft = predicted[:, 1] if rtt is None else predicted[:, 1] + rtt
    return RequestView(request, snapshot, c, base, np.zeros(len(base)) if rtt is None else rtt, ttft,
                       predicted[:, 2], predicted[:, 0])
