"""``scheduler bench sim-vs-real`` end to end on a real vLLM CPU engine (the tiny model), kept
small: the quick calibration sweep and six replayed requests (about 40 s, most of it the
engine's start). The figures themselves are in docs/simulation.md; this checks the plumbing."""

from __future__ import annotations

import json
import os

import pytest

from scheduler.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.integration]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@pytest.mark.timeout(300)
def test_sim_vs_real_replays_the_same_requests_through_vllm_and_the_simulator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)
    # On the in-process engine: this file runs without Ray (the region path is in
    # tests/integration/serve, on the session's region).
    code = main(["bench", "sim-vs-real", "--through", "engine", "--requests", "6", "--rate", "4", "--quick", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    # vLLM may log to stdout when another test imported it first: the JSON is the rest.
    report = json.loads(out[out.index('{\n  "scenario"'):])
    assert report["scenario"]["requests"] == 6 and report["scenario"]["through"] == "engine"
    costs = report["step_costs"]
    assert costs["max_num_seqs"] == 32 and costs["max_batched_tokens"] > 0 and costs["kv_capacity_tokens"] > 0
    assert costs["t_step"] > 0 and all(costs[k] >= 0 for k in ("t_token", "t_kv", "t_pair"))
    assert report["calibration_observations"]["prefill"] == 3 and report["calibration_observations"]["decode"] >= 1
    for side in ("real", "sim"):
        figures = report[side]
        assert 0 < figures["ttft_p50_ms"] <= figures["ttft_p99_ms"] < 5000, side
        assert figures["ttft_p50_ms"] < figures["done_p50_ms"] <= figures["done_p99_ms"], side
    # The same requests on both sides, and a simulated TTFT of the engine's order of magnitude.
    assert report["sim"]["ttft_p50_ms"] == pytest.approx(report["real"]["ttft_p50_ms"], rel=3.0)

