"""Per-request energy prediction: E_request = E_fixed + N x E_step (ARCHITECTURE section 4).

For a model M on hardware H at precision P with an expected concurrent batch B, a request
with prompt length C (of which K tokens come from the prefix cache) and N output tokens:

    E_prefill = (C - K) x e_prefill                    (compute-bound, per uncached prompt token)
    E_fixed   = E_prefill + e_start                    (decode start-up / kernel-launch floor)
    E_step(c) = e_weights x r(B) / B + e_seq + e_kv x c
                (one step's weight reads are shared by the B sequences of the batch; r(B) is
                 the share of a mixture-of-experts model's weights that B tokens touch, 1 for
                 dense models; e_seq is this sequence's compute; e_kv x c its KV-cache reads)
    sum over the N steps, context growing C -> C + N:
    E_decode  = N x (s + k x (C + N / 2)),   s = e_weights x r(B) / B + e_seq,  k = e_kv
    E_idle    = idle_w / B x expected wait   (the request's share of the replica's floor power)

``ReplicaEnergy`` holds the batch-independent terms of one replica (a profile, fitted or
derived); ``at_batch`` folds in the batch to give ``EnergyCoefficients``, which the scheduler
computes once per candidate per snapshot and evaluates per request in a few multiplications
(the hot path). ``estimate`` gives the breakdown with an interval and a provenance.

``first_principles`` computes ``ReplicaEnergy`` from the catalogues alone (roofline: prefill
at a fraction of peak FLOP/s, decode at a fraction of peak memory bandwidth, a constant
share of TDP while busy); ``AnalyticEnergyModel`` is that model, and the fallback of the
profile-based model (``scheduler.energy.profile_model``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.models import PRECISION_BYTES, ModelSpec
from scheduler.types import EnergyEstimate

ANALYTIC = "analytic"

# GPUs whose tensor cores run FP8 math (Ada, Hopper, Blackwell); on the others (A100) an
# FP8 checkpoint runs weight-only (W8A16) kernels: less memory traffic, BF16 math.
FP8_TENSOR_CORE_GPUS = frozenset({"H100-80GB", "H200-141GB", "L4", "B200"})


@dataclass(frozen=True, slots=True)
class EnergyCoefficients:
    prefill_j_per_token: float
    start_j: float
    step_j: float
    step_j_per_context_token: float
    idle_w: float
    # Relative half-width of the prediction interval (0.4 = +-40 %).
    rel_error: float
    provenance: str

    def joules(self, prompt_tokens: int, cached_tokens: int, output_tokens: int, wait_s: float = 0.0) -> float:
        uncached = prompt_tokens - cached_tokens if prompt_tokens > cached_tokens else 0
        return (
            uncached * self.prefill_j_per_token
            + self.start_j
            + output_tokens
            * (self.step_j + self.step_j_per_context_token * (prompt_tokens + output_tokens * 0.5))
            + self.idle_w * wait_s
        )

    def estimate(self, prompt_tokens: int, cached_tokens: int, output_tokens: int, wait_s: float = 0.0) -> EnergyEstimate:
        uncached = max(0, prompt_tokens - cached_tokens)
        prefill = uncached * self.prefill_j_per_token + self.start_j
        decode = output_tokens * (
            self.step_j + self.step_j_per_context_token * (prompt_tokens + output_tokens * 0.5)
        )
        idle = self.idle_w * wait_s
        total = prefill + decode + idle
        return EnergyEstimate(
            energy_j=total,
            low_j=total * (1 - self.rel_error),
            high_j=total * (1 + self.rel_error),
            prefill_j=prefill,
            decode_j=decode,
            idle_j=idle,
            provenance=self.provenance,
        )

    def avoided_j(self, cached_tokens: int) -> float:
        """Prefill energy the prefix cache saved by serving ``cached_tokens`` from cache."""
        return max(0, cached_tokens) * self.prefill_j_per_token


@dataclass(frozen=True, slots=True)
class ReplicaEnergy:
    """The batch-independent energy terms of one replica (all its tensor-parallel GPUs).

    step_weights_j is the batch-shared energy of one decode step at batch 1 (weight reads
    plus per-step overheads); step_seq_j and step_kv_j_per_token are per sequence per step.
    """

    prefill_j_per_token: float
    start_j: float
    step_weights_j: float
    step_seq_j: float
    step_kv_j_per_token: float
    idle_w: float

    def at_batch(
        self, batch: float, weights_read_ratio: float, rel_error: float, provenance: str
    ) -> EnergyCoefficients:
        b = max(batch, 1.0)
        return EnergyCoefficients(
            prefill_j_per_token=self.prefill_j_per_token,
            start_j=self.start_j,
            step_j=self.step_weights_j * weights_read_ratio / b + self.step_seq_j,
            step_j_per_context_token=self.step_kv_j_per_token,
            idle_w=self.idle_w / b,
            rel_error=rel_error,
            provenance=provenance,
        )

    def times(self, factors: ReplicaEnergy) -> ReplicaEnergy:
        """Term-by-term product (scaling a profile by physics ratios)."""
        return ReplicaEnergy(*(getattr(self, f.name) * getattr(factors, f.name) for f in fields(self)))

    def ratio(self, other: ReplicaEnergy) -> ReplicaEnergy:
        """Term-by-term ``self / other`` (1 where ``other`` is 0)."""
        return ReplicaEnergy(
            *(
                getattr(self, f.name) / getattr(other, f.name) if getattr(other, f.name) else 1.0
                for f in fields(self)
            )
        )

    def scaled(self, factor: float, keep_idle: bool = True) -> ReplicaEnergy:
        scaled = ReplicaEnergy(*(getattr(self, f.name) * factor for f in fields(self)))
        return replace(scaled, idle_w=self.idle_w) if keep_idle else scaled


def weights_read_ratio(model: ModelSpec, batch: float) -> float:
    """Weights one decode step reads at ``batch``, relative to one token's active weights.

    Dense: 1. Mixture of experts: each token routes to a fraction f = active / total of the
    expert weights, so B tokens leave (1 - f)^B of them unread on average; the step reads
    total x (1 - (1 - f)^B), i.e. (1 - (1 - f)^B) / f times the active weights, which grows
    from 1 at batch 1 towards total / active at large batch.
    """
    f = model.active_b / model.params_b
    if f >= 1.0:
        return 1.0
    return float((1.0 - (1.0 - f) ** max(batch, 1.0)) / f)


@dataclass(frozen=True)
class PhysicsAssumptions:
    """How hard the hardware runs, for the first-principles model (no measurements)."""

    prefill_mfu: float = 0.5
    bw_efficiency: float = 0.7
    active_power_frac: float = 0.75
    start_s: float = 0.01


def first_principles(
    model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, assumptions: PhysicsAssumptions
) -> ReplicaEnergy:
    """Roofline energy terms of one replica: every GPU of a tensor-parallel replica draws the
    same power; prefill runs at ``prefill_mfu`` of peak FLOP/s, decode reads at
    ``bw_efficiency`` of peak bandwidth, and each decode token's FLOPs cost their energy at
    the peak rate (the part of compute that memory reads do not hide)."""
    tp = tensor_parallel
    power_w = gpu.tdp_w * assumptions.active_power_frac * tp
    flops_per_token = 2.0 * model.active_b * 1e9
    fast_math = 2.0 if PRECISION_BYTES[precision] < 2 and gpu.name in FP8_TENSOR_CORE_GPUS else 1.0
    peak_flops = gpu.peak_bf16_tflops * 1e12 * tp * fast_math
    bandwidth = gpu.mem_bandwidth_gbs * 1e9 * assumptions.bw_efficiency * tp
    weights = model.active_b * 1e9 * PRECISION_BYTES[precision]
    kv = model.kv_bytes_per_token_at(precision)
    return ReplicaEnergy(
        prefill_j_per_token=power_w * flops_per_token / (peak_flops * assumptions.prefill_mfu),
        start_j=power_w * assumptions.start_s,
        step_weights_j=power_w * weights / bandwidth,
        step_seq_j=power_w * flops_per_token / peak_flops,
        step_kv_j_per_token=power_w * kv / bandwidth,
        idle_w=gpu.idle_w * tp,
    )


class EnergyModel(Protocol):
    def coefficients(
        self, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, batch: float
    ) -> EnergyCoefficients: ...


@dataclass(frozen=True)
class AnalyticEnergyModel:
    """The first-principles model from the hardware catalogue alone (no measurements)."""

    prefill_mfu: float = 0.5
    bw_efficiency: float = 0.7
    active_power_frac: float = 0.75
    start_s: float = 0.01
    rel_error: float = 0.4

    @property
    def assumptions(self) -> PhysicsAssumptions:
        return PhysicsAssumptions(self.prefill_mfu, self.bw_efficiency, self.active_power_frac, self.start_s)

    def coefficients(
        self, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, batch: float
    ) -> EnergyCoefficients:
        replica = first_principles(model, gpu, precision, tensor_parallel, self.assumptions)
        return replica.at_batch(batch, weights_read_ratio(model, batch), self.rel_error, ANALYTIC)
