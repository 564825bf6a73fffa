"""The GPU check's own figures, on the real ``NvmlMeter`` over the fake NVML library (the
check itself needs a GPU: ``python -m scheduler.region.gpu_check`` exits 2 without one)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from scheduler.energy.nvml import NvmlMeter
from scheduler.region import gpu_check
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml


@dataclass
class DriverUpdates(FakeNvml):
    """A counter the "driver" updates every ``period_s`` of real time, at 250 W."""

    period_s: float = 0.02

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        ticks = int(time.monotonic() / self.period_s)
        return round(ticks * self.period_s * 250_000)


def test_the_check_measures_how_often_the_driver_updates_the_counter() -> None:
    meter = NvmlMeter(library=DriverUpdates(gpus=[FakeGpu(power_mw=250_000)]))
    assert meter.open()
    period = gpu_check.counter_period_s(meter, seconds=0.3)
    assert period == pytest.approx(0.02, abs=0.005)


def test_the_check_fails_an_interval_that_does_not_conserve_its_joules(capsys: pytest.CaptureFixture[str]) -> None:
    good = {"gpu": 0, "start": 1.0, "end": 1.2, "measured_j": 80.0, "attributed_j": 60.0, "idle_j": 20.0,
            "requests": 3, "weighed_by": "predicted"}
    assert gpu_check._conserved([good, {**good, "attributed_j": 0.0, "idle_j": 80.0, "weighed_by": "idle"}])
    assert not gpu_check._conserved([good, {**good, "attributed_j": 59.0}])
    assert "largest |measured - attributed - idle| / measured: 1.3e-02" in capsys.readouterr().out


def test_the_check_exits_2_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(library_found=False))
    assert gpu_check.main() == 2
