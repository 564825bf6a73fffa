"""The regimes of ARCHITECTURE section 4 and issue 10, on the shipped (fitted) profiles.

Each test prints the figures it compares (run with -s to see them). J per output token at a
context c is the steady state of ``scheduler.energy.published``: every running sequence at
context c, the request's own prefill shared over its outputs.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.energy.step import EnergyCoefficients

LLAMA_8B = MODEL_CATALOGUE["llama-3.1-8b"]
H100, H200 = GPU_CATALOGUE["H100-80GB"], GPU_CATALOGUE["H200-141GB"]
MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen3-32b", "llama-3.1-70b")
ENERGY = ProfileEnergyModel()


def coefficients(batch: float, context: float, model: str = "llama-3.1-8b", gpu: str = "H100-80GB",
                 tp: int | None = None) -> EnergyCoefficients:
    profile = ENERGY.library.get(model, gpu)
    assert profile is not None
    return ENERGY.coefficients(MODEL_CATALOGUE[model], GPU_CATALOGUE[gpu], "bf16", tp or profile.tensor_parallel,
                               batch, context)


def j_per_token(batch: float, context: int, output: int = 256, **pool: str) -> float:
    """Energy per output token of a request with ``context`` prompt tokens at ``batch``, the
    other sequences as far into their requests as it is on average."""
    c = coefficients(batch, context + output / 2, **pool)  # type: ignore[arg-type]
    return c.joules(context, 0, output) / output


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=256, max_value=65_536), st.sampled_from(MODELS))
def test_prefill_energy_per_token_grows_with_the_prompt(prompt: int, model: str) -> None:
    """Attention pairs grow with the square of the prompt: prefill J/token (beyond the fixed
    per-request share of a step) rises with length."""
    c = coefficients(16, prompt, model)
    per_token = [(c.prefill_joules(n, 0) - c.start_j) / n for n in (prompt, 2 * prompt)]
    assert per_token[1] > per_token[0]


def test_prefill_is_superlinear_at_long_prompts() -> None:
    c = coefficients(16, 100_000)
    ratio = c.prefill_joules(100_000, 0) / (10 * c.prefill_joules(10_000, 0))
    print(f"\nprefill of 100k tokens / (10 x prefill of 10k tokens) = {ratio:.2f}; "
          f"{c.prefill_joules(100_000, 0) / 1e3:.1f} kJ at 100k")
    assert ratio > 1.5


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpu", ["H100-80GB", "H200-141GB", "A100-80GB"])
def test_batching_gain_shrinks_as_context_grows(model: str, gpu: str) -> None:
    gains = {ctx: j_per_token(1, ctx, model=model, gpu=gpu) / j_per_token(64, ctx, model=model, gpu=gpu)
             for ctx in (512, 8192, 65_536)}
    print(f"\n{model} on {gpu}: J/token batch 1 / batch 64: "
          + ", ".join(f"context {k}: {v:.1f}x" for k, v in gains.items()))
    assert gains[512] > gains[8192] > gains[65_536]
    assert gains[65_536] < gains[512] / 2


@pytest.mark.parametrize("model", MODELS)
def test_long_sequences_cost_several_times_short_ones_turning_near_a_thousand_tokens(model: str) -> None:
    """Sequences of 128 prompt tokens and N outputs, as many running as vLLM allows (256, or
    fewer when their KV cache fills the replica's HBM): J/token at N = 32k is several times
    that at N = 512, and at batch 256 the KV reads overtake the rest of a decode step within a
    few thousand tokens of context."""
    capacity = ENERGY.rated_costs(MODEL_CATALOGUE[model], H100, "bf16",
                                  ENERGY.library.get(model, "H100-80GB").tensor_parallel  # type: ignore[union-attr]
                                  ).costs.kv_capacity_tokens

    def per_token(output: int) -> float:
        batch = max(1.0, min(256.0, capacity / (128 + output)))
        return j_per_token(batch, 128, output, model=model)

    short, long = per_token(512), per_token(32_768)
    c = coefficients(256, 0, model)
    turn = c.step_j / c.step_j_per_context_token
    print(f"\n{model} on H100: {short:.4f} J/token at 512 outputs, {long:.4f} at 32k ({long / short:.1f}x); "
          f"at batch 256 the KV reads equal the rest of a decode step at {turn:.0f} tokens")
    assert long > 3 * short
    assert 300 < turn < 5000


def test_batch_amortisation_at_short_context() -> None:
    """Batch 1: the step's weight reads are borne by one sequence, so a longer output barely
    lowers J/token. Batch 64: they are shared and J/token falls by an order of magnitude."""
    b1 = coefficients(1, 128)
    short_b1, long_b1 = b1.joules(128, 0, 128) / 128, b1.joules(128, 0, 1024) / 1024
    short_b64 = j_per_token(64, 128, 128)
    print(f"\nbatch 1: {short_b1:.3f} J/token at 128 out, {long_b1:.3f} at 1024 out; "
          f"batch 64: {short_b64:.4f} J/token ({short_b1 / short_b64:.1f}x less)")
    assert long_b1 < short_b1 * 1.05
    assert short_b64 < short_b1 / 10


@pytest.mark.parametrize("model", MODELS)
def test_h200_bandwidth_lowers_decode_energy_at_equal_power(model: str) -> None:
    """Same die, same TDP, 4.8 vs 3.35 TB/s: the memory-bound terms scale with 1 / bandwidth."""
    tp = max(ENERGY.library.get(model, g).tensor_parallel for g in ("H100-80GB", "H200-141GB"))  # type: ignore[union-attr]
    steps = {}
    for gpu in (H100, H200):
        rated = ENERGY.rated_costs(MODEL_CATALOGUE[model], gpu, "bf16", tp)
        c = coefficients(32, 2048, model, gpu.name, tp)
        steps[gpu.name] = (c.step_j + c.step_j_per_context_token * 2048, rated.costs.e_kv)
    print(f"\n{model} tp{tp} decode J per sequence-step at batch 32, context 2048: "
          + ", ".join(f"{g}: {j:.4f}" for g, (j, _) in steps.items()))
    assert H100.tdp_w == H200.tdp_w
    assert steps["H200-141GB"][0] < steps["H100-80GB"][0]
    assert steps["H200-141GB"][1] / steps["H100-80GB"][1] == pytest.approx(
        H100.mem_bandwidth_gbs / H200.mem_bandwidth_gbs, rel=1e-4)  # profiles keep 6 digits


@given(st.integers(min_value=1, max_value=32_768), st.floats(min_value=0.0, max_value=1.0),
       st.integers(min_value=1, max_value=4096))
@settings(max_examples=80, deadline=None)
def test_prefix_cache_removes_prefill_not_decode(prompt: int, cached_share: float, output: int) -> None:
    c = coefficients(16, 4096)
    cached = int(prompt * cached_share)
    cold, warm = c.estimate(prompt, 0, output), c.estimate(prompt, cached, output)
    assert warm.decode_j == cold.decode_j  # cached KV is still read every step
    assert cold.prefill_j - warm.prefill_j == pytest.approx(c.avoided_j(prompt, cached), rel=1e-9, abs=1e-9)
    assert warm.energy_j <= cold.energy_j


def test_energy_optimal_budget_far_below_accuracy_optimal() -> None:
    """A reasoning model whose accuracy saturates with its thinking budget N,
    acc(N) = a_max (1 - exp(-N / tau)), tau = 4000 tokens: because E grows faster than N (the
    KV term), the energy-optimal budget (min J per correct answer) is at most a third of the
    accuracy-optimal one (acc at 99 % of a_max)."""
    tau, a_max = 4000.0, 0.8
    budgets = range(250, 32_769, 250)
    accuracy_optimal = min(n for n in budgets if 1 - math.exp(-n / tau) >= 0.99)
    joules_per_correct = {
        n: coefficients(32, 1024 + n / 2, "qwen3-32b", "H200-141GB").joules(1024, 0, n)
        / (a_max * (1 - math.exp(-n / tau)))
        for n in budgets
    }
    energy_optimal = min(joules_per_correct, key=joules_per_correct.__getitem__)
    print(f"\nqwen3-32b on H200, batch 32: accuracy-optimal budget {accuracy_optimal} tokens "
          f"({joules_per_correct[accuracy_optimal]:.0f} J per correct answer); energy-optimal "
          f"{energy_optimal} tokens ({joules_per_correct[energy_optimal]:.0f} J)")
    assert energy_optimal <= accuracy_optimal / 3
    assert joules_per_correct[energy_optimal] < 0.5 * joules_per_correct[accuracy_optimal]
