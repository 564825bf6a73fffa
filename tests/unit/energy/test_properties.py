"""One test per property of ARCHITECTURE section 4, on the shipped profiles.

Each test prints the figures it compares (run with -s to see them).
"""

from __future__ import annotations

import math

import pytest

from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model import EnergyCoefficients
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.profile_model import ProfileEnergyModel

LLAMA_8B = MODEL_CATALOGUE["llama-3.1-8b"]
H100 = GPU_CATALOGUE["H100-80GB"]


@pytest.fixture(scope="module")
def energy() -> ProfileEnergyModel:
    return ProfileEnergyModel()


def per_token(c: EnergyCoefficients, context: int, output: int, cached: int = 0) -> float:
    return c.joules(context, cached, output) / output


def test_batch_amortisation_at_short_context(energy: ProfileEnergyModel) -> None:
    """Batch 1: the step's weight reads are borne by one sequence, so a longer output barely
    lowers J/token. Batch 64: they are shared and J/token falls by an order of magnitude."""
    b1 = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 1)
    b64 = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 64)
    short_b1, long_b1 = per_token(b1, 128, 128), per_token(b1, 128, 1024)
    short_b64 = per_token(b64, 128, 128)
    print(f"\nbatch 1: {short_b1:.3f} J/token at 128 out, {long_b1:.3f} at 1024 out; "
          f"batch 64: {short_b64:.4f} J/token at 128 out ({short_b1 / short_b64:.1f}x less)")
    assert long_b1 < short_b1
    assert (short_b1 - long_b1) / short_b1 < 0.05  # barely lower
    assert short_b64 < short_b1 / 10  # falls a lot


def test_kv_reads_dominate_long_outputs(energy: ProfileEnergyModel) -> None:
    """At batch 64, J/token first falls as the fixed part is spread, then rises again as every
    step reads a longer KV cache; at 32k tokens the KV reads are most of the step."""
    c = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 64)
    outputs = [16, 64, 256, 1024, 4096, 16384, 32768]
    curve = [per_token(c, 512, n) for n in outputs]
    best = min(range(len(outputs)), key=curve.__getitem__)
    kv_share_end = c.step_j_per_context_token * (512 + 32768 / 2) / (
        c.step_j + c.step_j_per_context_token * (512 + 32768 / 2))
    print("\nJ/token by output length at batch 64, context 512: "
          + ", ".join(f"{n}: {v:.4f}" for n, v in zip(outputs, curve, strict=True))
          + f"; KV share of the step at 32k: {kv_share_end:.0%}")
    assert 0 < best < len(outputs) - 1  # falls, then rises again
    assert curve[-1] > 2 * curve[best]
    assert kv_share_end > 0.5


def test_batching_gain_shrinks_as_context_grows(energy: ProfileEnergyModel) -> None:
    b1 = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 1)
    b64 = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 64)
    gains = {ctx: per_token(b1, ctx, 256) / per_token(b64, ctx, 256) for ctx in (512, 8192, 65536)}
    print("\nJ/token batch 1 / batch 64, output 256: "
          + ", ".join(f"context {k}: {v:.1f}x" for k, v in gains.items()))
    assert gains[512] > gains[8192] > gains[65536]
    assert gains[65536] < gains[512] / 3


def test_prefix_cache_saves_prefill_not_decode(energy: ProfileEnergyModel) -> None:
    c = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 16)
    cold = c.estimate(4096, 0, 256)
    warm = c.estimate(4096, 3072, 256)
    print(f"\nprefill_j cold {cold.prefill_j:.2f} vs 3072 cached {warm.prefill_j:.2f} "
          f"(avoided {c.avoided_j(3072):.2f}); decode_j {cold.decode_j:.2f} vs {warm.decode_j:.2f}")
    assert warm.decode_j == cold.decode_j  # cached KV is still read every step
    assert cold.prefill_j - warm.prefill_j == pytest.approx(c.avoided_j(3072))
    assert c.avoided_j(3072) == pytest.approx(3072 * c.prefill_j_per_token)
    assert warm.energy_j < cold.energy_j


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "qwen3-32b", "llama-3.1-70b"])
def test_bandwidth_richer_gpu_spends_less_per_decode_step(energy: ProfileEnergyModel, model_name: str) -> None:
    model = MODEL_CATALOGUE[model_name]
    steps = {}
    for gpu_name in ("A100-40GB", "H100-80GB", "H200-141GB"):
        gpu = GPU_CATALOGUE[gpu_name]
        profile = energy.library.get(model_name, gpu_name)
        assert profile is not None
        c = energy.coefficients(model, gpu, "bf16", profile.tensor_parallel, 32)
        steps[gpu_name] = (c.step_j + c.step_j_per_context_token * 2048, gpu.mem_bandwidth_gbs)
    print(f"\n{model_name} decode J per sequence-step at batch 32, context 2048: "
          + ", ".join(f"{g} ({bw:.0f} GB/s): {j:.4f}" for g, (j, bw) in steps.items()))
    assert steps["H200-141GB"][0] < steps["H100-80GB"][0] < steps["A100-40GB"][0]


def test_idle_floor_counts_while_waiting(energy: ProfileEnergyModel) -> None:
    """A request that waits is charged its share of the replica's floor power, linearly."""
    c = energy.coefficients(LLAMA_8B, H100, "bf16", 1, 4)
    now = c.estimate(512, 0, 128)
    waited = c.estimate(512, 0, 128, wait_s=3.0)
    print(f"\nidle floor {H100.idle_w} W shared by batch 4: idle_j {waited.idle_j:.1f} J after 3 s "
          f"({now.energy_j:.1f} -> {waited.energy_j:.1f} J)")
    assert now.idle_j == 0.0
    assert waited.idle_j == pytest.approx(H100.idle_w / 4 * 3.0)
    assert waited.energy_j == pytest.approx(now.energy_j + waited.idle_j)
    assert c.estimate(512, 0, 128, wait_s=6.0).idle_j == pytest.approx(2 * waited.idle_j)


def test_energy_optimal_budget_far_below_accuracy_optimal(energy: ProfileEnergyModel) -> None:
    """A reasoning model whose accuracy saturates with its thinking budget N,
    acc(N) = a_max (1 - exp(-N / tau)), tau = 4000 tokens. The accuracy-optimal budget is where
    acc reaches 99 % of a_max (tau ln 100 ~ 18k tokens); the energy-optimal budget minimises
    the expected joules per correct answer E(N) / acc(N). Because E grows faster than N (the
    KV term), the energy optimum is at most a third of the accuracy optimum."""
    model, gpu = MODEL_CATALOGUE["qwen3-32b"], GPU_CATALOGUE["H200-141GB"]
    c = energy.coefficients(model, gpu, "bf16", 1, 32)
    tau, a_max = 4000.0, 0.8
    budgets = range(250, 32769, 250)
    accuracy_optimal = min(n for n in budgets if 1 - math.exp(-n / tau) >= 0.99)
    joules_per_correct = {n: c.joules(1024, 0, n) / (a_max * (1 - math.exp(-n / tau))) for n in budgets}
    energy_optimal = min(joules_per_correct, key=joules_per_correct.__getitem__)
    print(f"\nqwen3-32b on H200, batch 32: accuracy-optimal budget {accuracy_optimal} tokens "
          f"({joules_per_correct[accuracy_optimal]:.0f} J per correct answer); energy-optimal "
          f"{energy_optimal} tokens ({joules_per_correct[energy_optimal]:.0f} J per correct answer, "
          f"accuracy {1 - math.exp(-energy_optimal / tau):.0%} of attainable)")
    assert energy_optimal <= accuracy_optimal / 3
    assert joules_per_correct[energy_optimal] < 0.5 * joules_per_correct[accuracy_optimal]
