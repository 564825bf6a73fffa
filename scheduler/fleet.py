"""The fleet as routing reads it: plain, frozen, slotted objects, one per region, pool and model
deployment of the region files.

``scheduler.config.compile`` makes them from the validated files (``config.schema``), once per
config version; nothing else turns the files' pydantic models into runtime data. The fields keep
the files' names and meanings (the schema documents each); what only the files need (a region's
``local`` profile for ``scheduler up``, the validators) stays there. This module imports nothing
of the config, so the snapshot, the plugins and the data layer depend on it alone.

``Fleet`` holds the regions with every ``Candidate`` (a model on a pool of a region) they make
and the indices decisions start from, built once per config version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """One model deployment's ``autoscaling:`` block (Ray Serve's ``autoscaling_config``)."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float | None
    upscale_delay_s: float
    downscale_delay_s: float
    metrics_interval_s: float
    look_back_period_s: float


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model served on a pool: which weights, at which precision, up to which context."""

    name: str
    precision: str
    max_context: int
    # GPUs per replica (tensor parallelism).
    tensor_parallel: int
    # This model's replica range (None: the default, scheduler.config.autoscaling.replica_ranges).
    autoscaling: Autoscaling | None


@dataclass(frozen=True, slots=True)
class VllmServers:
    """The plain vLLM OpenAI servers behind a pool of a region of kind ``vllm``."""

    urls: tuple[str, ...]
    served_model_names: Mapping[str, str]
    # The environment variable holding the servers' API key (None: they check none).
    api_key_env: str | None


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    gpu: str
    count: int
    models: tuple[Deployment, ...]
    power_cap_w: float
    # Waking one replica from zero (None: derived, scheduler.energy.cold_start).
    cold_start_s: float | None
    cold_start_j: float | None
    # Only in a region of kind ``vllm``: the servers this pool is.
    vllm: VllmServers | None

    def served_model_name(self, model: str) -> str:
        """The name the pool's engine knows ``model`` by (the catalogue name unless renamed)."""
        return model if self.vllm is None else self.vllm.served_model_names.get(model, model)


@dataclass(frozen=True, slots=True)
class Location:
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class CarbonSource:
    """Where the region's grid carbon intensity comes from."""

    provider: str
    zone: str
    poll_interval_s: float


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    # "ray-serve" (the project's region application) or "vllm" (plain vLLM servers).
    kind: str
    jurisdiction: str
    certifications: tuple[str, ...]
    grid_zone: str
    pue: float
    price_per_kwh: float
    location: Location
    endpoint: str
    carbon: CarbonSource
    pools: tuple[Pool, ...]
    # The eco switch: the pools' GPUs run at their efficient power cap (docs/power-caps.md).
    eco: bool

    @property
    def tickets_enforced(self) -> bool:
        """Whether the region refuses a request without a valid dispatch ticket (only the Ray
        Serve gateway checks them; a plain vLLM server runs whatever reaches it)."""
        return self.kind == "ray-serve"

    @property
    def energy_measured(self) -> bool:
        """Whether the region can report measured energy (its gateway's NVML meter, where a GPU
        is); a plain vLLM region's energy is always the model's."""
        return self.kind == "ray-serve"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a request could run: a model deployment on a pool of a region, with the static
    facts the filters and scorers need on every request."""

    index: int
    region: Region
    pool: Pool
    deployment: Deployment
    gpu: GpuSpec
    model: ModelSpec
    # Tokens of KV cache one replica can hold for a single sequence.
    kv_capacity_tokens: int

    @property
    def key(self) -> str:
        return f"{self.region.name}/{self.pool.name}"


@dataclass(frozen=True, slots=True)
class Fleet:
    """The regions of one config version and every candidate they make, with the indices every
    decision starts from (built once, by ``scheduler.config.compile.compile_fleet``)."""

    regions: tuple[Region, ...]
    # Fleet order: region by region, pool by pool, model by model; ``candidates[c.index] is c``.
    candidates: tuple[Candidate, ...]
    # Model name -> the candidates serving it: the first narrowing of every decision.
    candidates_by_model: Mapping[str, tuple[Candidate, ...]]
    # The candidates grouped by (region, pool), in fleet order.
    pools: tuple[tuple[Candidate, ...], ...]
