"""Fitting a profile from metered sweep runs: known parameters plus noise, recovered."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import fields
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
from scheduler.energy.fit import SweepPoint, fit_replica, predicted_run_j
from scheduler.energy.model import ReplicaEnergy
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.nvml import NvmlMeter
from scheduler.energy.profiles import ProfileLibrary, load_profile, write_profile

# Terms of the shipped llama-3.1-8b / H100 profile, rounded: the "truth" to recover.
TRUE = ReplicaEnergy(prefill_j_per_token=0.0148, start_j=4.56, step_weights_j=3.12, step_seq_j=0.0074,
                     step_kv_j_per_token=2.55e-5, idle_w=75.0)
SWEEP = Sweep()


def dense(_: float) -> float:
    return 1.0


def measured(truth: ReplicaEnergy, sweep: Sweep, noise: float, seed: int) -> list[SweepPoint]:
    rng = random.Random(seed)
    return [
        SweepPoint(b, c, n, predicted_run_j(truth, SweepPoint(b, c, n, 1.0), dense) * (1 + rng.gauss(0, noise)))
        for b, c, n in sweep.points()
    ]


def test_fit_recovers_exact_parameters_without_noise() -> None:
    fit = fit_replica(measured(TRUE, SWEEP, 0.0, 0), idle_w=75.0)
    for f in fields(TRUE):
        assert getattr(fit.replica, f.name) == pytest.approx(getattr(TRUE, f.name), rel=1e-6)
    assert fit.rel_rmse < 1e-9 and fit.dropped_terms == ()


@pytest.mark.parametrize("seed", range(1, 6))
def test_fit_recovers_parameters_from_noisy_runs(seed: int) -> None:
    """2 % measurement noise per run: the terms that carry the energy come back within 10 %,
    the small ones within 25 %, and predictions for unseen requests within 5 %."""
    fit = fit_replica(measured(TRUE, SWEEP, 0.02, seed), idle_w=75.0)
    errors = {f.name: getattr(fit.replica, f.name) / getattr(TRUE, f.name) - 1 for f in fields(TRUE)}
    print(f"\nseed {seed}: rel RMS {fit.rel_rmse:.3f}; term errors "
          + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items()))
    for name in ("step_weights_j", "step_kv_j_per_token", "prefill_j_per_token"):
        assert abs(errors[name]) < 0.10, name
    for name in ("step_seq_j", "start_j"):
        assert abs(errors[name]) < 0.25, name
    for b, c, n in [(8, 2048, 256), (32, 512, 1024), (2, 8192, 64)]:
        point = SweepPoint(b, c, n, 1.0)
        assert predicted_run_j(fit.replica, point, dense) == pytest.approx(predicted_run_j(TRUE, point, dense), rel=0.05)
    assert 0.01 < fit.rel_rmse < 0.04


def test_fit_keeps_terms_non_negative() -> None:
    truth = ReplicaEnergy(0.0148, 0.0, 3.12, 0.0, 2.55e-5, 75.0)
    fit = fit_replica(measured(truth, SWEEP, 0.03, 7), idle_w=75.0)
    print(f"\ndropped {fit.dropped_terms}; {fit.replica}")
    assert all(getattr(fit.replica, f.name) >= 0 for f in fields(fit.replica))


def test_fit_needs_enough_points() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        fit_replica(measured(TRUE, Sweep((1,), (128,), (16, 32)), 0.0, 0), idle_w=75.0)


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
    """NVML's calls over a simulated GPU (no GPU here): the energy counter advances by what
    the engine's runs and the idle floor cost under known terms, plus 1 % noise."""

    class NVMLError(Exception):
        pass

    def __init__(self, truth: ReplicaEnergy, seed: int) -> None:
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
        joules = predicted_run_j(self.truth, SweepPoint(batch, context, output, 1.0), dense)
        self.energy_mj += joules * (1 + self.rng.gauss(0, 0.01)) * 1000
        self.now += 0.01 * output

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
    model = MODEL_CATALOGUE["llama-3.1-8b"]
    fit = fit_sweep(model, points, idle_w)
    profile = calibrated_profile(model, "H100-80GB", "bf16", 1, fit, today=dt.date(2026, 1, 2))
    out = tmp_path / "llama-3.1-8b__H100-80GB.yaml"
    write_profile(profile, calibration_note(fit, points), out)
    loaded = load_profile(out)
    print(f"\nidle {idle_w:.1f} W; {loaded.provenance}; rel_error {loaded.rel_error:.3f}; "
          f"step_weights_j {loaded.replica.step_weights_j:.3f} (true {TRUE.step_weights_j})")
    assert idle_w == pytest.approx(75.0, rel=0.01)
    assert loaded.provenance == "profile: h100-80gb-llama-3.1-8b@calibrated 2026-01-02"
    assert loaded.replica.step_weights_j == pytest.approx(TRUE.step_weights_j, rel=0.05)
    assert loaded.replica.step_kv_j_per_token == pytest.approx(TRUE.step_kv_j_per_token, rel=0.05)
    assert ProfileLibrary.load(tmp_path).get("llama-3.1-8b", "H100-80GB") is not None
