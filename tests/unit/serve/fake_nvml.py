"""A fake NVML library: the calls ``NvmlMeter`` makes, over simulated GPUs.

It implements the same interface as ``pynvml`` (``NvmlLibrary``) because NVML cannot run
without an NVIDIA GPU; the meter's real code runs against it. Units as NVML's: energy
counter in mJ since "driver load", power in mW.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class FakeGpu:
    energy_mj: int = 0
    power_mw: int = 0
    has_energy_counter: bool = True


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    library_found: bool = True
    fail_reads: bool = False
    initialised: bool = False
    shutdowns: int = 0
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None:
        if not self.library_found:
            raise NVMLError_LibraryNotFound()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check()
        return self.gpus[index]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._check()
        if not handle.has_energy_counter:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        energy: int = handle.energy_mj
        return energy

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._check()
        power: int = handle.power_mw
        return power

    def _check(self) -> None:
        if not self.initialised:
            raise NVMLError(1)
        if self.fail_reads:
            raise NVMLError(NVML_ERROR_UNKNOWN)
