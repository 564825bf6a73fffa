"""A region's GPU power caps, set through NVML when the region's serving side starts.

For every pool the region serves, the cap in effect (``scheduler.energy.power_cap.PoolCap``:
the pool's ``power_cap_w``, or with the region's ``eco`` switch on, its efficient cap) is set
on each GPU of this node that is of the pool's type (NVML's device name against the
catalogue's: "NVIDIA H100 80GB HBM3" is an H100-80GB), as NVML's power management limit:

    nvmlDeviceGetPowerManagementLimitConstraints(handle) -> [min mW, max mW]
    nvmlDeviceGetPowerManagementLimit(handle)            -> the limit before (mW)
    nvmlDeviceSetPowerManagementLimit(handle, mW)        (needs root)
    nvmlDeviceGetPowerManagementLimit(handle)            -> read back: applied only if it equals

The request is clamped to the device's [min, max] first (the report says to which). A device
already at the target is left alone. Two pools of the region on GPUs of the same type share
those devices: the lower cap is set. ``restore()`` puts back the limits found before.

Without a GPU (no driver, no library, no device: a laptop, CI, the local CPU stack) nothing is
set: the report is a dry run that says what would be set, device by device (the pool's GPUs
on this node as one local replica uses them: one each, numbered from 0 in pool order),
from the default limit (assumed: TDP, with no device to read) to the target, and why it is a
dry run. It never reports a cap as applied that NVML did not read back.

``SCHEDULER_POWER_CAPS=dry-run`` makes a GPU node dry-run too (a shared development machine).
The NVML library is injected so that tests run the same code against a fake with the same calls.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

from scheduler.config.compile import compile_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import pool_power_cap
from scheduler.energy.energy_model import EnergyModel
from scheduler.energy.nvml import NVML_ERROR_NOT_SUPPORTED
from scheduler.energy.power_cap import PoolCap
from scheduler.energy.profile_energy_model import ProfileEnergyModel

log = logging.getLogger(__name__)

MODE_ENV = "SCHEDULER_POWER_CAPS"
NVML_ERROR_NO_PERMISSION = 4
# A limit read back within this of the target counts as set (NVML works in whole mW).
READ_BACK_TOLERANCE_W = 0.5

Mode = Literal["nvml", "dry-run"]


class PowerLimitLibrary(Protocol):
    """The subset of ``pynvml`` the capper calls (the module satisfies it)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetName(self, handle: Any) -> Any: ...

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int: ...

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> Sequence[int]: ...

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None: ...


def _load_pynvml() -> PowerLimitLibrary | None:
    try:
        import pynvml
    except ImportError:
        return None
    library: PowerLimitLibrary = pynvml
    return library


def matches(catalogue_name: str, nvml_name: str) -> bool:
    """Whether an NVML device name is the catalogue GPU: its family ("H100") appears in the
    name, and a memory size the name states ("80GB") is the catalogue's."""
    family, _, memory = catalogue_name.upper().partition("-")
    tokens = re.split(r"[^A-Z0-9]+", nvml_name.upper())
    if family not in tokens:
        return False
    stated = [t for t in tokens if re.fullmatch(r"\d+GB", t)]
    return not stated or not memory or memory in stated


@dataclass(frozen=True)
class DeviceCap:
    """One GPU: its limit before, the cap asked for, what was (or would be) set."""

    index: int
    name: str
    # Before (W); with ``assumed`` the default limit (TDP) stands in: no device was read.
    from_w: float
    requested_w: float
    # After clamping to the device's constraints.
    to_w: float
    # "" (within the constraints), "min" or "max": the constraint the request was clamped to.
    clamped: str = ""
    min_w: float | None = None
    max_w: float | None = None
    assumed: bool = False
    applied: bool = False
    read_back_w: float | None = None
    error: str = ""
    # The region's pools that share this device (more than one: the lowest of their caps is set).
    shared_with: str = ""

    @property
    def unchanged(self) -> bool:
        return abs(self.from_w - self.to_w) <= READ_BACK_TOLERANCE_W

    def describe(self, dry_run: bool) -> str:
        source = " (assumed: the default limit, TDP)" if self.assumed else ""
        bounds = (f"within [{self.min_w:.0f}, {self.max_w:.0f}] W" if self.min_w is not None and self.max_w is not None
                  else "device constraints unknown without a device")
        clamp = (f"clamped to the device's {self.clamped} {self.to_w:.0f} W from {self.requested_w:.0f} W"
                 if self.clamped else f"not clamped ({bounds})")
        shared = f"; shared by pools {self.shared_with}: the lowest cap" if self.shared_with else ""
        head = f"GPU {self.index} ({self.name}): {self.from_w:.0f} W{source} -> {self.to_w:.0f} W, {clamp}{shared}"
        if dry_run:
            return f"would leave {head}: already the target" if self.unchanged else f"would set {head}"
        if self.error:
            return f"NOT set {head}: {self.error}"
        if self.applied:
            return f"set {head}; read back {self.read_back_w:.0f} W"
        if self.unchanged:
            return f"left {head}: already at the target (read {self.read_back_w:.0f} W)"
        read = f"{self.read_back_w:.0f} W" if self.read_back_w is not None else "nothing"
        return f"NOT set {head}: read back {read}"


@dataclass(frozen=True)
class PoolCapReport:
    region: str
    pool: str
    gpu: str
    tdp_w: float
    configured_w: float
    eco: bool
    eco_w: float
    target_w: float
    mode: Mode
    # Why a dry run (or why nothing was set on a GPU node).
    reason: str
    devices: tuple[DeviceCap, ...] = ()
    # The energy model at the eco cap, at a busy replica (ratios to TDP): J per output token,
    # time per output token, prefill time.
    eco_j_per_token_ratio: float = 1.0
    eco_tpot_ratio: float = 1.0
    eco_prefill_ratio: float = 1.0

    @property
    def applied(self) -> bool:
        return self.mode == "nvml" and any(d.applied for d in self.devices)

    def lines(self) -> list[str]:
        eco = "on" if self.eco else "off"
        head = (f"power cap {self.region}/{self.pool} ({self.gpu}, TDP {self.tdp_w:.0f} W): configured "
                f"{self.configured_w:.0f} W, eco cap {self.eco_w:.0f} W (eco {eco}), target {self.target_w:.0f} W")
        model = (f"  energy model at the eco cap, busy replica: J/token x{self.eco_j_per_token_ratio:.2f}, "
                 f"TPOT x{self.eco_tpot_ratio:.2f}, prefill x{self.eco_prefill_ratio:.2f}")
        dry = self.mode == "dry-run"
        status = f"  dry run: no GPU ({self.reason}); nothing was set" if dry else f"  NVML: {self.reason}"
        return [head, model, status] + [f"    {d.describe(dry)}" for d in self.devices]


@dataclass(frozen=True)
class RegionCapReport:
    """What the region's serving side did with its power caps at start (``GET /power-caps``)."""

    region: str
    eco: bool
    mode: Mode
    reason: str
    pools: tuple[PoolCapReport, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        return [line for pool in self.pools for line in pool.lines()]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegionCapReport:
        pools = tuple(
            PoolCapReport(**{**p, "devices": tuple(DeviceCap(**d) for d in p.get("devices", ()))})
            for p in data.get("pools", ())
        )
        return cls(region=data["region"], eco=bool(data["eco"]), mode=data["mode"], reason=data["reason"],
                   pools=pools)


def region_pool_caps(region: RegionConfig, pools: Sequence[str] | None = None,
                     energy_model: EnergyModel | None = None) -> dict[str, PoolCap]:
    """The caps of the region's ``pools`` (default: all), by pool name, in config order."""
    model = energy_model or ProfileEnergyModel()
    wanted = set(pools) if pools is not None else None
    compiled = compile_fleet((region,)).regions[0]
    return {p.name: pool_power_cap(compiled, p, model) for p in compiled.pools if wanted is None or p.name in wanted}


class PowerCapper:
    """Sets and restores the power limits of this node's GPUs. Not thread-safe."""

    def __init__(self, library: PowerLimitLibrary | None = None, mode: Mode | None = None) -> None:
        self._library = library
        self._mode_wanted = mode
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._opened = False
        self._before: dict[int, int] = {}  # device -> limit (mW) before we changed it
        self.unavailable_reason = ""

    @property
    def available(self) -> bool:
        return self._opened

    def open(self) -> bool:
        """Initialise NVML; False (the reason in ``unavailable_reason``) when caps cannot be set."""
        wanted = self._mode_wanted or os.environ.get(MODE_ENV, "apply")
        if wanted == "dry-run":
            self.unavailable_reason = f"{MODE_ENV}=dry-run"
            return False
        library = self._library or _load_pynvml()
        if library is None:
            self.unavailable_reason = "nvidia-ml-py is not installed"
            return False
        self._library = library
        try:
            library.nvmlInit()
        except library.NVMLError as exc:
            self.unavailable_reason = f"NVML: {type(exc).__name__}: {exc}"
            return False
        try:
            count = library.nvmlDeviceGetCount()
            self._handles = [library.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(library.nvmlDeviceGetName(h)) for h in self._handles]
        except library.NVMLError as exc:
            library.nvmlShutdown()
            self.unavailable_reason = f"NVML: {type(exc).__name__}: {exc}"
            return False
        if not self._handles:
            library.nvmlShutdown()
            self.unavailable_reason = "NVML sees no GPU"
            return False
        self._opened = True
        return True

    def handle(self, index: int) -> Any:
        """NVML's handle of device ``index`` (after ``open``)."""
        return self._handles[index]

    @property
    def device_names(self) -> tuple[str, ...]:
        """NVML's name of each device, by index (empty until ``open``)."""
        return tuple(self._names)

    def close(self) -> None:
        if self._opened and self._library is not None:
            try:
                self._library.nvmlShutdown()
            except self._library.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)
        self._opened = False

    def apply(self, region: RegionConfig, caps: Mapping[str, PoolCap]) -> RegionCapReport:
        """Set each pool's target on its devices (module doc); a dry run when NVML is not open."""
        if not self._opened:
            reason = self.unavailable_reason or "NVML not opened"
            return RegionCapReport(region.name, region.eco, "dry-run", reason, tuple(
                _dry_pool(region, name, cap, index, reason) for index, (name, cap) in enumerate(caps.items())))
        claims: dict[int, list[tuple[str, PoolCap]]] = {}
        for name, cap in caps.items():
            for index, device in enumerate(self._names):
                if matches(cap.gpu.name, device):
                    claims.setdefault(index, []).append((name, cap))
        done: dict[int, DeviceCap] = {}
        for index, claimants in claims.items():
            lowest = min(cap.target_w for _, cap in claimants)
            shared = ", ".join(n for n, _ in claimants) if len(claimants) > 1 else ""
            done[index] = self.set_device(index, lowest, shared)
        reports = []
        for name, cap in caps.items():
            devices = tuple(done[i] for i, claimants in sorted(claims.items()) if any(n == name for n, _ in claimants))
            reason = (f"{len(devices)} GPU(s) of type {cap.gpu.name} on this node" if devices
                      else f"no GPU of type {cap.gpu.name} on this node ({', '.join(sorted(set(self._names)))}): "
                           "nothing to set")
            reports.append(_report(region, name, cap, "nvml", reason, devices))
        applied = sum(d.applied for d in done.values())
        return RegionCapReport(region.name, region.eco, "nvml", f"{len(self._names)} GPU(s); {applied} limit(s) changed",
                               tuple(reports))

    def restore(self) -> list[DeviceCap]:
        """Put back the limits found before ``apply`` changed them (best effort)."""
        restored = []
        for index, before_mw in sorted(self._before.items()):
            restored.append(self.set_device(index, before_mw / 1000.0, ""))
        self._before.clear()
        return restored

    def set_device(self, index: int, target_w: float, shared_with: str = "") -> DeviceCap:
        """Set one device's limit to ``target_w`` (clamped to its constraints) and read it back."""
        assert self._library is not None
        library = self._library
        handle, name = self._handles[index], self._names[index]
        try:
            before = library.nvmlDeviceGetPowerManagementLimit(handle)
            low, high = (int(v) for v in library.nvmlDeviceGetPowerManagementLimitConstraints(handle))
        except library.NVMLError as exc:
            return DeviceCap(index, name, float("nan"), target_w, target_w, error=_nvml_error(exc),
                             shared_with=shared_with)
        want = round(target_w * 1000)
        clamped, to = "", want
        if want < low:
            clamped, to = "min", low
        elif want > high:
            clamped, to = "max", high
        planned = DeviceCap(index=index, name=name, from_w=before / 1000.0, requested_w=target_w, to_w=to / 1000.0,
                            clamped=clamped, min_w=low / 1000.0, max_w=high / 1000.0, shared_with=shared_with)
        if abs(before - to) <= READ_BACK_TOLERANCE_W * 1000:
            return replace(planned, read_back_w=before / 1000.0)
        try:
            library.nvmlDeviceSetPowerManagementLimit(handle, to)
        except library.NVMLError as exc:
            return replace(planned, error=_nvml_error(exc))
        # NVML took it: restore() puts back what was here, whatever the read-back says.
        self._before.setdefault(index, before)
        try:
            read = library.nvmlDeviceGetPowerManagementLimit(handle)
        except library.NVMLError as exc:
            return replace(planned, error=f"set, but the read-back failed: {_nvml_error(exc)}")
        applied = abs(read - to) <= READ_BACK_TOLERANCE_W * 1000
        return replace(planned, applied=applied, read_back_w=read / 1000.0,
                       error="" if applied else "the limit read back is not the one set")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_error(exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == NVML_ERROR_NO_PERMISSION:
        return f"{type(exc).__name__}: no permission (setting a power limit needs root)"
    if code == NVML_ERROR_NOT_SUPPORTED:
        return f"{type(exc).__name__}: this GPU does not support power limits"
    return f"{type(exc).__name__}: {exc}"


def _report(region: RegionConfig, name: str, cap: PoolCap, mode: Mode, reason: str,
            devices: tuple[DeviceCap, ...]) -> PoolCapReport:
    e = cap.efficient
    return PoolCapReport(region.name, name, cap.gpu.name, cap.tdp_w, cap.configured_w, cap.eco, cap.eco_w,
                         cap.target_w, mode, reason, devices, e.j_per_token_ratio, e.tpot_ratio, e.prefill_ratio)


def _dry_pool(region: RegionConfig, name: str, cap: PoolCap, index: int, reason: str) -> PoolCapReport:
    """Without a device: the pool's GPU on this node as one local replica uses it (GPU
    ``index``, pools numbered in order), at the default limit (TDP), set to the target
    (clamped only to TDP: the device's own constraints are unknown)."""
    to = min(cap.target_w, cap.tdp_w)
    device = DeviceCap(index=index, name=cap.gpu.name, from_w=cap.tdp_w, requested_w=cap.target_w, to_w=to,
                       clamped="max" if to < cap.target_w else "", max_w=None, assumed=True)
    return _report(region, name, cap, "dry-run", reason, (device,))


def apply_region_caps(region: RegionConfig, pools: Sequence[str] | None = None,
                      capper: PowerCapper | None = None,
                      energy_model: EnergyModel | None = None) -> tuple[RegionCapReport, PowerCapper]:
    """What the region's serving side runs at start: open NVML, set each served pool's cap
    (or dry-run), log one line per device, return the report and the capper (to restore)."""
    capper = capper or PowerCapper()
    caps = region_pool_caps(region, pools, energy_model)
    capper.open()
    report = capper.apply(region, caps)
    for line in report.lines():
        log.info("%s", line.strip())
    return report, capper


def dry_run_report(region: RegionConfig, pools: Sequence[str] | None = None,
                   energy_model: EnergyModel | None = None, reason: str = "no NVML on this machine") -> RegionCapReport:
    """The dry run of ``region`` without touching NVML (the demo's fallback, offline tools)."""
    capper = PowerCapper(mode="dry-run")
    capper.unavailable_reason = reason
    return capper.apply(region, region_pool_caps(region, pools, energy_model))


__all__ = ["DeviceCap", "PoolCapReport", "PowerCapper", "PowerLimitLibrary", "RegionCapReport",
           "apply_region_caps", "dry_run_report", "matches", "region_pool_caps"]
