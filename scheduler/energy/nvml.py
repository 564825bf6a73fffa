"""GPU energy measured through NVML (``nvidia-ml-py``, imported as ``pynvml``).

``NvmlMeter.read()`` gives, per GPU of the node, a cumulative energy in mJ:

- from the driver's energy counter (``nvmlDeviceGetTotalEnergyConsumption``: mJ since the
  driver loaded; Volta and newer), or
- where that counter is not supported, by integrating ``nvmlDeviceGetPowerUsage`` (mW)
  between reads with the trapezoid rule ("power-poll"; as good as the polling rate).

``delta_mj(before, after)`` turns two readings into per-GPU joules spent in between.

Resolution (``boundary_error_j``): the counter counts mJ, but the driver updates it every
20-100 ms on current GPUs (PETSc's notes on ``nvmlDeviceGetTotalEnergyConsumption``,
petsc.org ``PetscLogGpuEnergyMeter``), and ``nvmlDeviceGetPowerUsage`` is a 1 s average on
Ampere and newer (NVML API reference). So the energy drawn within one update period of a
reading may be counted on either side of it:

    boundary_error_j = power_w x READING_LAG_S[method] + COUNTER_QUANTUM_J     per GPU and reading

``python -m scheduler.region.gpu_check`` prints the update period a GPU really shows.

Without a GPU (no driver, no library: ``NVMLError_LibraryNotFound`` and friends) the meter
is simply unavailable: ``read()`` returns None, and one log line says that energy is
estimated by the energy model instead. The NVML library is injected so that tests run the
same code against a fake that implements the same calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

# pynvml's return codes we act on (``NVMLError.value``).
NVML_ERROR_NOT_SUPPORTED = 3

COUNTER = "counter"
POWER_POLL = "power-poll"
# How far from a reading the energy it counts may have been drawn (module doc): the counter's
# slowest update period, the power average's window.
READING_LAG_S = {COUNTER: 0.1, POWER_POLL: 1.0}
COUNTER_QUANTUM_J = 0.001


class NvmlLibrary(Protocol):
    """The subset of ``pynvml`` the meter calls (the module satisfies it)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...


@dataclass(frozen=True, slots=True)
class GpuEnergyReading:
    """Cumulative energy (mJ) and instantaneous power (W) per GPU at ``at`` (monotonic s)."""

    at: float
    energy_mj: tuple[float, ...]
    power_w: tuple[float, ...]
    methods: tuple[str, ...]

    @property
    def total_power_w(self) -> float:
        return sum(self.power_w)


def boundary_error_j(reading: GpuEnergyReading, gpu: int) -> float:
    """Energy of GPU ``gpu`` that may fall on either side of ``reading`` (module doc)."""
    return reading.power_w[gpu] * READING_LAG_S[reading.methods[gpu]] + COUNTER_QUANTUM_J


def delta_mj(before: GpuEnergyReading, after: GpuEnergyReading) -> tuple[float, ...]:
    """Per-GPU energy spent between two readings; a counter that went backwards (driver
    reload) counts as zero rather than as a negative bill."""
    return tuple(max(0.0, b - a) for a, b in zip(before.energy_mj, after.energy_mj, strict=True))


def _load_pynvml() -> NvmlLibrary | None:
    try:
        import pynvml
    except ImportError:
        return None
    library: NvmlLibrary = pynvml
    return library


class NvmlMeter:
    """Reads every GPU of this node. Not thread-safe; one per process that meters."""

    def __init__(
        self,
        library: NvmlLibrary | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._library = library
        self._clock = clock
        self._handles: list[Any] = []
        self._counter_ok: list[bool] = []
        self._last: GpuEnergyReading | None = None
        self._opened = False
        self.unavailable_reason: str | None = None

    @property
    def available(self) -> bool:
        return self._opened

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def open(self) -> bool:
        """Initialise NVML; False (and one log line) when there is no GPU to measure."""
        library = self._library or _load_pynvml()
        if library is None:
            return self._degrade("nvidia-ml-py is not installed")
        self._library = library
        try:
            library.nvmlInit()
            count = library.nvmlDeviceGetCount()
            self._handles = [library.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._counter_ok = [self._has_counter(h) for h in self._handles]
        except library.NVMLError as exc:
            return self._degrade(f"{type(exc).__name__}: {exc}")
        if not self._handles:
            library.nvmlShutdown()
            return self._degrade("NVML sees no GPU")
        self._opened = True
        log.info(
            "NVML: metering %d GPU(s) (%s)", len(self._handles),
            ", ".join(COUNTER if ok else POWER_POLL for ok in self._counter_ok),
        )
        return True

    def read(self) -> GpuEnergyReading | None:
        """A reading of every GPU, or None when NVML is unavailable or a read failed."""
        if not self._opened or self._library is None:
            return None
        library = self._library
        now = self._clock()
        last = self._last
        energy: list[float] = []
        power: list[float] = []
        try:
            for i, handle in enumerate(self._handles):
                watts = library.nvmlDeviceGetPowerUsage(handle) / 1000.0
                power.append(watts)
                if self._counter_ok[i]:
                    energy.append(float(library.nvmlDeviceGetTotalEnergyConsumption(handle)))
                elif last is None:
                    energy.append(0.0)
                else:
                    # Trapezoid between the previous and this power sample; W x s x 1000 = mJ.
                    energy.append(last.energy_mj[i] + (last.power_w[i] + watts) / 2 * (now - last.at) * 1000.0)
        except library.NVMLError as exc:
            log.warning("NVML read failed (%s): this interval is not measured", exc)
            return None
        reading = GpuEnergyReading(
            at=now,
            energy_mj=tuple(energy),
            power_w=tuple(power),
            methods=tuple(COUNTER if ok else POWER_POLL for ok in self._counter_ok),
        )
        self._last = reading
        return reading

    def close(self) -> None:
        if self._opened and self._library is not None:
            try:
                self._library.nvmlShutdown()
            except self._library.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)
        self._opened = False
        self._handles = []

    def _has_counter(self, handle: Any) -> bool:
        assert self._library is not None
        try:
            self._library.nvmlDeviceGetTotalEnergyConsumption(handle)
        except self._library.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_ERROR_NOT_SUPPORTED:
                return False
            raise
        return True

    def _degrade(self, reason: str) -> bool:
        self.unavailable_reason = reason
        self._opened = False
        log.info("NVML unavailable (%s): GPU energy is estimated by the energy model "
                 "(measurement_source=model)", reason)
        return False
