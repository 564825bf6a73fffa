"""The shipped profiles, regenerated from the published points (``scheduler energy fit-profiles``).

1. Fit the physical parameters (``fit.fit_physics``) to the ``fit`` points of the fitted
   generation (Hopper: the H100 points of ML.ENERGY v3; no other generation has enough clean
   points to fit its own, see ``published/points.yaml``).
2. Intervals, from residuals of points the parameters were not fitted to:
   - ``rel_error_measured``: for a GPU with points in the fit (H100), the largest leave-one-out
     error over the fit points (each predicted by a fit made without it);
   - ``rel_error_transfer``: for a GPU without (H200, A100), the largest error of the fitted
     parameters carried through the catalogue (bandwidth, FLOP/s, TDP) to the other
     generation's ``fit`` points (B200). H200 and A100 are such transfers: same parameters,
     their own bandwidth, FLOP/s and power.
   Both are rounded up to the next 0.01. ``held_out`` points are used by neither.
3. Every target (model, GPU, TP) profile is ``Roofline.costs(parameters)`` of its catalogue
   entries: "fitted". ``fit.yaml`` beside the points keeps the parameters and intervals for
   pools without a profile (``ProfileEnergyModel``'s fallback).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from scheduler.energy.fit import fit_physics, leave_one_out, relative_error
from scheduler.energy.hardware import GPU_CATALOGUE, GpuSpec
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.profiles import EMBEDDED_PROFILES, EnergyProfile, Residuals, Source, write_profile
from scheduler.energy.published import POINTS_FILE, Published, load_points
from scheduler.energy.step import PhysicsAssumptions, physics_step_costs

FIT_FILE = POINTS_FILE.parent / "fit.yaml"
FITTED_GENERATION = "hopper"
DERIVED_ON = dt.date(2026, 11, 30)


@dataclass(frozen=True)
class Target:
    model: str
    gpu: str
    tensor_parallel: int


# Tensor parallelism: the smallest power of two whose 90 % of HBM holds the BF16 weights
# with room left for KV cache.
TARGETS: tuple[Target, ...] = tuple(
    Target(model, gpu, tp)
    for model, tps in (
        ("llama-3.2-1b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("llama-3.2-3b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("llama-3.1-8b", {"A100-40GB": 1, "A100-80GB": 1, "H100-80GB": 1, "H200-141GB": 1}),
        ("qwen3-32b", {"A100-40GB": 4, "A100-80GB": 2, "H100-80GB": 2, "H200-141GB": 1}),
        ("llama-3.1-70b", {"A100-40GB": 8, "A100-80GB": 4, "H100-80GB": 4, "H200-141GB": 2}),
    )
    for gpu, tp in tps.items()
)

CATALOGUE = Source(
    name="NVIDIA datasheets via scheduler/energy/hardware.py (bandwidth, BF16 FLOP/s, TDP, idle floor)",
    url="https://www.nvidia.com/en-us/data-center/h200/",
    used_for="carrying the fitted parameters to this GPU: peak bandwidth, FLOP/s and board power",
)


@dataclass(frozen=True)
class FitSummary:
    generation: str
    assumptions: PhysicsAssumptions
    fit_errors: dict[str, float]
    loo_errors: dict[str, float]
    transfer_errors: dict[str, float]
    rms_log_residual: float
    rel_error_measured: float
    rel_error_transfer: float
    # GPUs with points in the fit.
    measured_gpus: tuple[str, ...]
    sources: tuple[Source, ...]

    def rel_error(self, gpu: str) -> float:
        return self.rel_error_measured if gpu in self.measured_gpus else self.rel_error_transfer

    def interval_basis(self, gpu: str) -> str:
        if gpu in self.measured_gpus:
            return (f"max |leave-one-out error| of the {len(self.loo_errors)} {self.generation} fit points "
                    f"({max(abs(e) for e in self.loo_errors.values()):.3f}), rounded up")
        return (f"max |error| of the {self.generation} parameters carried to the {len(self.transfer_errors)} "
                f"fit points of another generation ({max(abs(e) for e in self.transfer_errors.values()):.3f}), "
                "rounded up: no published point measures this GPU")


def fit_published(published: Published | None = None) -> FitSummary:
    data = published or load_points()
    fit_points = [p for p in data.role("fit") if p.gpu.generation == FITTED_GENERATION]
    transfer_points = [p for p in data.role("fit") if p.gpu.generation != FITTED_GENERATION]
    fit = fit_physics(fit_points)
    loo = leave_one_out(fit_points, fit)
    transfer = {p.id: relative_error(p, fit.assumptions) for p in transfer_points}
    return FitSummary(
        generation=FITTED_GENERATION,
        assumptions=fit.assumptions,
        fit_errors=fit.errors,
        loo_errors=loo,
        transfer_errors=transfer,
        rms_log_residual=fit.rms_log_residual,
        rel_error_measured=_round_up(max(abs(e) for e in loo.values())),
        rel_error_transfer=_round_up(max(abs(e) for e in transfer.values())),
        measured_gpus=tuple(sorted({p.gpu.name for p in fit_points})),
        sources=tuple(
            Source(name=s.title, url=s.url, used_for=s.used_for) for s in data.sources.values()
        ),
    )


def derive_profiles(summary: FitSummary, targets: Sequence[Target] = TARGETS) -> list[EnergyProfile]:
    fit_ids = tuple(summary.fit_errors)
    errors = list(summary.fit_errors.values())
    residuals = Residuals(len(errors), math.sqrt(sum(e * e for e in errors) / len(errors)),
                          max(abs(e) for e in errors))
    return [
        EnergyProfile(
            model=t.model,
            gpu=t.gpu,
            precision="bf16",
            tensor_parallel=t.tensor_parallel,
            method="fitted",
            date=DERIVED_ON,
            rel_error=summary.rel_error(t.gpu),
            interval=summary.interval_basis(t.gpu),
            costs=physics_step_costs(MODEL_CATALOGUE[t.model], GPU_CATALOGUE[t.gpu], "bf16", t.tensor_parallel,
                                     summary.assumptions),
            parameters=summary.assumptions,
            generation=summary.generation,
            residuals=residuals,
            points=fit_ids,
            sources=(*summary.sources, CATALOGUE),
            path="",
        )
        for t in targets
    ]


def derivation_note(profile: EnergyProfile, summary: FitSummary) -> str:
    measured = profile.gpu in summary.measured_gpus
    where = (f"{profile.gpu} is measured by points of the fit" if measured
             else f"no published point measures {profile.gpu}: the {summary.generation} parameters carried "
                  "through its catalogue bandwidth, FLOP/s and TDP")
    return (
        f"fitted: step_costs = Roofline.costs(parameters) for {profile.model} on {profile.gpu} x "
        f"{profile.tensor_parallel} (bf16); parameters fitted by least squares to the {len(summary.fit_errors)} "
        f"'fit' points listed (J/token and tokens/s, log residuals, RMS {summary.rms_log_residual:.3f}); "
        f"{where}. Regenerate with `scheduler energy fit-profiles`; replace with `scheduler calibrate`."
    )


def fit_document(summary: FitSummary) -> dict[str, Any]:
    return {
        "generation": summary.generation,
        "parameters": {f.name: float(f"{getattr(summary.assumptions, f.name):.6g}")
                       for f in fields(summary.assumptions)},
        "rms_log_residual": round(summary.rms_log_residual, 4),
        "rel_error_measured": summary.rel_error_measured,
        "rel_error_transfer": summary.rel_error_transfer,
        "measured_gpus": list(summary.measured_gpus),
        "fit_errors": {k: round(v, 4) for k, v in summary.fit_errors.items()},
        "loo_errors": {k: round(v, 4) for k, v in summary.loo_errors.items()},
        "transfer_errors": {k: round(v, 4) for k, v in summary.transfer_errors.items()},
    }


@dataclass(frozen=True)
class FittedParameters:
    """What ``fit.yaml`` gives the profile model for pools without a profile."""

    generation: str
    assumptions: PhysicsAssumptions
    rel_error_measured: float
    rel_error_transfer: float
    measured_gpus: tuple[str, ...]

    def rel_error(self, gpu: GpuSpec) -> float:
        return self.rel_error_measured if gpu.name in self.measured_gpus else self.rel_error_transfer


def load_fit(path: Path = FIT_FILE) -> FittedParameters:
    doc = yaml.safe_load(path.read_text())
    try:
        return FittedParameters(
            generation=str(doc["generation"]),
            assumptions=PhysicsAssumptions(**{f.name: float(doc["parameters"][f.name])
                                              for f in fields(PhysicsAssumptions)}),
            rel_error_measured=float(doc["rel_error_measured"]),
            rel_error_transfer=float(doc["rel_error_transfer"]),
            measured_gpus=tuple(doc["measured_gpus"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc!r}: not a fit summary written by `scheduler energy fit-profiles`") from None


def write_fitted_profiles(folder: Path = EMBEDDED_PROFILES, fit_file: Path = FIT_FILE) -> list[Path]:
    summary = fit_published()
    folder.mkdir(parents=True, exist_ok=True)
    fit_file.write_text(yaml.safe_dump(fit_document(summary), sort_keys=False, width=100))
    written = [fit_file]
    for profile in derive_profiles(summary):
        path = folder / profile_filename(profile.model, profile.gpu)
        write_profile(profile, derivation_note(profile, summary), path)
        written.append(path)
    return written


def profile_filename(model: str, gpu: str) -> str:
    return f"{model}__{gpu}.yaml"


def _round_up(value: float) -> float:
    return math.ceil(value * 100 - 1e-9) / 100

