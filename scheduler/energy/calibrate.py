"""``scheduler calibrate``: measure a pool on a real NVIDIA GPU and fit its energy profile.

For each (batch, context, output) of the sweep the engine runs ``batch`` distinct requests
together (random prompts of ``context`` tokens, prefix cache off, exactly ``output`` tokens,
EOS ignored), once to warm up and then ``repeats`` times between two readings of NVML's
energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since driver load) on the
replica's GPUs, timing each run; the median run is the point. An idle window with the model
loaded gives the execution-idle floor. ``fit.fit_step_costs`` turns the points into the
profile's step costs (energy and time terms); the interval is the fit's largest relative
residual, at least ``MIN_REL_ERROR``.

The engine and the NVML library are injected: the real ones are vLLM and ``pynvml``;
tests drive the same code with a simulated GPU that implements the same calls.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tqdm import tqdm

from scheduler.energy.fit import CalibrationFit, SweepPoint, fit_step_costs
from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec
from scheduler.energy.nvml import NvmlMeter, delta_mj
from scheduler.energy.profiles import EnergyProfile, Residuals, Source
from scheduler.energy.step import kv_tokens_per_replica

# Smallest interval a calibrated profile claims (NVML's counter and run-to-run spread).
MIN_REL_ERROR = 0.05

CALIBRATION_SOURCE = Source(
    name="scheduler calibrate (NVML total energy counter around vLLM sweep runs)",
    url="https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html",
    used_for="every coefficient: least-squares fit of metered sweep runs on this pool",
)


class Engine(Protocol):
    def run(self, batch: int, context: int, output: int) -> None:
        """Run ``batch`` requests of ``context`` prompt tokens and ``output`` tokens to completion."""
        ...


@dataclass(frozen=True)
class Sweep:
    batches: tuple[int, ...] = (1, 4, 16, 64, 256)
    contexts: tuple[int, ...] = (32, 1024, 4096)
    outputs: tuple[int, ...] = (16, 128, 512)

    def points(self) -> list[tuple[int, int, int]]:
        return [(b, c, n) for b in self.batches for c in self.contexts for n in self.outputs]

    @property
    def max_len(self) -> int:
        return max(self.contexts) + max(self.outputs)


def parse_sweep(text: str) -> Sweep:
    """'batch=1,8,64;context=128,2048;output=32,256' (any subset; the rest default)."""
    fields = {"batch": "batches", "context": "contexts", "output": "outputs"}
    values: dict[str, tuple[int, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, numbers = part.partition("=")
        if name.strip() not in fields:
            raise ValueError(f"--sweep: unknown axis {name.strip()!r} (expected batch, context, output)")
        try:
            parsed = tuple(int(x) for x in numbers.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--sweep: {name.strip()}: expected integers, got {numbers!r}") from None
        if not parsed or min(parsed) < 1:
            raise ValueError(f"--sweep: {name.strip()}: expected positive integers, got {numbers!r}")
        values[fields[name.strip()]] = parsed
    return Sweep(**values)


@dataclass
class Calibrator:
    meter: NvmlMeter
    engine: Engine
    gpu_indices: Sequence[int]
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    repeats: int = 2

    def measure_joules(self, work: Callable[[], None]) -> tuple[float, float]:
        before = self.meter.read()
        start = self.clock()
        work()
        after = self.meter.read()
        if before is None or after is None:
            raise RuntimeError("NVML read failed during calibration")
        spent = delta_mj(before, after)
        return sum(spent[i] for i in self.gpu_indices) / 1000.0, self.clock() - start

    def idle_w(self, seconds: float) -> float:
        joules, elapsed = self.measure_joules(lambda: self.sleep(seconds))
        return joules / elapsed if elapsed > 0 else 0.0

    def sweep(self, sweep: Sweep, progress: bool = True) -> list[SweepPoint]:
        points = []
        for batch, context, output in tqdm(sweep.points(), desc="calibrate", disable=not progress):
            self.engine.run(batch, context, output)  # warm-up: compile, allocate
            run = functools.partial(self.engine.run, batch, context, output)
            runs = [self.measure_joules(run) for _ in range(self.repeats)]
            energy = statistics.median(j for j, _ in runs)
            duration = statistics.median(s for _, s in runs)
            points.append(SweepPoint(batch, context, output, energy, duration))
        return points


def calibrated_profile(
    model: ModelSpec, gpu: str, precision: str, tensor_parallel: int, fit: CalibrationFit, today: dt.date
) -> EnergyProfile:
    return EnergyProfile(
        model=model.name,
        gpu=gpu,
        precision=precision,
        tensor_parallel=tensor_parallel,
        method="calibrated",
        date=today,
        rel_error=min(0.9, max(MIN_REL_ERROR, math.ceil(fit.max_rel_residual * 100) / 100)),
        interval=f"max |relative residual| of the {fit.points} sweep runs ({fit.max_rel_residual:.3f}), "
        f"at least {MIN_REL_ERROR}",
        costs=fit.costs,
        parameters=None,
        generation="",
        residuals=Residuals(fit.points, fit.rel_rmse, fit.max_rel_residual),
        points=(),
        sources=(CALIBRATION_SOURCE,),
        path="",
    )


def calibration_note(fit: CalibrationFit, points: Sequence[SweepPoint]) -> str:
    dropped = f"; terms fitted below zero and dropped: {', '.join(fit.dropped_terms)}" if fit.dropped_terms else ""
    return (
        f"calibrated: least-squares fit of the step costs to {fit.points} metered sweep runs "
        f"(batch {sorted({p.batch for p in points})}, context {sorted({p.context for p in points})}, "
        f"output {sorted({p.output for p in points})}); energy relative RMS residual {fit.rel_rmse:.3f}, "
        f"worst {fit.max_rel_residual:.3f}; time relative RMS {fit.time_rel_rmse:.3f}{dropped}"
    )


def fit_sweep(
    model: ModelSpec, gpu: GpuSpec, precision: str, tensor_parallel: int, points: Sequence[SweepPoint],
    idle_w: float,
) -> CalibrationFit:
    capacity = kv_tokens_per_replica(model, gpu, precision, tensor_parallel)
    return fit_step_costs(points, idle_w, kv_capacity_tokens=capacity)


# NVML device-name fragments -> catalogue names; A100s differ only by memory size.
_NVML_NAMES = (("H200", "H200-141GB"), ("H100", "H100-80GB"), ("B200", "B200"), ("L4", "L4"))


def catalogue_gpu_name(nvml_name: str, memory_bytes: int) -> str | None:
    words = nvml_name.upper().replace("-", " ").split()
    if "A100" in words:
        return "A100-80GB" if memory_bytes > 60 * 2**30 else "A100-40GB"
    return next((name for fragment, name in _NVML_NAMES if fragment in words), None)


class VllmEngine:
    """The real engine: vLLM's offline ``LLM`` on the replica's GPUs (imported here, not at
    module top: it pulls in torch and CUDA)."""

    def __init__(self, model_dir: str, tensor_parallel: int, max_batch: int, max_len: int, seed: int = 0) -> None:
        import random

        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        self._llm = LLM(
            model=model_dir,
            tensor_parallel_size=tensor_parallel,
            max_num_seqs=max_batch,
            max_model_len=max_len,
            enable_prefix_caching=False,
            seed=seed,
        )
        self._sampling = SamplingParams
        self._prompt = TokensPrompt
        self._vocab = self._llm.llm_engine.model_config.get_vocab_size()
        self._rng = random.Random(seed)

    def run(self, batch: int, context: int, output: int) -> None:
        # Distinct random prompts: nothing shared between requests, nothing cached.
        prompts = [
            self._prompt(prompt_token_ids=[self._rng.randrange(100, self._vocab) for _ in range(context)])
            for _ in range(batch)
        ]
        params = self._sampling(max_tokens=output, min_tokens=output, ignore_eos=True, temperature=0.0)
        self._llm.generate(prompts, params, use_tqdm=False)
