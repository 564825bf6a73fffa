"""What the scheduler asks of an energy model (``EnergyModel``), and the per-request predictor.

For a pool (model M, GPU H, precision P, tensor parallelism T) the model gives the replica's
step costs with an interval and a provenance (``rated_costs``: ``StepCosts``, the time and
energy of one engine step, linear in its tokens, KV tokens read and attention pairs; see
``scheduler.energy.step``). The router and the simulator turn them into a request's energy
at the expected batch with ``step.predict``:

    E = uncached x prefill_j_per_token + pairs x prefill_j_per_pair + start_j
        + N x (step_j + step_j_per_context_token x (prompt + N / 2))

``coefficients`` is that prediction for one expected batch (a convenience for callers that
do not hold the costs). The default model is ``profile_energy_model.ProfileEnergyModel``.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec
from scheduler.energy.step import EnergyCoefficients, EnergyEstimate, RatedCosts

ANALYTIC = "analytic"

__all__ = ["ANALYTIC", "EnergyCoefficients", "EnergyEstimate", "EnergyModel", "RatedCosts"]


class EnergyModel(Protocol):
    def rated_costs(self, model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int) -> RatedCosts: ...

    def coefficients(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        precision: str,
        tensor_parallel: int,
        batch: float,
        others_context: float = 0.0,
    ) -> EnergyCoefficients: ...
