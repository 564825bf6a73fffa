"""``build_region_app``: one Ray Serve application per region.

The application is a ``RegionGateway`` ingress (route prefix ``/<region>``) bound to the
region's vLLM replica (Ray Serve LLM's ``build_llm_deployment`` with ``RegionLLMServer``).
Locally (the region's ``local`` profile) the replica is one small CPU engine serving the
tiny model, standing for the pool ``local.stands_for`` in energy prediction and routing;
on an NVIDIA machine the same application runs the CUDA build of vLLM on one GPU
(``EngineOptions(device="gpu")``).

Call it after ``ray.init``: Ray Serve LLM reads the runtime context while building.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scheduler.config.schema import RegionConfig
from scheduler.serve.gateway import GatewaySettings, RegionGateway
from scheduler.serve.tiny_model import TINY_MODEL, cache_dir, ensure_tiny_model


@dataclass(frozen=True)
class EngineOptions:
    device: Literal["cpu", "gpu"] = "cpu"
    # None: the tiny model, built into the cache folder on first use.
    model_dir: Path | None = None
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


def llm_config(region: RegionConfig, options: EngineOptions) -> Any:
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
        bundle = {"CPU": 1}
    else:
        engine_kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        bundle = {"CPU": 1, "GPU": 1}
    return LLMConfig(
        model_loading_config={"model_id": options.served_model, "model_source": str(model_dir)},
        # A dict, validated by pydantic into its CPUConfig/GPUConfig.
        accelerator_config={"kind": options.device},  # type: ignore[arg-type]
        placement_group_config={"bundles": [bundle]},
        engine_kwargs=engine_kwargs,
        deployment_config={"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        runtime_env={"env_vars": engine_env(options)},
        experimental_configs={"stream_batching_interval_ms": options.stream_batching_interval_ms},
    )


def local_pool(region: RegionConfig) -> str:
    """The pool the region's local replica stands for (its ``local`` profile)."""
    if region.local is None:
        raise ValueError(
            f"region {region.name} has no 'local' profile: add e.g. "
            f"`local: {{model: tiny-llama, stands_for: {region.pools[0].name}}}` to run it locally"
        )
    return region.local.stands_for


def build_region_app(
    region: RegionConfig,
    *,
    store_url: str | None = None,
    namespace: str = "local",
    engine: EngineOptions | None = None,
    publish_interval_s: float = 1.0,
) -> Any:
    """The region's Serve application (deploy with ``serve.run(app, name=region.name,
    route_prefix=f"/{region.name}")``). With ``store_url`` the gateway publishes the
    region's live state there itself."""
    with keep_root_logging():
        from ray.serve.llm import build_llm_deployment

        from scheduler.serve.engine import RegionLLMServer

    options = engine or EngineOptions()
    llm = build_llm_deployment(
        llm_config(region, options),
        name_prefix=f"LLMServer:{region.name}:",
        deployment_cls=RegionLLMServer,
    )
    settings = GatewaySettings(
        region=region,
        pool=local_pool(region),
        served_model=options.served_model,
        store_url=store_url,
        namespace=namespace,
        publish_interval_s=publish_interval_s,
    )
    gateway: Any = RegionGateway
    return gateway.options(name=f"RegionGateway:{region.name}").bind(llm, settings)


def region_app_builder(args: Mapping[str, Any]) -> Any:
    """The region application as Ray Serve's ``import_path`` builder calls it (KubeRay
    ``serveConfigV2``): one argument, the ``args`` mapping that ``infra/render.py`` writes:
    ``region`` (the region file's content), ``pool`` (which pool this cluster serves),
    ``namespace`` (state-store key namespace) and ``engine`` (``EngineOptions`` fields).
    The state store URL comes from ``$SCHEDULER_STATE``. Bad arguments raise ``ValueError``
    naming the field, before anything is deployed."""
    from scheduler.config.loader import ConfigError, default_region, validate
    from scheduler.config.schema import LocalProfile

    unknown = set(args) - {"region", "pool", "namespace", "engine"}
    if unknown or "region" not in args:
        raise ValueError(f"serveConfigV2 args: expected region, pool, namespace, engine; got {sorted(args)}")
    try:
        region = validate(RegionConfig, default_region(dict(args["region"])), "serveConfigV2 args.region")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    pool = args.get("pool")
    if pool is not None:
        if pool not in {p.name for p in region.pools}:
            raise ValueError(f"serveConfigV2 args.pool: {pool!r} is not a pool of region {region.name}")
        model = region.local.model if region.local else TINY_MODEL
        region = region.model_copy(update={"local": LocalProfile(model=model, stands_for=pool)})
    engine_args = dict(args.get("engine") or {})
    known = set(EngineOptions.__dataclass_fields__)
    if set(engine_args) - known:
        raise ValueError(f"serveConfigV2 args.engine: unknown keys {sorted(set(engine_args) - known)}")
    if engine_args.get("model_dir") is not None:
        engine_args["model_dir"] = Path(engine_args["model_dir"])
    return build_region_app(
        region,
        store_url=os.environ.get("SCHEDULER_STATE"),
        namespace=str(args.get("namespace", "default")),
        engine=EngineOptions(**engine_args),
    )
