"""The profile-based energy model: the scheduler's default ``EnergyModel``.

coefficients(model, gpu, precision, tp, batch):
  a profile for (model, gpu) exists -> its ``ReplicaEnergy``; when the deployment's precision
      or tensor-parallel degree differs from the profile's, each term is scaled by the ratio
      of the first-principles terms (target / profiled), the interval widens, and the
      provenance says so ("profile: h100-80gb-llama-3.1-70b@scaled 2026-01-20, scaled to fp8 tp2");
  otherwise -> the first-principles model (``AnalyticEnergyModel``), provenance "analytic".
The batch then enters as in ``ReplicaEnergy.at_batch`` (weights shared by the batch, MoE
weights read growing with the batch, idle floor shared by the batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model import (
    AnalyticEnergyModel,
    EnergyCoefficients,
    ReplicaEnergy,
    first_principles,
    weights_read_ratio,
)
from scheduler.energy.models import ModelSpec
from scheduler.energy.profiles import EnergyProfile, ProfileLibrary

# Largest relative half-width an interval may reach (a prediction of 0 J is not a bound).
MAX_REL_ERROR = 0.9


@dataclass(frozen=True)
class ProfileEnergyModel:
    library: ProfileLibrary = field(default_factory=ProfileLibrary.load)
    fallback: AnalyticEnergyModel = field(default_factory=AnalyticEnergyModel)
    # How much wider the interval gets when a profile is carried to another precision / TP.
    precision_scaling_error: float = 0.1
    tp_scaling_error: float = 0.05

    def coefficients(
        self, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, batch: float
    ) -> EnergyCoefficients:
        profile = self.library.get(model.name, gpu.name)
        if profile is None:
            return self.fallback.coefficients(model, gpu, precision, tensor_parallel, batch)
        replica, rel_error, provenance = self.replica(profile, model, gpu, precision, tensor_parallel)
        return replica.at_batch(batch, weights_read_ratio(model, batch), rel_error, provenance)

    def replica(
        self, profile: EnergyProfile, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int
    ) -> tuple[ReplicaEnergy, float, str]:
        """The profile's terms carried to ``precision`` and ``tensor_parallel``."""
        same_precision = precision == profile.precision
        same_tp = tensor_parallel == profile.tensor_parallel
        if same_precision and same_tp:
            return profile.replica, profile.rel_error, profile.provenance
        physics = self.fallback.assumptions
        target = first_principles(model, gpu, precision, tensor_parallel, physics)
        measured = first_principles(model, gpu, profile.precision, profile.tensor_parallel, physics)
        rel_error = profile.rel_error
        changes = []
        if not same_precision:
            rel_error += self.precision_scaling_error
            changes.append(precision)
        if not same_tp:
            rel_error += self.tp_scaling_error
            changes.append(f"tp{tensor_parallel}")
        provenance = f"{profile.provenance}, scaled to {' '.join(changes)}"
        return profile.replica.times(target.ratio(measured)), min(rel_error, MAX_REL_ERROR), provenance
