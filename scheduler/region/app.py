"""``build_region_app``: one Ray Serve application per region.

The application is a ``RegionGateway`` ingress (route prefix ``/<region>``) bound to one
Ray Serve LLM deployment per model of each pool (``build_llm_deployment`` with
``RegionLLMServer``), each with its own engine arguments, replica range and accelerator type.
Ray Serve's own autoscaler sizes each deployment within its range (``autoscaling_config``;
min_replicas 0: the model scales to zero when idle and wakes on the next request). Locally (the
region's ``local`` profile) each listed pool runs one small CPU engine serving the tiny model
with the pool's ``max_model_len``, a stand-in for every model of the pool in energy prediction
and routing; on an NVIDIA machine the same application runs the CUDA build of vLLM
(``EngineOptions(device="gpu")``); on a GPU cluster each pool's replicas are placed on its
accelerator type (``accelerator_type``).

Call it after ``ray.init``: Ray Serve LLM reads the runtime context while building.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from scheduler.config.autoscaling import ReplicaRange
from scheduler.config.schema import RegionConfig
from scheduler.region.gateway import GatewaySettings, PoolEngine, RegionGateway
from scheduler.region.tiny_model import TINY_MODEL, cache_dir, ensure_tiny_model
from scheduler.tickets import RegionKeys

# Each pool's request router, by path: Serve imports it in the handle's process.
PREFIX_ROUTER_CLASS = "scheduler.region.prefix_router:PrefixKeyRouter"


@dataclass(frozen=True)
class EngineOptions:
    device: Literal["cpu", "gpu"] = "cpu"
    # None: the tiny model, built into the cache folder on first use.
    model_dir: Path | None = None
    # The model the deployment serves, as the pool's config names it (its own deployment), or
    # another name (the tiny model): a stand-in serving every model of its pool.
    served_model: str = TINY_MODEL
    max_model_len: int = 2048
    max_num_seqs: int = 32
    # CPU only: KV cache size (the tiny model needs ~2 KB a token; 64 MiB holds ~30k tokens).
    kv_cache_bytes: int = 64 * 2**20
    # CPU only: the core the engine's OpenMP thread is bound to (None: vLLM's auto binding).
    omp_core: int | None = None
    # GPU only: share of the GPU's memory vLLM may take.
    gpu_memory_utilization: float = 0.3
    # Eager mode starts ~30 s faster on CPU; throughput is not what the local stack is for.
    enforce_eager: bool = True
    # 0: every SSE chunk is sent at once (lower TTFT than Ray's default 50 ms batching).
    stream_batching_interval_ms: int = 0
    # GPUs per replica (vLLM tensor parallelism).
    tensor_parallel: int = 1
    # The replicas Ray Serve's autoscaler may run (locally: one, always up, unless the region's
    # local profile gives the pool an autoscaling block).
    autoscaling: ReplicaRange = field(default_factory=lambda: ReplicaRange(min_replicas=1, max_replicas=1))
    # GPU clusters: the Ray accelerator type the replicas need (e.g. "H200", "A100-80G").
    accelerator_type: str | None = None


@contextlib.contextmanager
def keep_root_logging() -> Iterator[None]:
    """Importing Ray Serve LLM reconfigures the root logger (JSON, INFO); keep ours."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def engine_env(options: EngineOptions) -> dict[str, str]:
    """Environment of the replica: offline, no telemetry, caches inside the project."""
    root = cache_dir()
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
    }
    if options.device == "cpu" and options.omp_core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(options.omp_core)
    return env


def llm_config(options: EngineOptions) -> Any:
    with keep_root_logging():
        from ray.serve.llm import LLMConfig

    model_dir = options.model_dir or ensure_tiny_model()
    engine_kwargs: dict[str, Any] = {
        "max_model_len": options.max_model_len,
        "max_num_seqs": options.max_num_seqs,
        "enforce_eager": options.enforce_eager,
        "enable_prefix_caching": True,
        "enable_prompt_tokens_details": True,
    }
    if options.device == "cpu":
        engine_kwargs["kv_cache_memory_bytes"] = options.kv_cache_bytes
        bundles = [{"CPU": 1}]
    else:
        engine_kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        engine_kwargs["tensor_parallel_size"] = options.tensor_parallel
        bundles = [{"CPU": 1, "GPU": 1}] + [{"GPU": 1}] * (options.tensor_parallel - 1)
    extra: dict[str, Any] = {}
    if options.accelerator_type is not None:
        extra["accelerator_type"] = options.accelerator_type
    return LLMConfig(
        model_loading_config={"model_id": options.served_model, "model_source": str(model_dir)},
        # A dict, validated by pydantic into its CPUConfig/GPUConfig.
        accelerator_config={"kind": options.device},  # type: ignore[arg-type]
        placement_group_config={"bundles": bundles},
        engine_kwargs=engine_kwargs,
        # Requests sharing a prefix key go to the replica holding it (scheduler.region.prefix_router).
        deployment_config={"autoscaling_config": options.autoscaling.ray_config(options.max_num_seqs),
                           "ray_actor_options": {"num_cpus": 0},
                           "request_router_config": {"request_router_class": PREFIX_ROUTER_CLASS}},
        runtime_env={"env_vars": engine_env(options)},
        experimental_configs={"stream_batching_interval_ms": options.stream_batching_interval_ms},
        **extra,
    )


def local_pools(region: RegionConfig, base: EngineOptions | None = None) -> dict[str, tuple[EngineOptions, ...]]:
    """The pools the region runs locally (its ``local`` profile): one stand-in deployment each,
    serving every model of the pool, with its context limit and replica range (the profile's
    ``autoscaling`` block, else one replica always up)."""
    if region.kind == "vllm":
        raise ValueError(f"region {region.name} is plain vLLM servers (kind vllm): they run outside Ray; route to "
                         "them with `scheduler region scrape` beside them (docs/byo-vllm.md)")
    if region.local is None:
        raise ValueError(
            f"region {region.name} has no 'local' profile: add e.g. `local: {{model: tiny-llama, pools: "
            f"[{{pool: {region.pools[0].name}, max_model_len: 2048}}]}}` to run it locally"
        )
    base = base or EngineOptions()
    return {p.pool: (replace(base, max_model_len=p.max_model_len,
                             autoscaling=base.autoscaling if p.autoscaling is None else ReplicaRange.of(p.autoscaling)),)
            for p in region.local.pools}


def check_deployments(region: RegionConfig, pools: Mapping[str, Sequence[EngineOptions]]) -> None:
    """ValueError naming the pool and the models unless each listed pool of ``region`` serves
    every model it declares, each from one deployment (its ``served_model``; a deployment of
    another model, the tiny stand-in, serves every model of its pool and is its only one), and
    its deployments' most replicas fit its GPUs: sum of max_replicas x tensor_parallel <= count."""
    configs = {p.name: p for p in region.pools}
    for name, deployments in pools.items():
        pool = configs.get(name)
        if pool is None:
            raise ValueError(f"region {region.name}: {name!r} is not one of its pools "
                             f"({', '.join(sorted(configs))})")
        declared = [m.name for m in pool.models]
        served = [o.served_model for o in deployments]
        stand_ins = [model for model in served if model not in declared]
        if stand_ins and len(served) > 1:
            raise ValueError(f"region {region.name}: pool {name}: deployment {stand_ins[0]!r} is not a model of the "
                             f"pool (models: {', '.join(declared)}), so it stands in for all of them and must be the "
                             f"pool's only deployment, but the pool has {len(served)}: {', '.join(served)}")
        repeated = sorted({model for model in served if served.count(model) > 1})
        missing = [model for model in declared if model not in served]
        if repeated or (not stand_ins and missing):
            raise ValueError(f"region {region.name}: pool {name}: each of its models ({', '.join(declared)}) needs "
                             f"one deployment; " + (f"served twice: {', '.join(repeated)}" if repeated else
                                                    f"not served: {', '.join(missing)}"))
        gpus = sum(o.autoscaling.max_replicas * o.tensor_parallel for o in deployments)
        if gpus > pool.count:
            terms = ", ".join(f"{o.served_model}: {o.autoscaling.max_replicas} x {o.tensor_parallel}"
                              for o in deployments)
            raise ValueError(f"region {region.name}: pool {name}: autoscaling.max_replicas x tensor_parallel sums to "
                             f"{gpus} GPUs ({terms}) but the pool has count={pool.count}")


def build_region_app(
    region: RegionConfig,
    pools: Mapping[str, Sequence[EngineOptions]],
    *,
    store_url: str | None = None,
    namespace: str = "local",
    publish_interval_s: float = 1.0,
    tickets: Literal["required", "disabled"] = "required",
    ticket_keys: RegionKeys | None = None,
) -> Any:
    """The region's Serve application (deploy with ``serve.run(app, name=region.name,
    route_prefix=f"/{region.name}")``): one LLM deployment per entry of each pool's
    deployments in ``pools`` (``check_deployments``). With ``store_url`` the gateway publishes
    the region's live state there itself. Tickets are checked with ``ticket_keys`` (None: the
    file ``$SCHEDULER_TICKET_KEYS_FILE`` names)."""
    with keep_root_logging():
        from ray.serve.llm import build_llm_deployment

        from scheduler.region.engine import RegionLLMServer

    if not pools or not all(pools.values()):
        raise ValueError(f"region {region.name}: no pools to serve, or a pool without a deployment")
    check_deployments(region, pools)
    # Ray Serve LLM names each deployment "<prefix><model id>": LLMServer:<region>:<pool>:<model>.
    llms = {
        name: {options.served_model: build_llm_deployment(llm_config(options),
                                                          name_prefix=f"LLMServer:{region.name}:{name}:",
                                                          deployment_cls=RegionLLMServer)
               for options in deployments}
        for name, deployments in pools.items()
    }
    settings = GatewaySettings(
        region=region,
        pools={name: tuple(PoolEngine(o.served_model, o.max_model_len) for o in deployments)
               for name, deployments in pools.items()},
        store_url=store_url,
        namespace=namespace,
        publish_interval_s=publish_interval_s,
        tickets=tickets,
        ticket_keys=ticket_keys,
    )
    gateway: Any = RegionGateway
    return gateway.options(name=f"RegionGateway:{region.name}").bind(llms, settings)


BUILDER_ARGS = ("region", "namespace", "tickets", "pools")


def region_app_builder(args: Mapping[str, Any]) -> Any:
    """The region application as Ray Serve's ``import_path`` builder calls it (KubeRay
    ``serveConfigV2``): one argument, the ``args`` mapping that ``infra/render.py`` writes:
    ``region`` (the region file's content), ``namespace`` (state-store key namespace),
    ``tickets`` (``required``, the default, or ``disabled``) and ``pools`` (pool name -> a list
    of ``EngineOptions`` fields, one LLM deployment each, one per model of the pool;
    ``autoscaling``: ``ReplicaRange`` fields). The state store URL comes from
    ``$SCHEDULER_STATE``, the ticket keys from ``$SCHEDULER_TICKET_KEYS_FILE``. Bad
    arguments raise ``ValueError`` naming the field, before anything is deployed."""
    from scheduler.config.loader import ConfigError, default_region, validate

    unknown = set(args) - set(BUILDER_ARGS)
    if unknown or "region" not in args or "pools" not in args:
        raise ValueError(f"serveConfigV2 args: expected {', '.join(BUILDER_ARGS)} (region and pools required); "
                         f"got {sorted(args)}")
    try:
        region = validate(RegionConfig, default_region(dict(args["region"])), "serveConfigV2 args.region")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    tickets = args.get("tickets", "required")
    if tickets not in ("required", "disabled"):
        raise ValueError(f"serveConfigV2 args.tickets: expected required or disabled, got {tickets!r}")
    raw_pools = args["pools"]
    if not isinstance(raw_pools, Mapping) or not raw_pools:
        raise ValueError("serveConfigV2 args.pools: expected a mapping of pool name -> a list of engine options")
    known_pools = {p.name for p in region.pools}
    pools = {}
    for name, raw in raw_pools.items():
        if name not in known_pools:
            raise ValueError(f"serveConfigV2 args.pools.{name}: not a pool of region {region.name} "
                             f"(pools: {', '.join(sorted(known_pools))})")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"serveConfigV2 args.pools.{name}: expected a list of engine options (one deployment "
                             f"per model of the pool), got {raw!r}")
        pools[name] = tuple(engine_options(f"serveConfigV2 args.pools.{name}[{i}]", entry)
                            for i, entry in enumerate(raw))
    try:
        check_deployments(region, pools)
    except ValueError as exc:
        raise ValueError(f"serveConfigV2 args.pools: {exc}") from None
    return build_region_app(
        region,
        pools,
        store_url=os.environ.get("SCHEDULER_STATE"),
        namespace=str(args.get("namespace", "default")),
        tickets=tickets,
    )


def engine_options(where: str, raw: object) -> EngineOptions:
    """One deployment's ``EngineOptions`` from its Serve args entry (``where`` names it)."""
    options = dict(raw) if isinstance(raw, Mapping) else None
    if options is None:
        raise ValueError(f"{where}: expected a mapping of engine options, got {raw!r}")
    unknown = set(options) - set(EngineOptions.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    if options.get("model_dir") is not None:
        options["model_dir"] = Path(options["model_dir"])
    if options.get("autoscaling") is not None:
        try:
            options["autoscaling"] = ReplicaRange(**options["autoscaling"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}.autoscaling: {exc}") from None
    return EngineOptions(**options)
