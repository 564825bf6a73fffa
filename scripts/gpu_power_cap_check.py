#!/usr/bin/env python3
"""Check the power-cap path on an NVIDIA GPU machine: set a cap through NVML, read it back,
load the GPU under it, compare with the energy model, put the old limit back.

    python scripts/gpu_power_cap_check.py [--device 0] [--cap W] [--load-s 8] [--no-load] [--json]

1. NVML through the real ``PowerCapper`` (``scheduler.region.power_caps``): the device's name,
   limit, [min, max] constraints. Without a GPU: exit 2 (nothing to check).
2. The target: ``--cap``, else the efficient cap the energy model gives the device's GPU type
   (``scheduler.energy.power_cap.efficient_cap``, Llama 3.1 8B BF16).
3. With torch on CUDA (``pip install -e '.[gpu]'`` brings it): a compute-bound load (BF16
   GEMMs) and a memory-bound one (device-to-device copies) at the current limit, NVML power
   sampled every 50 ms.
4. ``set_device``: nvmlDeviceSetPowerManagementLimit (mW, clamped to the constraints), then
   nvmlDeviceGetPowerManagementLimit: the cap counts as set only if it reads back.
5. The same loads under the cap: mean power must stay within 5 % of the cap (+5 W), and the
   throughput ratios are printed next to the model's (compute-bound: the clock ratio r where
   F + (P0 - F) g(r) = cap, from the draw P0 measured at step 3; memory-bound: unchanged).
6. The limit found at step 1 is set back and read back (also on failure or Ctrl-C).

Exit 0: set, read back, power within the cap under load, restored. 1: any of those failed
(setting a limit needs root: run it with sudo). 2: no usable GPU. The model comparison is
reported, not judged: a measured point for ``scheduler/energy/published`` (``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.energy.hardware import GPU_CATALOGUE, GpuSpec
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.power_cap import PowerCap, efficient_cap, floor_w, throttle
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.energy.step import StepCosts
from scheduler.region.power_caps import PowerCapper, matches

POWER_TOLERANCE = 0.05
POWER_SLACK_W = 5.0


def catalogue_gpu(name: str) -> GpuSpec | None:
    return next((spec for spec in GPU_CATALOGUE.values() if matches(spec.name, name)), None)


def model_ratio(gpu: GpuSpec, cap_w: float, draw_w: float, compute: bool) -> float:
    """The model's throughput ratio under ``cap_w`` for a pure compute- or memory-bound load
    that draws ``draw_w`` at the default limit (one term of the step model)."""
    if compute:
        costs = StepCosts(0.0, 1.0, 0.0, 0.0, 0.0, draw_w, 0.0, 0.0, gpu.idle_w)
    else:
        costs = StepCosts(1.0, 0.0, 0.0, 0.0, draw_w, 0.0, 0.0, 0.0, gpu.idle_w)
    result = throttle(costs, PowerCap(cap_w, gpu.tdp_w, floor_w(gpu)), 1.0, 0.0)
    return 1.0 / result.time_factors[1 if compute else 0]


class PowerSampler:
    """NVML power of one device every ``interval_s`` in a thread."""

    def __init__(self, handle: Any, interval_s: float = 0.05) -> None:
        import pynvml

        self._pynvml, self._handle, self._interval = pynvml, handle, interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0)
            time.sleep(self._interval)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean_w(self) -> float:
        # The first samples see the ramp-up.
        steady = self.samples[len(self.samples) // 5:] or self.samples
        return sum(steady) / len(steady) if steady else float("nan")


def run_load(device: int, kind: str, seconds: float, handle: Any) -> dict[str, Any]:
    """Throughput (TFLOP/s or GB/s) and mean power of a compute- or memory-bound loop."""
    import torch

    cuda = torch.device(f"cuda:{device}")
    if kind == "compute":
        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device=cuda)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=cuda)
        work, unit = 2.0 * n**3 / 1e12, "TFLOP/s"

        def step() -> None:
            torch.matmul(a, b)
    else:
        x = torch.empty(2**30, dtype=torch.uint8, device=cuda)
        y = torch.empty_like(x)
        work, unit = 2.0 * x.numel() / 1e9, "GB/s"

        def step() -> None:
            y.copy_(x)
    for _ in range(3):
        step()
    torch.cuda.synchronize(cuda)
    with PowerSampler(handle) as sampler:
        started, count = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            for _ in range(8):
                step()
            torch.cuda.synchronize(cuda)
            count += 8
        elapsed = time.monotonic() - started
    return {"throughput": count * work / elapsed, "power_w": sampler.mean_w, "unit": unit}


def loads_available(device: int) -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        return "torch sees no CUDA device"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--cap", type=float, default=None, help="W (default: the model's efficient cap)")
    parser.add_argument("--load-s", type=float, default=8.0, help="seconds of each load (default 8)")
    parser.add_argument("--no-load", action="store_true", help="only set, read back and restore")
    parser.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    args = parser.parse_args()

    capper = PowerCapper(mode="nvml")  # this check sets limits even where SCHEDULER_POWER_CAPS=dry-run
    if not capper.open():
        print(f"no usable GPU: {capper.unavailable_reason}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"device": args.device}
    ok = True
    try:
        names = capper.device_names
        if args.device >= len(names):
            print(f"device {args.device}: NVML sees {len(names)} GPU(s)", file=sys.stderr)
            return 2
        name = names[args.device]
        gpu = catalogue_gpu(name)
        result["name"], result["catalogue_gpu"] = name, gpu.name if gpu else None
        if args.cap is None and gpu is None:
            print(f"{name} is not in the GPU catalogue: give --cap W", file=sys.stderr)
            return 2
        target = args.cap
        if target is None:
            assert gpu is not None
            eco = efficient_cap(gpu, [(MODEL_CATALOGUE["llama-3.1-8b"], "bf16", 1)], ProfileEnergyModel())
            target = eco.cap_w
            print(f"{name}: the model's efficient cap {target:.0f} W ({eco.share:.0%} of TDP; "
                  f"J/token x{eco.j_per_token_ratio:.2f}, TPOT x{eco.tpot_ratio:.2f} at the reference request)")
        result["target_w"] = target
        handle = capper.handle(args.device)
        import pynvml

        before = pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
        low, high = (v / 1000.0 for v in pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle))
        result.update(before_w=before, min_w=low, max_w=high)
        print(f"GPU {args.device} ({name}): limit {before:.0f} W, constraints [{low:.0f}, {high:.0f}] W")

        why_not = "--no-load" if args.no_load else loads_available(args.device)
        loads: dict[str, dict[str, Any]] = {}
        if not why_not:
            for kind in ("compute", "memory"):
                loads[kind] = run_load(args.device, kind, args.load_s, handle)
                print(f"  at {before:.0f} W, {kind}-bound: {loads[kind]['throughput']:.1f} {loads[kind]['unit']} "
                      f"at {loads[kind]['power_w']:.0f} W")
        else:
            print(f"  no load ({why_not}): only set, read back, restore")

        device = capper.set_device(args.device, target)
        print("  " + device.describe(dry_run=False))
        result["set"] = asdict(device)
        if not device.applied and not device.unchanged:
            return 1
        capped_w = device.to_w
        for kind, base in loads.items():
            under = run_load(args.device, kind, args.load_s, handle)
            ratio = under["throughput"] / base["throughput"]
            predicted = model_ratio(gpu, capped_w, base["power_w"], kind == "compute") if gpu else float("nan")
            within_cap = under["power_w"] <= capped_w * (1 + POWER_TOLERANCE) + POWER_SLACK_W
            ok &= within_cap
            print(f"  at {capped_w:.0f} W, {kind}-bound: {under['throughput']:.1f} at {under['power_w']:.0f} W "
                  f"({'within' if within_cap else 'ABOVE'} the cap); throughput x{ratio:.3f}, model x{predicted:.3f}")
            result[f"{kind}_load"] = {"default": base, "capped": under, "throughput_ratio": ratio,
                                      "model_ratio": predicted, "within_cap": within_cap}
    finally:
        restored = capper.restore()
        for device in restored:
            print("  restored: " + device.describe(dry_run=False))
            ok &= device.applied or device.unchanged
        result["restored"] = [d.to_w for d in restored]
        capper.close()
    if args.json:
        print(json.dumps(result, default=str, indent=2))
    print("power-cap check: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
