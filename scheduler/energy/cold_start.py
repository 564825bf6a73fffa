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

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec

ENGINE_START_S = 30.0
LOAD_BYTES_PER_S = 2e9


@dataclass(frozen=True, slots=True)
class ColdStart:
    seconds: float
    joules: float
    # "config": the region file's pool settings; "derived": this module's formula.
    source: str


def cold_start(gpu: GpuSpec, model: ModelSpec, precision: str, tensor_parallel: int,
               cold_start_s: float | None = None, cold_start_j: float | None = None) -> ColdStart:
    """The cold start of one replica of ``model`` at ``precision`` on ``tensor_parallel`` GPUs
    of ``gpu``; ``cold_start_s`` and ``cold_start_j`` are the pool's settings (None: derived)."""
    seconds = cold_start_s if cold_start_s is not None else (
        ENGINE_START_S + model.weight_bytes(precision) / tensor_parallel / LOAD_BYTES_PER_S)
    joules = cold_start_j if cold_start_j is not None else seconds * tensor_parallel * gpu.idle_w
    configured = cold_start_s is not None or cold_start_j is not None
    return ColdStart(seconds, joules, "config" if configured else "derived")
