"""The ``energy`` object of the final stream event, and in-flight sharing (``InFlight``)."""

from __future__ import annotations

import pytest

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.models import MODEL_CATALOGUE
from scheduler.energy.profile_model import ProfileEnergyModel
from scheduler.serve.energy_report import PoolEnergyProfile, energy_object
from scheduler.serve.inflight import InFlight, RequestShare
from scheduler.serve.sse import Usage

PHASES = {"waiting_j", "prefill_j", "decode_j", "postprocess_j", "idle_allocation_j"}
KEYS = {"energy_j", "energy_j_low", "energy_j_high", "measurement_source", "confidence",
        "attribution_method", "phases", "batch_size", "avoided_j"}


def h200_pool() -> PoolConfig:
    return PoolConfig(
        name="h200-long", gpu="H200-141GB", count=8, power_cap_w=700,
        models=(ModelDeployment(name="llama-3.1-8b", max_context=131072),
                ModelDeployment(name="llama-3.1-70b", max_context=131072, tensor_parallel=2)),
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_model_estimate_matches_the_energy_model_for_the_pool_it_stands_for() -> None:
    profile = PoolEnergyProfile.of(h200_pool())
    usage = Usage(prompt_tokens=500, completion_tokens=64, cached_tokens=256)
    got = energy_object(profile, "llama-3.1-8b", usage, RequestShare(duration_s=1.0, mean_batch=4.0, measured_j=None))
    coefficients = ProfileEnergyModel().coefficients(
        MODEL_CATALOGUE["llama-3.1-8b"], GPU_CATALOGUE["H200-141GB"], "bf16", 1, 4.0, 500 + 64 / 2
    )
    expected = coefficients.estimate(500, 256, 64)
    assert set(got) == KEYS and set(got["phases"]) == PHASES
    assert got["measurement_source"] == "model" and got["attribution_method"] == "model-v1"
    assert got["energy_j"] == pytest.approx(expected.energy_j)
    assert got["energy_j_low"] < got["energy_j"] < got["energy_j_high"]
    assert got["phases"]["prefill_j"] + got["phases"]["decode_j"] == pytest.approx(got["energy_j"])
    assert got["avoided_j"] == pytest.approx(coefficients.avoided_j(500, 256))
    assert got["avoided_j"] > 256 * coefficients.prefill_j_per_token  # the cached tokens' attention too
    assert got["batch_size"] == 4.0
    assert 0 < got["confidence"] < 1


def test_cache_hits_lower_the_estimate_by_what_they_avoid() -> None:
    profile = PoolEnergyProfile.of(h200_pool())
    share = RequestShare(duration_s=1.0, mean_batch=1.0, measured_j=None)
    cold = energy_object(profile, "llama-3.1-8b", Usage(400, 10, 0), share)
    warm = energy_object(profile, "llama-3.1-8b", Usage(400, 10, 384), share)
    assert cold["avoided_j"] == 0.0
    assert cold["energy_j"] - warm["energy_j"] == pytest.approx(warm["avoided_j"])


def test_tensor_parallel_model_uses_its_deployment() -> None:
    profile = PoolEnergyProfile.of(h200_pool())
    share = RequestShare(duration_s=1.0, mean_batch=1.0, measured_j=None)
    small = energy_object(profile, "llama-3.1-8b", Usage(100, 100, 0), share)
    large = energy_object(profile, "llama-3.1-70b", Usage(100, 100, 0), share)
    assert large["energy_j"] > 5 * small["energy_j"]
    assert not profile.serves("qwen3-32b")


def test_measured_energy_is_reported_as_nvml_split_by_predicted_phases() -> None:
    profile = PoolEnergyProfile.of(h200_pool())
    got = energy_object(profile, "llama-3.1-8b", Usage(1000, 100, 0),
                        RequestShare(duration_s=2.0, mean_batch=2.0, measured_j=80.0))
    assert got["measurement_source"] == "nvml" and got["attribution_method"] == "equal-v1"
    assert got["energy_j"] == 80.0
    assert got["energy_j_low"] == pytest.approx(76.0) and got["energy_j_high"] == pytest.approx(84.0)
    assert got["phases"]["prefill_j"] + got["phases"]["decode_j"] == pytest.approx(80.0)
    assert got["phases"]["prefill_j"] > 0 and got["phases"]["decode_j"] > 0


def test_in_flight_mean_batch_is_time_weighted() -> None:
    clock = Clock()
    flight = InFlight(clock=clock)
    flight.start("a")
    clock.t = 1.0
    flight.start("b")  # a alone for 1 s, then both for 1 s
    clock.t = 2.0
    a = flight.finish("a")
    clock.t = 4.0  # b alone for 2 s
    b = flight.finish("b")
    assert a.duration_s == 2.0 and a.mean_batch == pytest.approx(1.5)
    assert b.duration_s == 3.0 and b.mean_batch == pytest.approx((2 * 1 + 1 * 2) / 3)
    assert flight.count == 0 and flight.started_total == flight.finished_total == 2


def test_measured_energy_is_shared_among_requests_in_flight() -> None:
    clock = Clock()
    flight = InFlight(clock=clock)
    flight.add_measured_energy(50.0)  # nobody in flight: billed to nobody
    flight.start("a")
    flight.add_measured_energy(10.0)
    flight.start("b")
    flight.add_measured_energy(20.0)
    a = flight.finish("a")
    flight.add_measured_energy(6.0)
    b = flight.finish("b")
    assert a.measured_j == pytest.approx(10.0 + 10.0)
    assert b.measured_j == pytest.approx(10.0 + 6.0)


def test_unmeasured_requests_have_no_measured_energy_and_batch_at_least_one() -> None:
    flight = InFlight(clock=Clock())
    flight.start("a")
    share = flight.finish("a")
    assert share.measured_j is None and share.mean_batch == 1.0


def test_a_request_cannot_start_twice() -> None:
    flight = InFlight(clock=Clock())
    flight.start("a")
    with pytest.raises(ValueError, match="already in flight"):
        flight.start("a")
