"""What waking one replica of a model from zero costs: the seconds until it serves and the
joules its GPUs draw meanwhile.

    seconds = ENGINE_START_S + weight bytes / tensor_parallel / LOAD_BYTES_PER_S
    joules  = seconds x tensor_parallel x the GPU's idle power
Reads: the pool's ``cold_start_s`` and ``cold_start_j`` where its region file gives them (they
win), the model's weight bytes at its precision, the GPU's idle power.

ENGINE_START_S covers the replica's actor and CUDA context, vLLM's engine start and its CUDA
graph capture; LOAD_BYTES_PER_S is one GPU's share of reading the weights from node-local
storage. While it loads, a GPU draws about its idle power (the short bursts of graph capture
aside), and that draw is caused by the wake-up alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.models import MODEL_CATALOGUE

ENGINE_START_S = 30.0
LOAD_BYTES_PER_S = 2e9


@dataclass(frozen=True, slots=True)
class ColdStart:
    seconds: float
    joules: float
    # "config": the region file's pool settings; "derived": this module's formula.
    source: str


def cold_start(pool: PoolConfig, deployment: ModelDeployment) -> ColdStart:
    """The cold start of one replica of ``deployment`` on ``pool``."""
    gpu = GPU_CATALOGUE[pool.gpu]
    weights = MODEL_CATALOGUE[deployment.name].weight_bytes(deployment.precision)
    seconds = pool.cold_start_s if pool.cold_start_s is not None else (
        ENGINE_START_S + weights / deployment.tensor_parallel / LOAD_BYTES_PER_S)
    joules = pool.cold_start_j if pool.cold_start_j is not None else (
        seconds * deployment.tensor_parallel * gpu.idle_w)
    configured = pool.cold_start_s is not None or pool.cold_start_j is not None
    return ColdStart(seconds, joules, "config" if configured else "derived")
