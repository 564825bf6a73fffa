"""The simulator's truth model (scheduler.sim.truth): the model-form truth's KV knee, GPU bias
and RTT jitter, each against what it is built from, and the rated truth kept as it was."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler.energy.step import StepCosts
from scheduler.energy.validate import rows
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.engine import Scenario, Simulation
from scheduler.sim.replica import KvKnee, Seq, replay
from scheduler.sim.truth import EXACT_TRUTH, RTT_BLOCK, HeldOutResiduals, TruthModel, energy_bias, truth_costs
from scheduler.sim.workload import WorkloadConfig, build_workload, load_trace
from tests.unit.sim.kit import OSLO, PARIS, START, Files, europe_only, policy, region

COSTS = StepCosts(t_step=0.01, t_token=0.001, t_kv=1e-4, t_pair=1e-5, e_step=10.0, e_token=1.0, e_kv=0.1,
                  e_pair=0.01, idle_w=50.0, max_num_seqs=4, max_batched_tokens=8192, kv_capacity_tokens=100_000)


def test_the_rated_truth_is_the_old_per_pool_noise_and_nothing_else() -> None:
    rated = TruthModel.rated(0.2)
    assert rated.name == "rated" and rated.knee is None and rated.exact_rtt and not rated.gpu_bias
    assert rated.costs(COSTS, "H100-80GB", 3, "eu/h100") == truth_costs(COSTS, 0.2, 3, "eu/h100")
    assert EXACT_TRUTH.costs(COSTS, "H100-80GB", 3, "eu/h100") is COSTS
    assert TruthModel().name == "model-form"


@pytest.mark.parametrize("field, value", [("pool_sigma", -0.1), ("rtt_sigma", -1.0), ("rtt_tail_share", 1.5),
                                          ("kv_knee_factor", 0.5), ("kv_knee_tokens", -1)])
def test_a_truth_model_refuses_impossible_parameters(field: str, value: float) -> None:
    with pytest.raises(ValueError):
        TruthModel(**{field: value})


@pytest.mark.parametrize("tokens, prompt, steps", [(10, 3, 20), (10, 10, 5), (10, 15, 4), (0, 1, 1), (100, 1, 50)])
def test_the_knee_sums_match_a_plain_count(tokens: int, prompt: int, steps: int) -> None:
    knee = KvKnee(tokens, 3.0)
    assert knee.excess_sum(prompt, steps) == sum(max(0, prompt + k - tokens) for k in range(1, steps + 1))
    assert knee.read(tokens + 4) == tokens + 4 + 2.0 * 4
    assert knee.read(tokens) == tokens


def test_a_long_context_alone_pays_its_reads_past_the_knee() -> None:
    # A 5,000-token prompt (one prefill chunk, nothing in the cache before it: no KV read), then
    # 99 decode steps at contexts 5,001 ... 5,099: past a 4,096-token knee at 1.5x, each step
    # reads 0.5 x (context - 4,096) KV tokens more, at 0.1 J and 0.1 ms a token.
    plain, kneed = Seq(0.0, 5000, 100), Seq(0.0, 5000, 100)
    replay(COSTS, [plain])
    replay(COSTS, [kneed], knee=KvKnee(4096, 1.5))
    excess = sum(5000 + k - 4096 for k in range(1, 100))
    assert kneed.energy_j - plain.energy_j == pytest.approx(0.1 * 0.5 * excess, rel=1e-12)
    assert kneed.done - plain.done == pytest.approx(1e-4 * 0.5 * excess, rel=1e-9)
    assert kneed.first_token == plain.first_token


def test_the_held_out_residuals_are_the_validation_tables_errors() -> None:
    residuals = HeldOutResiduals.load()
    table = rows()
    for gpu in ("H100-80GB", "B200"):
        assert sorted(residuals.by_gpu[gpu]) == sorted(r.error for r in table if r.gpu == gpu)
    assert len(residuals.by_gpu["H100-80GB"]) == 45 and len(residuals.by_gpu["B200"]) == 29
    # GPUs without points of their own draw from their interval class: the fit measured H100 only.
    assert residuals.for_gpu("H200-141GB") == residuals.for_gpu("A100-80GB") == residuals.by_gpu["B200"]
    assert residuals.for_gpu("H100-80GB") == residuals.by_gpu["H100-80GB"]


def test_the_gpu_bias_is_seeded_per_gpu_type_and_follows_the_held_out_residuals() -> None:
    residuals = HeldOutResiduals.load()
    truth = dataclasses.replace(TruthModel(), pool_sigma=0.0)
    # Every pool of one GPU type gets the same factor; the pool's name does not enter.
    one = truth.costs(COSTS, "H200-141GB", 5, "eu/h200", residuals)
    assert one == truth.costs(COSTS, "H200-141GB", 5, "us/h200-long", residuals)
    assert one.t_step == COSTS.t_step and one.idle_w == COSTS.idle_w  # energy only
    factor = one.e_step / COSTS.e_step
    assert min(abs(1.0 / factor - 1.0 - e) for e in residuals.for_gpu("H200-141GB")) < 1e-12
    assert one.e_kv / COSTS.e_kv == pytest.approx(factor) and one.e_token / COSTS.e_token == pytest.approx(factor)
    # Over many seeds the drawn errors are the held-out ones, each about equally often.
    h100 = residuals.for_gpu("H100-80GB")
    drawn = [round(1.0 / energy_bias(h100, seed, "H100-80GB") - 1.0, 9) for seed in range(4000)]
    assert set(drawn) == {round(e, 9) for e in h100}
    assert np.mean(drawn) == pytest.approx(np.mean(h100), abs=0.005)
    with pytest.raises(ValueError, match="held-out residuals"):
        truth.costs(COSTS, "H100-80GB", 0, "eu/h100")


def test_rtt_draws_are_per_request_row_whatever_the_shard() -> None:
    truth = TruthModel()
    factors, tails = truth.rtt_draws(7, 0, 3 * RTT_BLOCK)
    shard_f, shard_t = truth.rtt_draws(7, RTT_BLOCK - 5, RTT_BLOCK + 10)
    assert np.array_equal(shard_f, factors[RTT_BLOCK - 5:2 * RTT_BLOCK + 5])
    assert np.array_equal(shard_t, tails[RTT_BLOCK - 5:2 * RTT_BLOCK + 5])
    assert np.std(np.log(factors)) == pytest.approx(truth.rtt_sigma, rel=0.05)
    assert np.mean(tails > 0) == pytest.approx(truth.rtt_tail_share, abs=0.004)
    assert set(np.unique(tails)) == {0.0, truth.rtt_tail_s}
    assert not np.array_equal(truth.rtt_draws(8, 0, 10)[0], factors[:10])


def _run(files: Files, truth: TruthModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: measured TTFT, measured J and predicted J, one request every 5 s on two
    idle regions (a queue never forms)."""
    regions = (region("eu", "DIRTY", PARIS), region("north", "CLEAN", OSLO))
    workload = build_workload(load_trace(str(files.trace)), WorkloadConfig(
        start=START.timestamp(), hours=0.2, rate=0.2, continents=europe_only()), 0)
    carbon = CarbonReplay.from_dir(files.carbon_dir, [r.grid_zone for r in regions], 2023)
    outcome = Simulation(regions, policy(), workload, carbon, Scenario(truth=truth), 0).outcome(progress=False)
    return outcome.ttft_s, outcome.energy_j, outcome.predicted_j


def test_on_an_idle_fleet_each_part_of_the_truth_moves_what_it_should(files: Files) -> None:
    exact_ttft, exact_j, predicted_j = _run(files, EXACT_TRUTH)
    off = TruthModel(pool_sigma=0.0, kv_knee_factor=1.0, gpu_bias=False, rtt_sigma=0.0, rtt_tail_share=0.0)
    assert off.name == "rated"
    # The GPU bias alone: every request's energy times the H100 factor; times and predictions unchanged.
    bias_ttft, bias_j, bias_predicted = _run(files, dataclasses.replace(off, gpu_bias=True))
    factor = energy_bias(HeldOutResiduals.load().for_gpu("H100-80GB"), 0, "H100-80GB")
    assert factor != 1.0
    np.testing.assert_allclose(bias_j, exact_j * factor, rtol=1e-9)
    np.testing.assert_array_equal(bias_ttft, exact_ttft)
    np.testing.assert_array_equal(bias_predicted, predicted_j)
    # A tail on every request: each TTFT exactly that much later, the energy unchanged.
    tail_ttft, tail_j, _ = _run(files, dataclasses.replace(off, rtt_tail_share=1.0, rtt_tail_s=0.2))
    np.testing.assert_allclose(tail_ttft - exact_ttft, 0.2, atol=1e-6)  # times are epoch seconds
    np.testing.assert_array_equal(tail_j, exact_j)
    # Jitter alone: each TTFT moves the way its request's RTT factor says.
    jitter = dataclasses.replace(off, rtt_sigma=0.3)
    jitter_ttft, _, _ = _run(files, jitter)
    factors, _ = jitter.rtt_draws(0, 0, len(exact_ttft))
    assert np.array_equal(np.sign(jitter_ttft - exact_ttft), np.sign(factors - 1.0))
