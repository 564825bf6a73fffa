"""The hardware catalogue: what the scheduler knows about each GPU type.

Figures are the vendors' datasheet values for the SXM parts (dense BF16 tensor FLOP/s, no
sparsity; board power = the configurable maximum TDP):

    A100 40GB / 80GB SXM  1,555 / 2,039 GB/s, 312 TFLOP/s, 400 W
        https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    H100 SXM 80GB         3.35 TB/s, 989 TFLOP/s (1,979 with sparsity), up to 700 W
        https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    H200 SXM 141GB        4.8 TB/s, 989 TFLOP/s (1,979 with sparsity), up to 700 W
        https://www.nvidia.com/en-us/data-center/h200/
    L4 24GB               300 GB/s, 121 TFLOP/s (242 with sparsity), 72 W
        https://www.nvidia.com/en-us/data-center/l4/
    B200 (HGX) 180GB      8 TB/s, 2.25 PFLOP/s (4.5 with sparsity), 1,000 W
        https://www.nvidia.com/en-us/data-center/hgx/

H200 is the H100's die with more and faster HBM at the same power, so between the two the
energy model changes only the bandwidth (decode reads) and the memory (KV capacity).
``generation`` names the architecture whose fitted efficiencies a GPU uses
(``scheduler.energy.fit``). ``idle_w`` is the execution-idle floor: the power a GPU with a
loaded model draws while it waits for work (10-20 % of TDP for data-centre parts).
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
    generation: str = ""

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9


GPU_CATALOGUE: Mapping[str, GpuSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            GpuSpec("A100-40GB", hbm_gb=40, mem_bandwidth_gbs=1555, peak_bf16_tflops=312, tdp_w=400, idle_w=55,
                    generation="ampere"),
            GpuSpec("A100-80GB", hbm_gb=80, mem_bandwidth_gbs=2039, peak_bf16_tflops=312, tdp_w=400, idle_w=60,
                    generation="ampere"),
            GpuSpec("H100-80GB", hbm_gb=80, mem_bandwidth_gbs=3350, peak_bf16_tflops=989, tdp_w=700, idle_w=75,
                    generation="hopper"),
            GpuSpec("H200-141GB", hbm_gb=141, mem_bandwidth_gbs=4800, peak_bf16_tflops=989, tdp_w=700, idle_w=80,
                    generation="hopper"),
            GpuSpec("L4", hbm_gb=24, mem_bandwidth_gbs=300, peak_bf16_tflops=121, tdp_w=72, idle_w=16,
                    generation="ada"),
            GpuSpec("B200", hbm_gb=180, mem_bandwidth_gbs=8000, peak_bf16_tflops=2250, tdp_w=1000, idle_w=140,
                    generation="blackwell"),
        )
    }
)
