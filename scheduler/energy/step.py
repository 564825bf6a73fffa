"""One engine iteration of one replica: its time and energy, and the per-request predictor.

vLLM runs a replica in iterations ("steps"). Each step reads the weights once, processes
every scheduled token (one per decoding sequence, plus chunks of prompts being prefilled
under a token budget), reads each decoding sequence's KV cache and computes attention over
(query, key) pairs. Time and energy of a step are linear in what it holds:

    x = (1, tokens, kv_tokens_read, attention_pairs)
    time_s   = t_step + t_token x tokens + t_kv x kv_tokens_read + t_pair x attention_pairs
    energy_j = e_step + e_token x tokens + e_kv x kv_tokens_read + e_pair x attention_pairs

- t_step / e_step: weight reads (memory-bound) plus the per-step launch and scheduling
  overhead; shared by every sequence in the step.
- t_token / e_token: the linear layers' FLOPs of one token (compute-bound).
- t_kv / e_kv: reading one token's K and V of every layer (memory-bound). A decoding
  sequence of context c reads c of them per step; a prefill chunk reads the KV of the
  prompt tokens before it.
- t_pair / e_pair: attention FLOPs of one (query, key) pair.
- idle_w: the replica's floor power when it runs nothing (not attributed to any request).

A step's energy is attributed to its sequences: each pays its own tokens, KV reads and
pairs; ``e_step`` is split equally among the sequences in the step. Summing over a request's
steps, at an expected decode batch B (this request included) and a prefill budget M' tokens
per step (the budget left after the other B - 1 decodes), gives the predictor
(``predict``), linear in the request features of ``scheduler.framework`` (uncached tokens U,
attention pairs of the prefill, output tokens N, mid-output context C + N / 2):

    prefill: 1 + U / M' steps (at least one; ceil(U / M') bounded linearly from above)
    E = U (e_token + e_step / (B M')) + pairs (e_pair + e_kv / M') + e_step / B
        + (N - 1) (e_step / B + e_token) + (N - 1) (C + N / 2) (e_kv + e_pair)
    the steps others run meanwhile: tau = t_step + (B - 1) (t_token + C_others (t_kv + t_pair))
    prefill_s = (1 + U / M') tau + U t_token + pairs (t_pair + t_kv / M')
    tpot_s    = tau + t_token + (C + N / 2) (t_kv + t_pair)

where C_others is the mean context of the other running sequences. The first output token
comes from the step that ends the prefill, so N output tokens take N - 1 decode steps, at
contexts C + 1 ... C + N - 1 (mean C + N / 2). The simulator runs the
same ``StepCosts`` step by step (``scheduler.sim``), so what the router predicts and what the
simulator plays out differ only by the batch the request really met, the queue it really
waited in and the truth model's error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import PRECISION_BYTES, ModelSpec

# vLLM's defaults: sequences one replica runs at most, and the chunked-prefill token budget
# per step (max_num_batched_tokens for the OpenAI server on large-memory GPUs).
VLLM_MAX_NUM_SEQS = 256
VLLM_MAX_BATCHED_TOKENS = 8192
# Share of HBM vLLM may use (its gpu_memory_utilization default).
GPU_MEMORY_UTILIZATION = 0.9
# GPUs whose tensor cores run FP8 math (Ada, Hopper, Blackwell); on the others (A100) an
# FP8 checkpoint runs weight-only (W8A16) kernels: less memory traffic, BF16 math.
FP8_TENSOR_CORE_GPUS = frozenset({"H100-80GB", "H200-141GB", "L4", "B200"})


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Time [s] and energy [J] coefficients of one replica's engine step (see module doc)."""

    t_step: float
    t_token: float
    t_kv: float
    t_pair: float
    e_step: float
    e_token: float
    e_kv: float
    e_pair: float
    idle_w: float
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_batched_tokens: int = VLLM_MAX_BATCHED_TOKENS
    # KV-cache tokens the replica holds across all its sequences.
    kv_capacity_tokens: int = 0

    def step_time(self, tokens: float, kv_tokens: float, pairs: float) -> float:
        return self.t_step + self.t_token * tokens + self.t_kv * kv_tokens + self.t_pair * pairs

    def step_energy(self, tokens: float, kv_tokens: float, pairs: float) -> float:
        return self.e_step + self.e_token * tokens + self.e_kv * kv_tokens + self.e_pair * pairs

    def scaled(self, time_factor: float = 1.0, energy_factor: float = 1.0) -> StepCosts:
        """Every time coefficient times ``time_factor`` and energy coefficient times ``energy_factor``."""
        return StepCosts(
            self.t_step * time_factor, self.t_token * time_factor, self.t_kv * time_factor, self.t_pair * time_factor,
            self.e_step * energy_factor, self.e_token * energy_factor, self.e_kv * energy_factor,
            self.e_pair * energy_factor, self.idle_w, self.max_num_seqs, self.max_batched_tokens,
            self.kv_capacity_tokens,
        )

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class RatedCosts:
    """A replica's step costs with how sure they are and where they come from."""

    costs: StepCosts
    # Relative half-width of the prediction interval (0.3 = +-30 %).
    rel_error: float
    provenance: str


@dataclass(frozen=True, slots=True)
class EnergyEstimate:
    energy_j: float
    low_j: float
    high_j: float
    prefill_j: float
    decode_j: float
    idle_j: float
    provenance: str
    # The wake-up of a cold pool the request is sent to, included in energy_j and its interval
    # (scheduler.energy.cold_start; 0: the pool serves already).
    cold_start_j: float = 0.0


@dataclass(frozen=True, slots=True)
class EnergyCoefficients:
    """A request's predicted energy on one replica at one expected batch, linear in its features:

    E = uncached x prefill_j_per_token + pairs x prefill_j_per_pair + start_j
        + (N - 1) x (step_j + step_j_per_context_token x (prompt + N / 2))
    with pairs = uncached x (prompt - uncached / 2) (causal attention of the uncached tokens):
    the prefill, whose last step gives the first token, then N - 1 decode steps.
    """

    prefill_j_per_token: float
    prefill_j_per_pair: float
    start_j: float
    step_j: float
    step_j_per_context_token: float
    # Relative half-width of the prediction interval (0.4 = +-40 %).
    rel_error: float
    provenance: str

    def prefill_joules(self, prompt_tokens: int, cached_tokens: int) -> float:
        uncached = prompt_tokens - cached_tokens if prompt_tokens > cached_tokens else 0
        pairs = uncached * (prompt_tokens - uncached * 0.5)
        return uncached * self.prefill_j_per_token + pairs * self.prefill_j_per_pair + self.start_j

    def decode_joules(self, prompt_tokens: int, output_tokens: int) -> float:
        steps = output_tokens - 1 if output_tokens > 1 else 0
        return steps * (self.step_j + self.step_j_per_context_token * (prompt_tokens + output_tokens * 0.5))

    def joules(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        return self.prefill_joules(prompt_tokens, cached_tokens) + self.decode_joules(prompt_tokens, output_tokens)

    def estimate(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> EnergyEstimate:
        prefill = self.prefill_joules(prompt_tokens, cached_tokens)
        decode = self.decode_joules(prompt_tokens, output_tokens)
        total = prefill + decode
        return EnergyEstimate(
            energy_j=total,
            low_j=total * (1 - self.rel_error),
            high_j=total * (1 + self.rel_error),
            prefill_j=prefill,
            decode_j=decode,
            idle_j=0.0,
            provenance=self.provenance,
        )

    def avoided_j(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Prefill energy the prefix cache saved by serving ``cached_tokens`` from cache."""
        cached = min(max(0, cached_tokens), prompt_tokens)
        return self.prefill_joules(prompt_tokens, 0) - self.prefill_joules(prompt_tokens, cached)


@dataclass(frozen=True, slots=True)
class LatencyCoefficients:
    """A request's predicted prefill time and time per output token on one replica:

    prefill_s = prefill_s + uncached x prefill_s_per_token + pairs x prefill_s_per_pair
    tpot_s    = tpot_s + (prompt + N / 2) x tpot_s_per_context_token
    """

    prefill_s: float
    prefill_s_per_token: float
    prefill_s_per_pair: float
    tpot_s: float
    tpot_s_per_context_token: float


def prefill_budget(costs: StepCosts, batch: float) -> float:
    """Prompt tokens a step prefills for one request: the budget left by the other decodes."""
    return max(1.0, costs.max_batched_tokens - (max(batch, 1.0) - 1.0))


def predict(
    rated: RatedCosts, batch: float, others_context: float
) -> tuple[EnergyCoefficients, LatencyCoefficients]:
    """The predictor at an expected decode batch ``batch`` (this request included) whose other
    sequences hold ``others_context`` tokens of context on average (module doc)."""
    c = rated.costs
    b = max(batch, 1.0)
    budget = prefill_budget(c, b)
    others = b - 1.0
    tau = c.t_step + others * (c.t_token + others_context * (c.t_kv + c.t_pair))
    energy = EnergyCoefficients(
        prefill_j_per_token=c.e_token + c.e_step / (b * budget),
        prefill_j_per_pair=c.e_pair + c.e_kv / budget,
        start_j=c.e_step / b,
        step_j=c.e_step / b + c.e_token,
        step_j_per_context_token=c.e_kv + c.e_pair,
        rel_error=rated.rel_error,
        provenance=rated.provenance,
    )
    latency = LatencyCoefficients(
        prefill_s=tau,
        prefill_s_per_token=tau / budget + c.t_token,
        prefill_s_per_pair=c.t_pair + c.t_kv / budget,
        tpot_s=tau + c.t_token,
        tpot_s_per_context_token=c.t_kv + c.t_pair,
    )
    return energy, latency


@dataclass(frozen=True)
class PhysicsAssumptions:
    """How hard the hardware runs: the parameters ``scheduler.energy.fit`` fits to published
    measurements, per GPU generation (the defaults are first-principles guesses, the fit's
    starting point; the fitted values are in ``scheduler/energy/published/fit.yaml``).

    prefill_mfu:      share of peak FLOP/s the linear layers reach (large GEMMs)
    attention_mfu:    share of peak FLOP/s attention reaches (FlashAttention). Not fitted: the
                      published energy points have ~200-token prompts, where attention FLOPs are
                      negligible, so the data cannot see it; held at ATTENTION_MFU (below)
    bw_efficiency:    share of peak HBM bandwidth the weight reads reach (dense GEMMs)
    kv_bw_efficiency: share of peak HBM bandwidth the decode KV-cache reads reach (paged
                      attention gathers blocks, so it reaches less than the dense weight reads)
    overhead_s:       per-step launch and scheduling time (CUDA graphs, sampler, scheduler)
    compute_power:    share of TDP drawn while compute-bound (prefill, large batches)
    memory_power:     share of TDP drawn while memory-bound (weight and KV reads)
    overhead_power:   share of TDP drawn during the per-step overhead (the GPU waits for the CPU)
    """

    prefill_mfu: float = 0.5
    attention_mfu: float = 0.55
    bw_efficiency: float = 0.7
    kv_bw_efficiency: float = 0.5
    overhead_s: float = 0.002
    compute_power: float = 0.9
    memory_power: float = 0.65
    overhead_power: float = 0.25


# FlashAttention forward on H100, head dim 128: FlashAttention-3 reaches 430-620 TFLOP/s for
# 512-16k tokens (0.43-0.63 of the 989 TFLOP/s BF16 peak; PyTorch benchmark run of the FA3
# kernels, pytorch/benchmark commit ff65cb6, and Shah et al., arXiv:2407.08608: up to 75 %);
# FlashAttention-2 reaches 50-73 % of A100's peak (Dao, arXiv:2307.08691). vLLM uses FA3 on
# Hopper and FA2 on Ampere; 0.55 sits inside both ranges.
ATTENTION_MFU = 0.55


def kv_tokens_per_replica(model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int) -> int:
    """KV-cache tokens one replica holds across all its sequences (0: the weights do not fit)."""
    usable = gpu.hbm_bytes * GPU_MEMORY_UTILIZATION * tensor_parallel
    free = usable - model.weight_bytes(precision)
    return max(0, int(free / model.kv_bytes_per_token_at(precision)))


@dataclass(frozen=True, slots=True)
class Roofline:
    """One replica's work at 100 % of peak: the catalogue facts the physics model scales.

    weights_s: reading the active weights once at peak bandwidth
    token_s:   one token's linear-layer FLOPs (2 x active parameters) at peak FLOP/s
    kv_s:      reading one token's K and V (every layer) at peak bandwidth
    pair_s:    one (query, key) pair's attention FLOPs (4 x layers x hidden) at peak FLOP/s
    tdp_w:     the replica's board power (TDP x tensor parallelism)
    """

    weights_s: float
    token_s: float
    kv_s: float
    pair_s: float
    tdp_w: float
    idle_w: float
    kv_capacity_tokens: int

    def costs(self, a: PhysicsAssumptions) -> StepCosts:
        """Step costs at the assumptions' efficiencies, each phase at its share of TDP:

        t_step = weights_s / bw_efficiency + overhead_s     e_step  = (weights / bw) memory_power TDP
                                                                      + overhead_s overhead_power TDP
        t_token = token_s / prefill_mfu                      e_token = t_token compute_power TDP
        t_kv    = kv_s / kv_bw_efficiency                    e_kv    = t_kv memory_power TDP
        t_pair  = pair_s / attention_mfu                     e_pair  = t_pair compute_power TDP
        """
        t_weights = self.weights_s / a.bw_efficiency
        t_token = self.token_s / a.prefill_mfu
        t_kv = self.kv_s / a.kv_bw_efficiency
        t_pair = self.pair_s / a.attention_mfu
        compute_w, memory_w = a.compute_power * self.tdp_w, a.memory_power * self.tdp_w
        return StepCosts(
            t_step=t_weights + a.overhead_s,
            t_token=t_token,
            t_kv=t_kv,
            t_pair=t_pair,
            e_step=t_weights * memory_w + a.overhead_s * a.overhead_power * self.tdp_w,
            e_token=t_token * compute_w,
            e_kv=t_kv * memory_w,
            e_pair=t_pair * compute_w,
            idle_w=self.idle_w,
            kv_capacity_tokens=self.kv_capacity_tokens,
        )


def roofline(model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int) -> Roofline:
    """The replica's peak-rate work (``tensor_parallel`` GPUs sharing it evenly)."""
    tp = tensor_parallel
    fast_math = 2.0 if PRECISION_BYTES[precision] < 2 and gpu.name in FP8_TENSOR_CORE_GPUS else 1.0
    peak_flops = gpu.peak_bf16_tflops * 1e12 * tp * fast_math
    bandwidth = gpu.mem_bandwidth_gbs * 1e9 * tp
    return Roofline(
        weights_s=model.active_b * 1e9 * PRECISION_BYTES[precision] / bandwidth,
        token_s=2.0 * model.active_b * 1e9 / peak_flops,
        kv_s=model.kv_bytes_per_token_at(precision) / bandwidth,
        # QK^T and AV: 2 multiply-adds of head_dim x heads (= hidden) per layer per pair
        pair_s=4.0 * model.layers * model.hidden / peak_flops,
        tdp_w=gpu.tdp_w * tp,
        idle_w=gpu.idle_w * tp,
        kv_capacity_tokens=kv_tokens_per_replica(model, gpu, precision, tp),
    )


def physics_step_costs(
    model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, assumptions: PhysicsAssumptions
) -> StepCosts:
    """Roofline step costs of one replica (``tensor_parallel`` GPUs drawing the same power):
    weights and KV read at ``bw_efficiency`` of peak bandwidth, linear layers at
    ``prefill_mfu`` and attention at ``attention_mfu`` of peak FLOP/s, each phase at its share
    of TDP (``Roofline.costs``)."""
    return roofline(model, gpu, precision, tensor_parallel).costs(assumptions)


def mean_context(kv_cache_usage: float, kv_capacity_tokens: int, running: float) -> float:
    """Mean context of a replica's running sequences from what vLLM publishes (KV usage)."""
    if running <= 0 or not math.isfinite(kv_cache_usage):
        return 0.0
    return max(0.0, kv_cache_usage) * kv_capacity_tokens / running
