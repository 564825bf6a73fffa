"""The hardware catalogue: what the scheduler knows about each GPU type.

Figures are the vendors' datasheet values for the SXM parts (dense BF16 tensor FLOP/s,
no sparsity). ``idle_w`` is the execution-idle floor: the power a GPU with a loaded model
draws while it waits for work (measured figures from the ML.ENERGY leaderboard and
NVIDIA's nvidia-smi on idle servers put it at 10-20 % of TDP for data-centre parts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    hbm_gb: float
    mem_bandwidth_gbs: float
    peak_bf16_tflops: float
    tdp_w: float
    idle_w: float

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9


GPU_CATALOGUE: Mapping[str, GpuSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            GpuSpec("A100-40GB", hbm_gb=40, mem_bandwidth_gbs=1555, peak_bf16_tflops=312, tdp_w=400, idle_w=55),
            GpuSpec("A100-80GB", hbm_gb=80, mem_bandwidth_gbs=2039, peak_bf16_tflops=312, tdp_w=400, idle_w=60),
            GpuSpec("H100-80GB", hbm_gb=80, mem_bandwidth_gbs=3350, peak_bf16_tflops=989, tdp_w=700, idle_w=75),
            GpuSpec("H200-141GB", hbm_gb=141, mem_bandwidth_gbs=4800, peak_bf16_tflops=989, tdp_w=700, idle_w=80),
            GpuSpec("L4", hbm_gb=24, mem_bandwidth_gbs=300, peak_bf16_tflops=121, tdp_w=72, idle_w=16),
            GpuSpec("B200", hbm_gb=180, mem_bandwidth_gbs=8000, peak_bf16_tflops=2250, tdp_w=1000, idle_w=140),
        )
    }
)
