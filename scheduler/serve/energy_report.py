"""The ``energy`` object a region adds to a request's final stream event.

Two sources, one shape (see shared formats, "Region OpenAI-compatible streaming API"):

- ``nvml``: the GPU energy measured while the request was in flight, each measured interval
  split equally among the requests in flight in it (``InFlight``: rule "equal-v1" of
  ``scheduler.energy.attribution``, by time in flight); split into phases in the proportions
  the energy model predicts; interval +-5 %.
- ``model``: no GPU meter (CPU replicas, laptops, CI). The prediction of the router's energy
  model (``ProfileEnergyModel.rated_costs`` and ``step.predict``, as the router uses them) for
  the pool the replica stands for (its GPU, the requested model at its precision and tensor
  parallelism) at the request's mean batch, the other sequences at this request's mid-output
  context, from its real token counts (``measurement_source: model``, rule "model-v1", the
  model's own interval), under the pool's power cap when it has one below TDP
  (``scheduler.energy.power_cap``: the region sets that cap on the pool's GPUs).

Either way ``avoided_j`` is the prefill energy the prefix cache saved. Waiting and
idle-allocation energy are 0 here: a bill made when the stream ends cannot share idle time
still to come (the offline ``attribute`` over the replica's whole trace can), and the model
rule does not simulate the real pool's queueing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy.attribution import RULES
from scheduler.energy.hardware import GPU_CATALOGUE, GpuSpec
from scheduler.energy.model import EnergyCoefficients, EnergyModel
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.power_cap import capped, power_cap
from scheduler.energy.profile_model import ProfileEnergyModel
from scheduler.energy.step import predict
from scheduler.serve.inflight import RequestShare
from scheduler.serve.sse import Usage

MODEL_RULE = "model-v1"
MEASURED_RULE = RULES["equal-v1"].version
NVML_REL_ERROR = 0.05
NVML_CONFIDENCE = 0.9


@dataclass(frozen=True)
class PoolEnergyProfile:
    """The real pool a local replica stands for, as the energy model sees it."""

    pool: str
    gpu: GpuSpec
    deployments: Mapping[str, ModelDeployment]
    energy_model: EnergyModel = field(default_factory=ProfileEnergyModel)
    # The power cap on each of the pool's GPUs (None or TDP: the default limit).
    cap_w: float | None = None

    @classmethod
    def of(cls, pool: PoolConfig, energy_model: EnergyModel | None = None,
           cap_w: float | None = None) -> PoolEnergyProfile:
        return cls(
            pool=pool.name,
            gpu=GPU_CATALOGUE[pool.gpu],
            deployments=MappingProxyType({d.name: d for d in pool.models}),
            energy_model=energy_model or ProfileEnergyModel(),
            cap_w=cap_w,
        )

    def serves(self, model: str) -> bool:
        return model in self.deployments

    def coefficients(self, model: str, batch: float, others_context: float) -> EnergyCoefficients:
        deployment = self.deployments[model]
        spec = MODEL_CATALOGUE[model]
        cap = power_cap(self.gpu, self.cap_w, deployment.tensor_parallel)
        if cap is None:
            return self.energy_model.coefficients(
                spec, self.gpu, deployment.precision, deployment.tensor_parallel, batch, others_context
            )
        rated = self.energy_model.rated_costs(spec, self.gpu, deployment.precision, deployment.tensor_parallel)
        energy, _ = predict(capped(rated, cap, batch, others_context), batch, others_context)
        return energy


def energy_object(
    profile: PoolEnergyProfile, model: str, usage: Usage, share: RequestShare
) -> dict[str, Any]:
    context = usage.prompt_tokens + usage.completion_tokens / 2
    coefficients = profile.coefficients(model, share.mean_batch, context)
    estimate = coefficients.estimate(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
    avoided = coefficients.avoided_j(usage.prompt_tokens, min(usage.cached_tokens, usage.prompt_tokens))
    if share.measured_j is None:
        total, low, high = estimate.energy_j, estimate.low_j, estimate.high_j
        prefill, decode = estimate.prefill_j, estimate.decode_j
        source, confidence, rule = "model", 1.0 - coefficients.rel_error, MODEL_RULE
    else:
        total = share.measured_j
        low, high = total * (1 - NVML_REL_ERROR), total * (1 + NVML_REL_ERROR)
        predicted = estimate.prefill_j + estimate.decode_j
        prefill_frac = estimate.prefill_j / predicted if predicted > 0 else 0.0
        prefill, decode = total * prefill_frac, total * (1 - prefill_frac)
        source, confidence, rule = "nvml", NVML_CONFIDENCE, MEASURED_RULE
    return {
        "energy_j": total,
        "energy_j_low": low,
        "energy_j_high": high,
        "measurement_source": source,
        "confidence": confidence,
        "attribution_method": rule,
        "phases": {
            "waiting_j": 0.0,
            "prefill_j": prefill,
            "decode_j": decode,
            "postprocess_j": 0.0,
            "idle_allocation_j": 0.0,
        },
        "batch_size": share.mean_batch,
        "avoided_j": avoided,
    }
