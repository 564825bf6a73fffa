"""``NvmlMeter`` against the fake NVML library: counter deltas, power polling, degradation."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from scheduler.energy.nvml import COUNTER, POWER_POLL, GpuEnergyReading, NvmlMeter, delta_mj
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml


@dataclass
class ManualClock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


def test_energy_counter_deltas_per_gpu() -> None:
    gpus = [FakeGpu(energy_mj=1_000_000, power_mw=300_000), FakeGpu(energy_mj=5_000, power_mw=250_000)]
    clock = ManualClock()
    meter = NvmlMeter(library=FakeNvml(gpus=gpus), clock=clock)
    assert meter.open()
    assert meter.gpu_count == 2
    before = meter.read()
    gpus[0].energy_mj += 30_000  # 30 J
    gpus[1].energy_mj += 12_500  # 12.5 J
    clock.t += 0.1
    after = meter.read()
    assert before is not None and after is not None
    assert delta_mj(before, after) == (30_000.0, 12_500.0)
    assert after.methods == (COUNTER, COUNTER)
    assert after.power_w == (300.0, 250.0)
    assert after.total_power_w == 550.0


def test_power_polling_integrates_when_the_counter_is_not_supported() -> None:
    gpu = FakeGpu(power_mw=100_000, has_energy_counter=False)
    clock = ManualClock()
    meter = NvmlMeter(library=FakeNvml(gpus=[gpu]), clock=clock)
    assert meter.open()
    first = meter.read()
    clock.t += 2.0
    gpu.power_mw = 300_000
    second = meter.read()
    assert first is not None and second is not None
    # trapezoid: (100 W + 300 W) / 2 x 2 s = 400 J = 400,000 mJ
    assert delta_mj(first, second) == (pytest.approx(400_000.0),)
    assert second.methods == (POWER_POLL,)


def test_counter_going_backwards_counts_as_zero() -> None:
    before = GpuEnergyReading(at=0.0, energy_mj=(5_000.0,), power_w=(1.0,), methods=(COUNTER,))
    after = GpuEnergyReading(at=1.0, energy_mj=(10.0,), power_w=(1.0,), methods=(COUNTER,))
    assert delta_mj(before, after) == (0.0,)


def test_no_gpu_library_degrades_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    meter = NvmlMeter(library=FakeNvml(library_found=False))
    with caplog.at_level(logging.INFO, logger="scheduler.energy.nvml"):
        assert meter.open() is False
    assert not meter.available
    assert meter.read() is None
    assert meter.unavailable_reason is not None and "LibraryNotFound" in meter.unavailable_reason
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "energy is estimated" in lines[0]


def test_no_devices_degrades() -> None:
    library = FakeNvml(gpus=[])
    meter = NvmlMeter(library=library)
    assert meter.open() is False
    assert meter.unavailable_reason == "NVML sees no GPU"
    assert library.shutdowns == 1


def test_a_failed_read_is_not_measured_and_the_next_one_is() -> None:
    library = FakeNvml(gpus=[FakeGpu(energy_mj=0, power_mw=1000)])
    meter = NvmlMeter(library=library, clock=ManualClock())
    assert meter.open()
    library.fail_reads = True
    assert meter.read() is None
    library.fail_reads = False
    assert meter.read() is not None


def test_close_shuts_nvml_down() -> None:
    library = FakeNvml(gpus=[FakeGpu()])
    meter = NvmlMeter(library=library)
    meter.open()
    meter.close()
    assert library.shutdowns == 1 and not meter.available and meter.read() is None


def test_real_pynvml_without_gpu_degrades_cleanly() -> None:
    """On this machine (no NVIDIA driver) the real library raises NVMLError_LibraryNotFound;
    on a GPU machine the real meter must open and read."""
    meter = NvmlMeter()
    if meter.open():
        reading = meter.read()
        assert reading is not None and len(reading.energy_mj) == meter.gpu_count > 0
        meter.close()
    else:
        assert meter.read() is None and meter.unavailable_reason
