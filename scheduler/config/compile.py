"""The one place where the validated config files become runtime data.

``compile_fleet`` turns the region files (``schema.RegionConfig``) into a ``scheduler.fleet.Fleet``
of plain, frozen, slotted objects with its candidates and indices; ``compile_policy`` turns a
policy file (``schema.PolicyConfig``) into a ``scheduler.policy.Policy``. Both run once per
config version (the router's start and each reload, the simulator's start, ``route``).

Each schema class maps to the runtime class of the same shape (``RUNTIME``); a field is copied
by name, recursively, so the two cannot drift without ``tests/unit/config/test_compile.py``
noticing: every runtime field must exist in the schema, and every schema field must exist at
runtime unless ``FILE_ONLY`` names it (what only the files need).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from scheduler import fleet, policy
from scheduler.config import schema
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.step import GPU_MEMORY_UTILIZATION

RUNTIME: Mapping[type[BaseModel], type[Any]] = MappingProxyType({
    schema.Autoscaling: fleet.Autoscaling,
    schema.ModelDeployment: fleet.Deployment,
    schema.VllmServers: fleet.VllmServers,
    schema.PoolConfig: fleet.Pool,
    schema.GeoLocation: fleet.Location,
    schema.CarbonSource: fleet.CarbonSource,
    schema.RegionConfig: fleet.Region,
    schema.PluginRef: policy.PluginRef,
    schema.ScorerTerm: policy.ScorerTerm,
    schema.MaxAge: policy.MaxAge,
    schema.StaleBounds: policy.StaleBounds,
    schema.FallbackConfig: policy.Fallback,
    schema.UnknownRegionState: policy.UnknownRegionState,
    schema.SloClass: policy.SloClass,
    schema.SloDefaults: policy.SloDefaults,
    schema.AttainmentBounds: policy.AttainmentBounds,
    schema.RateBounds: policy.RateBounds,
    schema.PerRequestBounds: policy.PerRequestBounds,
    schema.CanaryRollback: policy.CanaryRollback,
    schema.CanaryConfig: policy.Canary,
    schema.QualityPoint: policy.QualityPoint,
    schema.OutputBudgetTable: policy.OutputBudgetTable,
    schema.OutputBudgetConfig: policy.OutputBudget,
    schema.GatePass: policy.GatePass,
    schema.TelemetryGate: policy.TelemetryGate,
    schema.PolicyConfig: policy.Policy,
})
# Schema fields that stay in the files: a region's local profile is read only by `scheduler up`
# (scheduler.region.stack), from the files.
FILE_ONLY: Mapping[type[BaseModel], frozenset[str]] = MappingProxyType({
    schema.RegionConfig: frozenset({"local"}),
})


def _plain(value: Any) -> Any:
    """``value`` with every schema model in it replaced by its runtime class (tuples stay
    tuples; a mapping becomes a read-only one; anything else is already plain)."""
    runtime = RUNTIME.get(type(value))
    if runtime is not None:
        return runtime(**{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(runtime)})
    if type(value) is tuple:
        return tuple(_plain(item) for item in value)
    if type(value) is dict:
        return MappingProxyType({key: _plain(item) for key, item in value.items()})
    return value


def compile_policy(config: schema.PolicyConfig) -> policy.Policy:
    compiled: policy.Policy = _plain(config)
    return compiled


def kv_capacity_tokens(pool: fleet.Pool, deployment: fleet.Deployment) -> int:
    """Tokens of KV cache one replica can give a single sequence (at most max_context)."""
    gpu = GPU_CATALOGUE[pool.gpu]
    model = MODEL_CATALOGUE[deployment.name]
    usable = gpu.hbm_bytes * GPU_MEMORY_UTILIZATION * deployment.tensor_parallel
    free_for_kv = usable - model.weight_bytes(deployment.precision)
    if free_for_kv <= 0:
        return 0
    return min(deployment.max_context, int(free_for_kv / model.kv_bytes_per_token_at(deployment.precision)))


def compile_fleet(configs: Iterable[schema.RegionConfig]) -> fleet.Fleet:
    regions: tuple[fleet.Region, ...] = tuple(_plain(config) for config in configs)
    candidates = tuple(
        fleet.Candidate(index=index, region=region, pool=pool, deployment=deployment, gpu=GPU_CATALOGUE[pool.gpu],
                        model=MODEL_CATALOGUE[deployment.name], kv_capacity_tokens=kv_capacity_tokens(pool, deployment))
        for index, (region, pool, deployment) in enumerate(
            (region, pool, deployment) for region in regions for pool in region.pools for deployment in pool.models))
    by_model: dict[str, list[fleet.Candidate]] = {}
    by_pool: dict[tuple[str, str], list[fleet.Candidate]] = {}
    for candidate in candidates:
        by_model.setdefault(candidate.deployment.name, []).append(candidate)
        by_pool.setdefault((candidate.region.name, candidate.pool.name), []).append(candidate)
    return fleet.Fleet(regions=regions, candidates=candidates,
                       candidates_by_model=MappingProxyType({name: tuple(group) for name, group in by_model.items()}),
                       pools=tuple(tuple(group) for group in by_pool.values()))
