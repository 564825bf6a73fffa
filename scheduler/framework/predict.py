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

Where the snapshot knows the request's prefix warm (``snapshot.prefix_warm[prefix_key]``: a
region published a prefix-cache hit for it on that pool, fresh within the policy's
``max_age.prefix_cache``), that candidate's U is smaller:

    cached = max(request.cached_tokens, min(the hit's cached tokens, L))
    L      = the prefix the request shares under its key (``shareable_prefix``):
             request.shared_prefix_tokens when given, else the policy's prefix_key_tokens
             (the head a prefix key is hashed from), at most C

so a long context cached under a key (a chain's history) is never credited to another request
that shares only the key's head (its system prompt). A chain's (or a DAG's) step is also
credited its own workflow's last prompt, min(that prompt, C), on the pool the workflow last ran
on (``snapshot.workflows``): its history is the head of its prompt. The candidate's energy and
TTFT rows are evaluated again at those features (the avoided prefill of
``EnergyCoefficients.avoided_j``, per candidate, never per request), and ``view.cached_tokens``
says what each candidate was credited.
"""

from __future__ import annotations

import numpy as np

from scheduler.framework.columns import FloatArray, Frame, IndexArray, frame
from scheduler.framework.network import rtt_s
from scheduler.framework.plugin import RequestView
from scheduler.types import FleetSnapshot, Request


def _features(prompt: float, cached: float, out: float) -> FloatArray:
    uncached = max(0.0, prompt - min(cached, prompt))
    mid_context = prompt + out * 0.5
    return np.array((1.0, uncached, uncached * (prompt - uncached * 0.5), mid_context, out, out * mid_context))


def shareable_prefix(request: Request, snapshot: FleetSnapshot) -> int:
    """L: the most prompt tokens a hit of the request's prefix key may be credited with (the
    module docstring)."""
    shared = request.shared_prefix_tokens
    return min(snapshot.policy.prefix_key_tokens if shared is None else shared, request.prompt_tokens)


def warm_tokens(request: Request, snapshot: FleetSnapshot) -> dict[tuple[str, str], int]:
    """(region, pool) -> the prompt tokens its prefix cache is credited with for ``request``
    (the module docstring); empty where nothing is known warm."""
    key = request.prefix_key
    places = snapshot.prefix_warm.get(key) if key else None
    shareable = shareable_prefix(request, snapshot) if places else 0
    tokens = {(w.region, w.pool): min(w.cached_tokens, shareable) for w in places or ()}
    if request.workflow_id and not request.holdable:
        home = snapshot.workflows.get(request.workflow_id)
        if home is not None:
            place = (home.region, home.pool)
            tokens[place] = max(tokens.get(place, 0), min(home.cached_tokens, request.prompt_tokens))
    return tokens


def warm_positions(request: Request, snapshot: FleetSnapshot, base: IndexArray) -> list[tuple[int, int]]:
    """(position in ``base``, cached tokens) of each candidate where the request's prefix is
    warm beyond ``request.cached_tokens`` (empty: nowhere)."""
    tokens = warm_tokens(request, snapshot)
    if not tokens:
        return []
    candidates = snapshot.candidates
    out = []
    for position, index in enumerate(base.tolist()):
        candidate = candidates[index]
        cached = tokens.get((candidate.region.name, candidate.pool.name), 0)
        if cached > request.cached_tokens:
            out.append((position, cached))
    return out


def request_view(request: Request, snapshot: FleetSnapshot, base: IndexArray, columns: Frame | None = None) -> RequestView:
    """The request's predictions over the candidates at ``base``, from the framework's
    ``columns`` for them (None: made here from scratch)."""
    cols = frame(snapshot, request.model, base) if columns is None else columns
    prompt = float(request.prompt_tokens)
    out = float(request.max_tokens)
    features = _features(prompt, float(request.cached_tokens), out)
    # energy_j of every candidate, then ttft_s without RTT, then tpot_s
    predicted = np.dot(cols.prediction, features)
    n = len(base)
    cached_tokens: FloatArray | None = None
    warm = warm_positions(request, snapshot, base) if snapshot.prefix_warm or snapshot.workflows else ()
    if warm:
        cached_tokens = np.full(n, float(request.cached_tokens))
        for position, cached in warm:
            at_warm = _features(prompt, float(cached), out)
            predicted[position] = np.dot(cols.prediction[position], at_warm)
            predicted[n + position] = np.dot(cols.prediction[n + position], at_warm)
            cached_tokens[position] = cached
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
        predicted[:n], cols.live, cols.key_hash, cached_tokens,
    )
