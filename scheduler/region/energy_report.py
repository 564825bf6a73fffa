"""The ``energy`` object a region adds to a request's final stream event.

Two sources, one shape (see shared formats, "Region OpenAI-compatible streaming API"):

- ``nvml``: the request's share of the GPU energy the gateway metered while it ran: every
  meter interval of every GPU split among the requests on that GPU in proportion to the step
  model's energy of the tokens each processed in it (rule "predicted-share-v1" of
  ``scheduler.energy.attribution``, applied by ``scheduler.region.inflight``), in its prefill
  and decode parts as split. Its interval:

      energy_j +- (model_error_j + meter_error_j)
      model_error_j = sum over intervals of share x ratio_error x (1 - fraction)
      meter_error_j = sum over readings of |change of fraction| x (power x counter lag + 1 mJ)

  with ratio_error the spread of the energy model's held-out residuals on the pool's GPU
  class (``scheduler.energy.validate.ratio_error``) and the meter's resolution from
  ``scheduler.energy.nvml``; confidence = 1 - half-width / energy_j. A request alone on its
  GPU is measured to the meter's resolution; one among many only as well as the model's relative
  costs are known.
- ``model``: nothing metered it (CPU replicas, laptops, CI, a replica on another node). The
  prediction of the router's energy model (``ProfileEnergyModel.rated_costs`` and
  ``step.predict``, as the router uses them) for the pool the replica stands for (its GPU,
  the requested model at its precision and tensor parallelism) at the batch of the replica
  that ran the request (its running sequences averaged over the request's lifetime there,
  ``scheduler.region.replica_report``), the other sequences at this request's mid-output
  context, from its real token counts (``measurement_source: model``, rule "model-v1", the
  model's own interval: the largest leave-one-out residual of the fit, docs/energy-model.md),
  under the pool's power cap when it has one below TDP (``scheduler.energy.power_cap``: the
  region sets that cap on the pool's GPUs).

Either way ``avoided_j`` is the prefill energy the prefix cache saved. Waiting and
idle-allocation energy are 0 here: idle GPU intervals are counted apart, per pool, by the
gateway (``InFlight.idle_j``, the ``scheduler_region_idle_energy_joules`` metric), and the
model rule does not simulate the real pool's queueing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy import validate
from scheduler.energy.attribution import ONLINE_RULE
from scheduler.energy.energy_model import EnergyCoefficients, EnergyModel
from scheduler.energy.hardware import GPU_CATALOGUE, GpuSpec
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.power_cap import capped, power_cap
from scheduler.energy.profile_energy_model import ProfileEnergyModel, shipped_fit
from scheduler.energy.step import predict
from scheduler.region.inflight import RequestShare
from scheduler.region.stream_assembler import Usage

MODEL_RULE = "model-v1"


@lru_cache(maxsize=8)
def shipped_ratio_error(gpu: str) -> float:
    """``validate.ratio_error`` of the shipped fit for a GPU (computed once per process)."""
    return validate.ratio_error(GPU_CATALOGUE[gpu], fitted=shipped_fit())


@dataclass(frozen=True)
class PoolEnergyProfile:
    """The real pool a local replica stands for, as the energy model sees it."""

    pool: str
    gpu: GpuSpec
    deployments: Mapping[str, ModelDeployment]
    energy_model: EnergyModel = field(default_factory=ProfileEnergyModel)
    # The power cap on each of the pool's GPUs (None or TDP: the default limit).
    cap_w: float | None = None
    # Bound on one prediction's relative error against another's on this GPU (module doc).
    ratio_error: float = 0.0

    @classmethod
    def of(cls, pool: PoolConfig, energy_model: EnergyModel | None = None,
           cap_w: float | None = None) -> PoolEnergyProfile:
        return cls(
            pool=pool.name,
            gpu=GPU_CATALOGUE[pool.gpu],
            deployments=MappingProxyType({d.name: d for d in pool.models}),
            energy_model=energy_model or ProfileEnergyModel(),
            cap_w=cap_w,
            ratio_error=shipped_ratio_error(pool.gpu),
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


@dataclass(frozen=True)
class RegionPricing:
    """The step model of each pool, as ``InFlight`` prices the work it splits measured energy by."""

    profiles: Mapping[str, PoolEnergyProfile]

    def coefficients(self, pool: str, model: str, batch: float, context: float) -> EnergyCoefficients:
        return self.profiles[pool].coefficients(model, batch, context)

    def ratio_error(self, pool: str, model: str) -> float:
        return self.profiles[pool].ratio_error


def energy_object(
    profile: PoolEnergyProfile, model: str, usage: Usage, share: RequestShare
) -> dict[str, Any]:
    context = usage.prompt_tokens + usage.completion_tokens / 2
    coefficients = profile.coefficients(model, share.mean_batch, context)
    estimate = coefficients.estimate(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
    avoided = coefficients.avoided_j(usage.prompt_tokens, min(usage.cached_tokens, usage.prompt_tokens))
    measured = share.measured
    if measured is None:
        total, low, high = estimate.energy_j, estimate.low_j, estimate.high_j
        prefill, decode = estimate.prefill_j, estimate.decode_j
        source, confidence, rule = "model", 1.0 - coefficients.rel_error, MODEL_RULE
    else:
        total, prefill, decode = measured.energy_j, measured.prefill_j, measured.decode_j
        half = measured.model_error_j + measured.meter_error_j
        low, high = max(0.0, total - half), total + half
        source, rule = "nvml", ONLINE_RULE
        confidence = max(0.0, 1.0 - half / total) if total > 0 else 0.0
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
