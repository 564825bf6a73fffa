"""A fake NVML library: the calls ``NvmlMeter`` and ``PowerCapper`` make, over simulated GPUs.

It implements the same interface as ``pynvml`` (``NvmlLibrary``, ``PowerLimitLibrary``) because
NVML cannot run without an NVIDIA GPU; the meter's and the capper's real code run against it
(``test_power_caps`` checks that every call the protocols name exists in ``pynvml`` with the
same parameters). Units as NVML's: energy counter in mJ since "driver load", power and power
limits in mW. Setting a limit needs ``root``; outside the device's constraints NVML answers
NVML_ERROR_INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
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
    name: str = "NVIDIA H100 80GB HBM3"
    limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    # False: the driver accepts a limit but keeps the old one (what a read-back must catch).
    limit_sticks: bool = True


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    library_found: bool = True
    fail_reads: bool = False
    initialised: bool = False
    shutdowns: int = 0
    root: bool = True
    set_calls: list[tuple[int, int]] = field(default_factory=list)
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

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._check()
        name: str = handle.name
        return name

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        self._check()
        limit: int = handle.limit_mw
        return limit

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        self._check()
        return [handle.min_limit_mw, handle.max_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        self._check()
        if not self.root:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not handle.min_limit_mw <= limit <= handle.max_limit_mw:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.set_calls.append((next(i for i, g in enumerate(self.gpus) if g is handle), limit))
        if handle.limit_sticks:
            handle.limit_mw = limit

    def _check(self) -> None:
        if not self.initialised:
            raise NVMLError(1)
        if self.fail_reads:
            raise NVMLError(NVML_ERROR_UNKNOWN)
