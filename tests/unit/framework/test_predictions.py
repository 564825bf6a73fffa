"""The per-request predictions the framework computes as one matrix product agree with the
step model's own ``EnergyCoefficients.joules`` and ``LatencyCoefficients``, candidate by
candidate: the columns must never drift from the model."""

from __future__ import annotations

import random

import pytest

from scheduler.config.synthetic import synthetic_fleet
from scheduler.framework.predict import request_view
from scheduler.framework.state import selected
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.types import PoolLiveState, RegionLiveState, Request
from tests.literals import NOW


@pytest.mark.parametrize("seed", range(5))
def test_matrix_predictions_match_the_models(make_snapshot, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    regions = synthetic_fleet(6, 3, seed)
    live = [RegionLiveState(r.name, True, NOW, {p.name: PoolLiveState(running=rng.randint(0, 500),
                                                                      queue_depth=rng.randint(0, 50))
                                                for p in r.pools}) for r in regions]
    snapshot = make_snapshot(regions, live=live)
    prompt = rng.randint(1, 30000)
    request = Request("p", "llama-3.1-8b", prompt, rng.randint(1, 2000), cached_tokens=rng.randint(0, prompt))
    base, _ = selected(ModelIndex(), request, snapshot)
    view = request_view(request, snapshot, base)
    for position, index in enumerate(base.tolist()):
        perf = snapshot.perf[index]
        joules = perf.energy.joules(request.prompt_tokens, request.cached_tokens, request.max_tokens)
        uncached = request.prompt_tokens - request.cached_tokens
        t = perf.latency
        ttft = (perf.queue_wait_s + t.prefill_s + uncached * t.prefill_s_per_token
                + uncached * (request.prompt_tokens - uncached / 2) * t.prefill_s_per_pair)
        tpot = t.tpot_s + t.tpot_s_per_context_token * (request.prompt_tokens + request.max_tokens / 2)
        assert view.energy_j[position] == pytest.approx(joules, rel=1e-9)
        assert view.ttft_s[position] == pytest.approx(ttft, rel=1e-9)
        assert view.tpot_s[position] == pytest.approx(tpot, rel=1e-9)
