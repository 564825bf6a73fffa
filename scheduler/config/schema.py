"""Pydantic schemas for the YAML files operators edit: ``regions/*.yaml``, ``policies/*.yaml``.

Unknown keys are errors (``extra="forbid"``) and nothing is coerced silently: a string
where a number belongs is an error, not a guess. Defaults that depend on other fields
(a pool's power cap defaults to its GPU's TDP, a region's carbon zone to its grid zone) are
filled by the loader's ``default`` step, visibly, before validation.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)

from scheduler.config.autoscaling import replica_ranges
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE, PRECISION_BYTES
from scheduler.rates import ClassRates, Rate, parse_rate

CARBON_PROVIDERS = ("csv", "electricitymaps", "watttime", "ukci", "casdk")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """'90s', '15m', '2h', '1d', '250ms' or a bare number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '90m' or '2h', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError(f"expected a duration like '90m' or '2h', got {value!r}")
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_duration_or_zero(value: object) -> float:
    """``parse_duration``, and 0 (at once) as well."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    return parse_duration(value)


def _known_gpu(name: str) -> str:
    if name not in GPU_CATALOGUE:
        raise ValueError(f"{name!r} is not a known GPU (known: {', '.join(GPU_CATALOGUE)})")
    return name


def _known_model(name: str) -> str:
    if name not in MODEL_CATALOGUE:
        raise ValueError(f"{name!r} is not a known model (known: {', '.join(MODEL_CATALOGUE)})")
    return name


def _known_precision(name: str) -> str:
    if name not in PRECISION_BYTES:
        raise ValueError(f"{name!r} is not a known precision (known: {', '.join(PRECISION_BYTES)})")
    return name


def _upper_code(code: str) -> str:
    if not re.fullmatch(r"[A-Z]{2,8}", code):
        raise ValueError(f"expected an upper-case jurisdiction code like 'EU' or 'US', got {code!r}")
    return code


Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
GpuName = Annotated[str, AfterValidator(_known_gpu)]
ModelName = Annotated[str, AfterValidator(_known_model)]
Precision = Annotated[str, AfterValidator(_known_precision)]
Jurisdiction = Annotated[str, AfterValidator(_upper_code)]


class Strict(BaseModel):
    # Files are validated in strict JSON mode by the loader (no '8' -> 8); code that builds
    # configs directly (tests, generated fleets) may pass lists for tuples.
    model_config = ConfigDict(extra="forbid", frozen=True)


class GeoLocation(Strict):
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)


class Autoscaling(Strict):
    """How many replicas of one model's deployment Ray Serve's autoscaler keeps
    (``autoscaling_config``, docs/deploying.md#autoscaling): between ``min_replicas`` (0: the
    model scales to zero when idle) and ``max_replicas``, aiming at ``target_ongoing_requests``
    per replica (None: derived from the engine's max_num_seqs, scheduler.config.autoscaling)."""

    min_replicas: int = Field(ge=0, le=20000)
    max_replicas: int = Field(ge=1, le=20000)
    target_ongoing_requests: float | None = Field(default=None, gt=0)
    upscale_delay_s: Annotated[float, BeforeValidator(parse_duration_or_zero)] = 30.0
    downscale_delay_s: Annotated[float, BeforeValidator(parse_duration_or_zero)] = 600.0
    metrics_interval_s: Duration = 10.0
    look_back_period_s: Duration = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        return self


class ModelDeployment(Strict):
    """A model served on a pool: which weights, at which precision, up to which context."""

    name: ModelName
    precision: Precision = "bf16"
    max_context: int = Field(gt=0)
    # GPUs per replica (tensor parallelism).
    tensor_parallel: int = Field(default=1, ge=1, le=16)
    # This model's replica range (None: the default, scheduler.config.autoscaling.replica_ranges).
    autoscaling: Autoscaling | None = None


BaseUrl = Annotated[str, Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")]


class VllmServers(Strict):
    """The plain vLLM OpenAI servers (``vllm serve``) behind a pool of a region of kind ``vllm``
    (docs/byo-vllm.md): the router dispatches to them directly, and ``scheduler region scrape``
    reads their ``/metrics`` into the region's live state."""

    # Base URLs, without /v1 (``http://10.0.0.5:8000``); a pool's requests are spread over them.
    urls: tuple[BaseUrl, ...] = Field(min_length=1)
    # The name each of the pool's models is served under (vLLM's --served-model-name), where it
    # is not the model's catalogue name.
    served_model_names: dict[ModelName, str] = Field(default_factory=dict)
    # The environment variable that holds the servers' API key (vLLM's --api-key), set on every
    # router and on the side-car (the key itself never goes in a config file); None: the servers
    # check no key.
    api_key_env: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")] | None = None

    @model_validator(mode="after")
    def _unique_urls(self) -> VllmServers:
        repeated = sorted({url for url in self.urls if self.urls.count(url) > 1})
        if repeated:
            raise ValueError(f"urls: a server is listed twice: {repeated}")
        return self


class PoolConfig(Strict):
    name: Slug
    gpu: GpuName
    count: int = Field(gt=0, le=20000)
    models: tuple[ModelDeployment, ...] = Field(min_length=1)
    power_cap_w: float = Field(gt=0)
    # What waking one replica from zero costs: seconds until it serves, and joules its GPUs
    # draw meanwhile (None: derived, scheduler.energy.cold_start; docs/objective.md).
    cold_start_s: Duration | None = None
    cold_start_j: float | None = Field(default=None, ge=0)
    # Only in a region of kind ``vllm``: the servers this pool is.
    vllm: VllmServers | None = None

    @model_validator(mode="after")
    def _replicas_fit(self) -> PoolConfig:
        spec = GPU_CATALOGUE[self.gpu]
        if self.power_cap_w > spec.tdp_w:
            raise ValueError(
                f"power_cap_w {self.power_cap_w} exceeds the {self.gpu} TDP of {spec.tdp_w} W"
            )
        for deployment in self.models:
            if deployment.tensor_parallel > self.count:
                raise ValueError(
                    f"model {deployment.name} needs tensor_parallel={deployment.tensor_parallel} "
                    f"GPUs but the pool has count={self.count}"
                )
        replica_ranges(self)  # raises when the models' max replicas need more GPUs than count
        if self.vllm is not None:
            names = [deployment.name for deployment in self.models]
            unknown = [name for name in self.vllm.served_model_names if name not in names]
            if unknown:
                raise ValueError(f"vllm.served_model_names: {unknown} are not models of this pool (models: {names})")
        return self


class CarbonSource(Strict):
    """Where the region's grid carbon intensity comes from."""

    provider: Literal["csv", "electricitymaps", "watttime", "ukci", "casdk"]
    zone: str = Field(min_length=1)
    poll_interval_s: Duration


class LocalPool(Strict):
    """One pool the region runs locally: a small CPU replica with its own context limit."""

    pool: Slug
    # The local engine's context limit (the tiny model allows up to 2,048 positions): the
    # region publishes it, and the router's live-serving filter holds requests to it.
    max_model_len: int = Field(default=2048, ge=64, le=2048)
    # The local engine's replica range (None: one replica, always up). min_replicas 0 lets the
    # pool scale to zero locally too (each local replica is one CPU engine of ~3 GB).
    autoscaling: Autoscaling | None = None


class LocalProfile(Strict):
    """How the region runs on a laptop or CI box: per listed pool, one Ray Serve LLM
    deployment with one small CPU replica of ``model``, standing for that pool (its GPU,
    its models) in energy prediction and routing. Pools not listed are not served locally."""

    model: str = "tiny-llama"
    pools: tuple[LocalPool, ...] = Field(min_length=1)


class RegionConfig(Strict):
    name: Slug
    # ray-serve: the project's Ray Serve region application (RegionGateway: tickets enforced,
    # live state and measured energy published by the region). vllm: plain vLLM OpenAI servers
    # (each pool's ``vllm.urls``): the router dispatches straight to them, tickets cannot be
    # enforced, energy is the model's, live state comes from ``scheduler region scrape``
    # (docs/byo-vllm.md).
    kind: Literal["ray-serve", "vllm"] = "ray-serve"
    jurisdiction: Jurisdiction
    certifications: tuple[str, ...] = ()
    grid_zone: str = Field(min_length=1)
    pue: float = Field(ge=1.0, le=3.0)
    price_per_kwh: float = Field(ge=0, le=10)
    location: GeoLocation
    endpoint: str = Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    carbon: CarbonSource
    pools: tuple[PoolConfig, ...] = Field(min_length=1)
    local: LocalProfile | None = None
    # The eco switch: each pool's GPUs run at the pool's efficient power cap (the cap that
    # minimises J per token in the energy model, scheduler.energy.power_cap) instead of its
    # power_cap_w (never above it). docs/power-caps.md.
    eco: bool = False

    @model_validator(mode="after")
    def _unique_pools(self) -> RegionConfig:
        names = [pool.name for pool in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique, repeated: {duplicates}")
        if self.local is not None:
            local = [p.pool for p in self.local.pools]
            unknown = [name for name in local if name not in names]
            if unknown:
                raise ValueError(f"local.pools: {unknown} are not pools of this region (pools: {names})")
            if len(set(local)) != len(local):
                raise ValueError(f"local.pools: a pool is listed twice: {local}")
        return self

    @model_validator(mode="after")
    def _kind_fits(self) -> RegionConfig:
        with_servers = [pool.name for pool in self.pools if pool.vllm is not None]
        if self.kind == "ray-serve":
            if with_servers:
                raise ValueError(f"pools {with_servers} list vllm servers, which only a region of kind 'vllm' has "
                                 "(set kind: vllm, or remove their vllm section)")
            return self
        missing = [pool.name for pool in self.pools if pool.vllm is None]
        if missing:
            raise ValueError(f"kind 'vllm': pools {missing} have no vllm.urls (each pool of a plain vLLM region names "
                             "its servers)")
        if self.local is not None:
            raise ValueError("kind 'vllm': a plain vLLM region has no local profile (`scheduler up` runs only "
                             "ray-serve regions); remove local")
        if self.eco:
            raise ValueError("kind 'vllm': eco needs the region to set its GPUs' power caps, which a plain vLLM "
                             "server does not; set the caps on the hosts and remove eco")
        # Ray Serve's autoscaler sizes a ray-serve region's deployments; plain servers run as
        # the operator started them, always warm.
        scaled = [f"{pool.name}/{model.name}" for pool in self.pools for model in pool.models
                  if model.autoscaling is not None]
        cold = [pool.name for pool in self.pools if pool.cold_start_s is not None or pool.cold_start_j is not None]
        if scaled or cold:
            raise ValueError(f"kind 'vllm': plain vLLM servers are neither autoscaled nor woken from zero; remove "
                             f"{', '.join([*(f'autoscaling of {m}' for m in scaled), *(f'cold_start of {p}' for p in cold)])}")
        return self


WORKLOAD_CLASS_NAMES = ("interactive", "batch", "deferrable")


def parse_rate_spec(value: object) -> Rate | ClassRates:
    """One rate for every workload class, or a mapping with a rate for each of them."""
    if not isinstance(value, dict):
        return parse_rate(value)
    problems = [f"unknown workload class {key!r}" for key in value if key not in WORKLOAD_CLASS_NAMES]
    rates: dict[str, Rate] = {}
    for name in WORKLOAD_CLASS_NAMES:
        if name not in value:
            problems.append(f"{name}: no rate given (each of {', '.join(WORKLOAD_CLASS_NAMES)} needs one)")
            continue
        try:
            rates[name] = parse_rate(value[name])
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise ValueError("; ".join(problems))
    return ClassRates(**rates)


def _rate_json(spec: Rate | ClassRates) -> object:
    if isinstance(spec, ClassRates):
        return {name: str(spec.of(name)) for name in WORKLOAD_CLASS_NAMES}
    return str(spec)


_ONE_RATE_SCHEMA = {"anyOf": [{"type": "string", "pattern": r"^ *[0-9.eE+-]+ *USD */ *[A-Za-z0-9]+ *$"},
                              {"type": "number", "minimum": 0}]}
RateSpec = Annotated[
    Rate | ClassRates,
    PlainValidator(parse_rate_spec),
    PlainSerializer(_rate_json),
    WithJsonSchema({
        "anyOf": [_ONE_RATE_SCHEMA, {"type": "object", "additionalProperties": False,
                                     "required": list(WORKLOAD_CLASS_NAMES),
                                     "properties": {name: _ONE_RATE_SCHEMA for name in WORKLOAD_CLASS_NAMES}}],
        "description": "USD per unit of the scorer's quantity, e.g. '200 USD/tCO2e' or '0.5 USD/h' (a bare number "
        "for scorers that report USD), or a mapping with one rate per workload class",
    }),
]


class PluginRef(Strict):
    """A plugin of the registry, by its TYPE, with its parameters (checked against the plugin)."""

    type: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)


class ScorerTerm(PluginRef):
    """One term of the objective: the scorer's quantity times ``rate`` (USD per its unit)."""

    rate: RateSpec

    def rate_for(self, workload_class: str) -> Rate:
        return self.rate.of(workload_class)


class MaxAge(Strict):
    """How old each kind of live signal may be before its scorer abstains."""

    carbon: Duration
    region_state: Duration
    price: Duration
    # A prefix-cache hit a region published, or this router's record of where a workflow ran:
    # older than this, the cache may have evicted it, and no decision counts it warm
    # (docs/affinity.md). vLLM evicts least-recently-used blocks under memory pressure.
    prefix_cache: Duration = 120.0
    # A carbon forecast issued longer ago than this is not followed: deferral then releases on
    # the latest signal alone (docs/deferral.md). Providers reissue theirs hourly or so.
    forecast: Duration = 6 * 3600.0


class StaleBounds(Strict):
    """What a candidate whose signal is unusable is priced at (docs/objective.md, "Safe
    fallback"): its grid zone's highest accepted intensity over ``carbon_window`` before the
    decision, else the fleet-wide bound (1,100 gCO2e/kWh)."""

    carbon_window: Duration = 7 * 86400.0


class FallbackConfig(Strict):
    """The performance-and-reliability objective used when energy ranking is off or a signal it
    needs is stale. Energy-layer scorers (energy, carbon) are not allowed here (the registry
    check says so with the file and field)."""

    scorers: tuple[ScorerTerm, ...] = Field(min_length=1)


class UnknownRegionState(Strict):
    """How a region counts when its live state is older than ``max_age.region_state``
    (``stale``: it was publishing and stopped; its last-seen record, kept without a TTL, says
    so after its state key expired) or was never seen (``missing``). A region never seen is
    trusted during the first ``missing_warmup`` after the router starts (its first reads may
    not have found every region yet), then judged by ``missing``. While the store itself is
    unreachable, the router's own probes decide instead (docs/deploying.md)."""

    stale: Literal["unhealthy", "assume-healthy"]
    missing: Literal["unhealthy", "assume-healthy"]
    missing_warmup: Duration


class SloClass(Strict):
    # TTFT budget = ttft_ms + ttft_ms_per_1k_prompt_tokens * prompt_tokens / 1000:
    # a prefill allowance, as long prompts take longer to read on any hardware.
    ttft_ms: float = Field(gt=0)
    ttft_ms_per_1k_prompt_tokens: float = Field(ge=0)
    tpot_ms: float = Field(gt=0)


class SloDefaults(Strict):
    interactive: SloClass
    batch: SloClass
    deferrable: SloClass


# What a canary's rollback rule may bound, per arm and window.
CANARY_METRICS = ("ttft_slo_attainment", "error_rate", "retry_rate", "energy_j_per_request", "gco2e_per_request")


class AttainmentBounds(Strict):
    """Bounds on the canary arm's TTFT-SLO attainment (a share, 0..1)."""

    # The arm rolls back below this share, whatever the control does.
    min: float | None = Field(default=None, ge=0, le=1)
    # ... or when it is more than this below the control's share (points of 1: 0.05 = 5 %).
    max_drop: float | None = Field(default=None, ge=0, le=1)


class RateBounds(Strict):
    """Bounds on a share of the canary arm's requests (error rate, retry rate; 0..1)."""

    max: float | None = Field(default=None, ge=0, le=1)
    # More than this above the control's share (0.02 = 2 points).
    max_rise: float | None = Field(default=None, ge=0, le=1)


class PerRequestBounds(Strict):
    """Bounds on the canary arm's mean per request (J, gCO2e)."""

    max: float | None = Field(default=None, gt=0)
    # The arm's mean over the control's: 1.2 rolls back when the arm spends 20 % more.
    max_ratio: float | None = Field(default=None, gt=0)


class CanaryRollback(Strict):
    """When the canary arm is turned off: a bound crossed over the last ``window`` (the current
    window and the one before it, counted by every router in the store), judged once the arm has
    ``min_requests`` there (and a bound relative to the control once the control has as many)."""

    window: Duration
    min_requests: int = Field(ge=1, le=1_000_000)
    ttft_slo_attainment: AttainmentBounds | None = None
    error_rate: RateBounds | None = None
    retry_rate: RateBounds | None = None
    energy_j_per_request: PerRequestBounds | None = None
    gco2e_per_request: PerRequestBounds | None = None

    @model_validator(mode="after")
    def _some_bound(self) -> CanaryRollback:
        if self.window < 1.0:
            raise ValueError(f"window must be at least 1 s (the routers read the counts every 0.5 s), "
                             f"got {self.window:g} s")
        metrics = {name: getattr(self, name) for name in CANARY_METRICS}
        empty = [name for name, bounds in metrics.items()
                 if bounds is not None and all(v is None for v in bounds.model_dump().values())]
        if empty:
            raise ValueError(f"{', '.join(empty)}: give at least one bound (or leave the metric out)")
        if all(bounds is None for bounds in metrics.values()):
            raise ValueError(f"no rollback bound: give at least one of {', '.join(CANARY_METRICS)}")
        return self


class CanaryConfig(Strict):
    """A candidate policy (``arm``) on a fraction of the traffic, rolled back automatically
    (docs/canary.md). The arm ranks by its own objective; every hard limit is the control's."""

    # The candidate policy: the name of another policy file.
    arm: Slug
    # Of the assignment keys (0: none, 1: all) that the arm decides for while it is on.
    fraction: float = Field(ge=0, le=1)
    # What a request's arm is a stable hash of: its tenant (a tenant sees one arm) or its id.
    assign_by: Literal["tenant", "request_id"] = "request_id"
    rollback: CanaryRollback


class QualityPoint(Strict):
    max_tokens: int = Field(gt=0)
    quality: float = Field(ge=0, le=1)


class OutputBudgetTable(Strict):
    """Quality against max_tokens for one model and task class: the operator's own evaluations
    (the share of answers still judged good when capped at that many tokens)."""

    model: ModelName
    task_class: str = Field(min_length=1)
    quality: tuple[QualityPoint, ...] = Field(min_length=2)

    @model_validator(mode="after")
    def _rising(self) -> OutputBudgetTable:
        tokens = [p.max_tokens for p in self.quality]
        if tokens != sorted(set(tokens)):
            raise ValueError(f"quality points must have strictly increasing max_tokens, got {tokens}")
        values = [p.quality for p in self.quality]
        if any(b < a for a, b in pairwise(values)):
            raise ValueError(f"quality must not fall as max_tokens grows, got {values}")
        return self

    def points(self) -> tuple[tuple[int, float], ...]:
        return tuple((p.max_tokens, p.quality) for p in self.quality)


class OutputBudgetConfig(Strict):
    """How the router uses the tables (scheduler/energy/output_budget.py): ``suggest`` reports the
    utility-per-joule optimum in the decision and the receipt; ``enforce`` also caps the
    request's max_tokens at it."""

    mode: Literal["suggest", "enforce"]
    tables: tuple[OutputBudgetTable, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> OutputBudgetConfig:
        keys = [(t.model, t.task_class) for t in self.tables]
        for key in keys:
            if keys.count(key) > 1:
                raise ValueError(f"two tables for model {key[0]!r} and task class {key[1]!r}")
        return self

    def table(self, model: str, task_class: str | None) -> OutputBudgetTable | None:
        if task_class is None:
            return None
        return next((t for t in self.tables if t.model == model and t.task_class == task_class), None)


def _region_pool(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}/[a-z0-9][a-z0-9-]{0,62}", value):
        raise ValueError(f"expected 'region/pool' like 'eu-north/h200-long', got {value!r}")
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"expected a sha256 in hex (64 digits, as `sha256sum FILE` prints it), got {value!r}")
    return value


class GatePass(Strict):
    """A pool whose measurements passed the energy gate (docs/gate.md): it takes all traffic
    although its region publishes no meter."""

    # "region/pool", as decisions name it.
    pool: Annotated[str, AfterValidator(_region_pool)]
    # The measurement file that passed `scheduler gate compare`.
    measurement_sha256: Annotated[str, AfterValidator(_sha256)]
    note: str = ""


class TelemetryGate(Strict):
    """What a pool whose energy is only modelled, never measured, may take
    (scheduler.plugins.filters.telemetry_gate, docs/gate.md): ``allow``: any traffic;
    ``canary-only``: only the requests the canary arm decides (none without a canary), until
    it is listed in ``passed``."""

    modelled_only: Literal["allow", "canary-only"]
    passed: tuple[GatePass, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> TelemetryGate:
        pools = [p.pool for p in self.passed]
        repeated = sorted({p for p in pools if pools.count(p) > 1})
        if repeated:
            raise ValueError(f"passed: a pool is listed twice: {repeated}")
        return self


class PolicyConfig(Strict):
    name: Slug
    description: str = ""
    # The objective: cost [USD] = sum of rate x quantity over these scorers; lowest first.
    scorers: tuple[ScorerTerm, ...] = Field(min_length=1)
    # Workload-to-hardware matchers (layer 2), in order.
    matchers: tuple[PluginRef, ...] = ()
    max_age: MaxAge
    # How candidates with an unusable signal are priced while the others' signals rank.
    stale_bounds: StaleBounds = StaleBounds()
    fallback: FallbackConfig
    unknown_region_state: UnknownRegionState
    slo: SloDefaults
    sensitive_task_classes: tuple[str, ...] = ()
    # Workload classes a tenant's hard energy budget never blocks. Budgets bind every class
    # unless listed here explicitly; the shipped policies list none.
    critical_workload_classes: tuple[Literal["interactive", "batch", "deferrable"], ...] = ()
    # The least faithful precision each workload class may be served at when a request names
    # none, for energy (bf16 for a class not listed); sensitive task classes never go below bf16.
    precision_floor: dict[Literal["interactive", "batch", "deferrable"], Precision] = Field(default_factory=dict)
    # Quality-per-joule output budgets per model and task class (docs/objective.md); None: off.
    output_budget: OutputBudgetConfig | None = None
    # K: a request that names no prefix key gets one hashed from the first K tokens of its
    # system prompt (chat) or prompt (scheduler.server.prefix, docs/affinity.md).
    prefix_key_tokens: int = Field(default=256, ge=16, le=131072)
    # max_tokens of an OpenAI chat request that names none: up to the model's context, as OpenAI
    # and vLLM do, but at most this many, so that it is not decided, priced and routed as a
    # request that writes a whole context (docs/http-front-door.md).
    chat_default_max_tokens: int = Field(default=4096, ge=1, le=1_048_576)
    # A candidate policy on a share of the traffic, rolled back when it does worse (docs/canary.md).
    canary: CanaryConfig | None = None
    # Receipts always show the GPUs' embodied carbon as its own line (embodied_g); true also adds
    # it to carbon_g, which budgets and the ledger's grams count (docs/billing.md).
    embodied_in_carbon: bool = False
    # Pools with modelled energy only: canary traffic only until they pass the energy gate
    # (docs/gate.md); None: no gate.
    telemetry_gate: TelemetryGate | None = None

    def slo_for(self, workload_class: str) -> SloClass:
        slo: SloClass = getattr(self.slo, workload_class)
        return slo
