"""Fitting: step costs from metered sweeps and physical parameters from published points,
each recovered from synthetic data made with known values and checked on points NOT used."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest

from scheduler.energy.calibrate import (
    Calibrator,
    Sweep,
    calibrated_profile,
    calibration_note,
    catalogue_gpu_name,
    fit_sweep,
    parse_sweep,
)
from scheduler.energy.fit import (
    SweepPoint,
    fit_physics,
    fit_step_costs,
    point_costs,
    run_duration_s,
    run_energy_j,
)
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.nvml import NvmlMeter
from scheduler.energy.profiles import ProfileLibrary, load_profile, write_profile
from scheduler.energy.published import load_points, predicted_j_per_token, predicted_tokens_per_s
from scheduler.energy.step import PhysicsAssumptions, StepCosts, physics_step_costs

LLAMA_8B, H100 = MODEL_CATALOGUE["llama-3.1-8b"], GPU_CATALOGUE["H100-80GB"]
# The "truth" to recover: first-principles costs of llama-3.1-8b on one H100.
TRUE = physics_step_costs(LLAMA_8B, H100, "bf16", 1, PhysicsAssumptions())
# Fitted on this sweep; checked on UNSEEN (batch, context, output) runs.
SWEEP = Sweep(batches=(1, 8, 64, 256), contexts=(32, 2048, 16384), outputs=(16, 256, 1024))
UNSEEN = [(4, 512, 128), (32, 4096, 64), (128, 1024, 512), (2, 32768, 32), (16, 256, 2048)]


def metered(truth: StepCosts, runs: list[tuple[int, int, int]], noise: float, seed: int) -> list[SweepPoint]:
    rng = random.Random(seed)
    return [
        SweepPoint(b, c, n, run_energy_j(truth, b, c, n) * (1 + rng.gauss(0, noise)),
                   run_duration_s(truth, b, c, n) * (1 + rng.gauss(0, noise)))
        for b, c, n in runs
    ]


def test_fit_recovers_exact_costs_without_noise() -> None:
    fit = fit_step_costs(metered(TRUE, SWEEP.points(), 0.0, 0), idle_w=TRUE.idle_w)
    for name in ("t_step", "t_token", "t_kv", "t_pair", "e_step", "e_token", "e_kv", "e_pair"):
        assert getattr(fit.costs, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert fit.rel_rmse < 1e-9 and fit.dropped_terms == ()


@pytest.mark.parametrize("seed", range(1, 6))
def test_fit_predicts_unseen_runs_from_noisy_sweeps(seed: int) -> None:
    """2 % noise per metered run: runs the sweep never made are predicted within 5 %."""
    fit = fit_step_costs(metered(TRUE, SWEEP.points(), 0.02, seed), idle_w=TRUE.idle_w)
    errors = [run_energy_j(fit.costs, b, c, n) / run_energy_j(TRUE, b, c, n) - 1 for b, c, n in UNSEEN]
    time_errors = [run_duration_s(fit.costs, b, c, n) / run_duration_s(TRUE, b, c, n) - 1 for b, c, n in UNSEEN]
    print(f"\nseed {seed}: fit RMS {fit.rel_rmse:.3f}; unseen energy errors "
          + ", ".join(f"{e:+.1%}" for e in errors) + "; time " + ", ".join(f"{e:+.1%}" for e in time_errors))
    assert max(map(abs, errors)) < 0.05
    assert max(map(abs, time_errors)) < 0.05
    assert fit.costs.e_step == pytest.approx(TRUE.e_step, rel=0.1)
    assert 0.005 < fit.rel_rmse < 0.04


def test_fit_keeps_terms_non_negative() -> None:
    truth = dataclasses.replace(TRUE, e_pair=0.0, t_pair=0.0)
    fit = fit_step_costs(metered(truth, SWEEP.points(), 0.03, 7), idle_w=75.0)
    print(f"\ndropped {fit.dropped_terms}; {fit.costs}")
    assert all(getattr(fit.costs, f.name) >= 0 for f in dataclasses.fields(fit.costs))


def test_fit_needs_enough_points() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        fit_step_costs(metered(TRUE, [(1, 128, 16), (1, 128, 32)], 0.0, 0), idle_w=75.0)


def test_physics_fit_recovers_known_parameters_and_predicts_unused_points() -> None:
    """Synthetic 'published' points made by the model itself with known parameters (1 %
    noise): the fit on the fit-role points recovers the parameters that carry energy, and
    predicts the held-out points within 3 %."""
    truth = PhysicsAssumptions(prefill_mfu=0.45, attention_mfu=0.3, bw_efficiency=0.8, overhead_s=0.0015,
                               compute_power=0.85, memory_power=0.7, overhead_power=0.3)
    rng = random.Random(3)
    hopper = [p for p in load_points().points if p.gpu.name == "H100-80GB"]
    synthetic = [
        dataclasses.replace(
            p,
            j_per_token=predicted_j_per_token(point_costs(p, truth), p) * (1 + rng.gauss(0, 0.01)),
            tokens_per_s=predicted_tokens_per_s(point_costs(p, truth), p) * (1 + rng.gauss(0, 0.01)),
        )
        for p in hopper
    ]
    fit = fit_physics([p for p in synthetic if p.role == "fit"])
    held = [p for p in synthetic if p.role != "fit"]
    errors = [predicted_j_per_token(point_costs(p, fit.assumptions), p)
              / predicted_j_per_token(point_costs(p, truth), p) - 1 for p in held]
    print(f"\nfitted {fit.assumptions}\nmax held-out error vs truth {max(map(abs, errors)):.3%}")
    for name in ("bw_efficiency", "prefill_mfu", "memory_power", "compute_power"):
        assert getattr(fit.assumptions, name) == pytest.approx(getattr(truth, name), rel=0.1), name
    assert max(map(abs, errors)) < 0.03


def test_parse_sweep() -> None:
    assert parse_sweep("batch=1,8;output=32") == Sweep(batches=(1, 8), outputs=(32,))
    assert parse_sweep("") == Sweep()
    with pytest.raises(ValueError, match="unknown axis 'batches'"):
        parse_sweep("batches=1")
    with pytest.raises(ValueError, match="positive"):
        parse_sweep("context=0")


@pytest.mark.parametrize(("name", "memory_gib", "expected"), [
    ("NVIDIA H100 80GB HBM3", 80, "H100-80GB"),
    ("NVIDIA H200", 141, "H200-141GB"),
    ("NVIDIA A100-SXM4-40GB", 40, "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
    ("NVIDIA L4", 24, "L4"),
    ("Tesla V100-SXM2-32GB", 32, None),
])
def test_catalogue_gpu_name(name: str, memory_gib: int, expected: str | None) -> None:
    assert catalogue_gpu_name(name, memory_gib * 2**30) == expected


class SimulatedGpu:
    """NVML's calls over a simulated GPU (no GPU here): the energy counter and the clock
    advance by what the engine's runs and the idle floor cost under known step costs, plus
    1 % noise."""

    class NVMLError(Exception):
        pass

    def __init__(self, truth: StepCosts, seed: int) -> None:
        self.truth, self.rng = truth, random.Random(seed)
        self.energy_mj = 0.0
        self.now = 0.0

    # --- the NvmlLibrary calls NvmlMeter makes
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: return index
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: return int(self.energy_mj)
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: return int(self.truth.idle_w * 1000)

    # --- the engine and the clock
    def run(self, batch: int, context: int, output: int) -> None:
        self.energy_mj += run_energy_j(self.truth, batch, context, output) * (1 + self.rng.gauss(0, 0.01)) * 1000
        self.now += run_duration_s(self.truth, batch, context, output) * (1 + self.rng.gauss(0, 0.01))

    def sleep(self, seconds: float) -> None:
        self.energy_mj += self.truth.idle_w * seconds * 1000
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_calibrator_measures_fits_and_writes_a_loadable_profile(tmp_path: Path) -> None:
    gpu = SimulatedGpu(TRUE, seed=5)
    meter = NvmlMeter(library=gpu, clock=gpu.clock)
    assert meter.open()
    calibrator = Calibrator(meter=meter, engine=gpu, gpu_indices=[0], sleep=gpu.sleep, clock=gpu.clock)
    idle_w = calibrator.idle_w(10.0)
    points = calibrator.sweep(SWEEP, progress=False)
    fit = fit_sweep(LLAMA_8B, H100, "bf16", 1, points, idle_w)
    profile = calibrated_profile(LLAMA_8B, "H100-80GB", "bf16", 1, fit, today=dt.date(2026, 1, 2))
    out = tmp_path / "llama-3.1-8b__H100-80GB.yaml"
    write_profile(profile, calibration_note(fit, points), out)
    loaded = load_profile(out)
    unseen = [run_energy_j(loaded.costs, b, c, n) / run_energy_j(TRUE, b, c, n) - 1 for b, c, n in UNSEEN]
    print(f"\nidle {idle_w:.1f} W; {loaded.provenance}; ±{loaded.rel_error:.2f} ({loaded.interval}); "
          f"unseen runs " + ", ".join(f"{e:+.1%}" for e in unseen))
    assert idle_w == pytest.approx(TRUE.idle_w, rel=0.01)
    assert loaded.provenance == "profile: h100-80gb-llama-3.1-8b@calibrated 2026-01-02"
    assert loaded.method == "calibrated" and loaded.parameters is None
    assert max(map(abs, unseen)) < loaded.rel_error
    assert loaded.costs.kv_capacity_tokens > 0
    assert ProfileLibrary.load(tmp_path).get("llama-3.1-8b", "H100-80GB") is not None
