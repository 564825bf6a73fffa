"""The profile-based energy model: the scheduler's default ``EnergyModel``.

rated_costs(model, gpu, precision, tp):
  a profile for (model, gpu) at that precision and TP -> its step costs, interval, provenance;
  a fitted profile at another precision or TP -> the same fitted parameters through the
      catalogue at the deployment's precision and TP (the physics the profile was made
      with), the interval widened, the provenance saying so
      ("profile: h100-80gb-llama-3.1-70b@fitted 2026-11-30, at fp8 tp2");
  a calibrated profile at another precision or TP -> each term times the physics ratio
      (target / profiled), the interval widened likewise;
  no profile -> the fitted parameters (``published/fit.yaml``) for this GPU: provenance
      "analytic", the interval of a GPU measured by the fit or of a transfer.
``coefficients`` is ``step.predict`` of those costs at one expected batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

from scheduler.energy.derive import FittedParameters, load_fit
from scheduler.energy.energy_model import ANALYTIC
from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec
from scheduler.energy.profiles import EnergyProfile, ProfileLibrary
from scheduler.energy.step import EnergyCoefficients, RatedCosts, StepCosts, physics_step_costs, predict

# Largest relative half-width an interval may reach (a prediction of 0 J is not a bound).
MAX_REL_ERROR = 0.9


@lru_cache(maxsize=1)
def shipped_library() -> ProfileLibrary:
    """The profiles shipped in the package (read-only package data: read once per process)."""
    return ProfileLibrary.load()


@lru_cache(maxsize=1)
def shipped_fit() -> FittedParameters:
    """The fitted parameters shipped in the package (read once per process)."""
    return load_fit()


@dataclass(frozen=True)
class ProfileEnergyModel:
    library: ProfileLibrary = field(default_factory=shipped_library)
    fitted: FittedParameters = field(default_factory=shipped_fit)
    # How much wider the interval gets when a profile is carried to another precision / TP.
    precision_scaling_error: float = 0.1
    tp_scaling_error: float = 0.05

    def rated_costs(self, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int) -> RatedCosts:
        profile = self.library.get(model.name, gpu.name)
        if profile is None:
            costs = physics_step_costs(model, gpu, precision, tensor_parallel, self.fitted.assumptions)
            return RatedCosts(costs, self.fitted.rel_error(gpu), ANALYTIC)
        if precision == profile.precision and tensor_parallel == profile.tensor_parallel:
            return RatedCosts(profile.costs, profile.rel_error, profile.provenance)
        return self._carried(profile, model, gpu, precision, tensor_parallel)

    def coefficients(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        precision: str,
        tensor_parallel: int,
        batch: float,
        others_context: float = 0.0,
    ) -> EnergyCoefficients:
        energy, _ = predict(self.rated_costs(model, gpu, precision, tensor_parallel), batch, others_context)
        return energy

    def _carried(
        self, profile: EnergyProfile, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int
    ) -> RatedCosts:
        """The profile at another precision and / or tensor-parallel degree."""
        if profile.parameters is not None:
            costs = physics_step_costs(model, gpu, precision, tensor_parallel, profile.parameters)
        else:
            physics = self.fitted.assumptions
            target = physics_step_costs(model, gpu, precision, tensor_parallel, physics)
            measured = physics_step_costs(model, gpu, profile.precision, profile.tensor_parallel, physics)
            costs = _times_ratio(profile.costs, target, measured)
        rel_error, changes = profile.rel_error, []
        if precision != profile.precision:
            rel_error += self.precision_scaling_error
            changes.append(precision)
        if tensor_parallel != profile.tensor_parallel:
            rel_error += self.tp_scaling_error
            changes.append(f"tp{tensor_parallel}")
        provenance = f"{profile.provenance}, at {' '.join(changes)}"
        return RatedCosts(costs, min(rel_error, MAX_REL_ERROR), provenance)


def _times_ratio(costs: StepCosts, target: StepCosts, measured: StepCosts) -> StepCosts:
    """Each time and energy term of ``costs`` times target / measured (1 where measured is 0);
    the replica's idle power and capacities are the target's."""
    values = {}
    for f in fields(StepCosts):
        value, t, m = getattr(costs, f.name), getattr(target, f.name), getattr(measured, f.name)
        if f.name.startswith(("t_", "e_")):
            values[f.name] = value * (t / m if m else 1.0)
        else:
            values[f.name] = t
    return StepCosts(**values)
