"""Every model a pool declares is served from a deployment of its own, with its own replica
range, and the router sees each model's warmth (issue 31): real Ray Serve + vLLM CPU engines
with the tiny model, registered under the pool's two model names.

One more region application on the session stack's Serve ("models-test": eu-north's pool
a100-batch, which declares llama-3.1-8b and llama-3.2-3b), each model 0..1 replicas with a
range of its own, so that it starts at zero and costs no engine start until a request comes:
the session's Ray has a CPU for one more engine. A request for the second model wakes that
model's deployment only; the region then publishes the pool warm for it and at zero for the
first, and the router takes an interactive request for the second there while its cold-pool
filter keeps the first's away."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from scheduler.config.autoscaling import ReplicaRange
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.explain import explain_table
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.app import EngineOptions, build_region_app
from scheduler.region.stack import LocalStack
from scheduler.state.factory import open_store
from scheduler.types import Decision, ModelReplicas, PoolLiveState, Request

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

APP = "models-test"
POOL = "a100-batch"
FIRST, SECOND = "llama-3.1-8b", "llama-3.2-3b"
# Each model's own range: both may scale to zero; they differ in how long they stay up idle.
RANGES = {FIRST: ReplicaRange(0, 1, target_ongoing_requests=1, upscale_delay_s=0.0, downscale_delay_s=600.0,
                              metrics_interval_s=0.5, look_back_period_s=1.0),
          SECOND: ReplicaRange(0, 1, target_ongoing_requests=2, upscale_delay_s=0.0, downscale_delay_s=900.0,
                               metrics_interval_s=0.5, look_back_period_s=1.0)}
# A cold CPU engine starts in 20-60 s on a busy 2-core machine.
WAKE_TIMEOUT_S = 300.0
PUBLISHED_TIMEOUT_S = 60.0


def models_region(stack: LocalStack) -> RegionConfig:
    base = next(r for r in load_checked_fleet().regions if r.name == "eu-north")
    assert [m.name for m in next(p for p in base.pools if p.name == POOL).models] == [FIRST, SECOND]
    return base.model_copy(update={"name": APP, "endpoint": stack.endpoint(APP)})


def deployments() -> dict[str, tuple[EngineOptions, ...]]:
    """The pool's two deployments: the tiny model served under each model's name."""
    return {POOL: (EngineOptions(served_model=FIRST, max_model_len=512, omp_core=0, autoscaling=RANGES[FIRST]),
                   EngineOptions(served_model=SECOND, max_model_len=256, omp_core=1, autoscaling=RANGES[SECOND]))}


def running_replicas() -> dict[str, dict[str, int]]:
    """Each of the app's LLM deployments' replica states, as ``serve status`` says."""
    from ray import serve

    listed = serve.status().applications[APP].deployments
    return {name: {str(getattr(k, "value", k)): v for k, v in d.replica_states.items()}
            for name, d in listed.items() if name.startswith("LLMServer:")}


@pytest_asyncio.fixture(loop_scope="session")
async def models_app(stack: LocalStack) -> AsyncIterator[RegionConfig]:
    from ray import serve
    from ray.serve._private.build_app import build_app

    region = models_region(stack)
    app = build_region_app(region, deployments(), store_url=stack.state_url, namespace=stack.namespace,
                           tickets="disabled")
    # What Serve is asked to run: one LLM deployment per model, each with its model's range.
    built = {d.name: d._deployment_config.autoscaling_config for d in build_app(app, name=APP).deployments
             if d.name.startswith("LLMServer:")}
    ranges = {name: (c.min_replicas, c.max_replicas, c.target_ongoing_requests, c.downscale_delay_s)
              for name, c in built.items() if c is not None}
    assert ranges == {f"LLMServer:{APP}:{POOL}:llama-3_1-8b": (0, 1, 1, 600.0),
                      f"LLMServer:{APP}:{POOL}:llama-3_2-3b": (0, 1, 2, 900.0)}, built
    await asyncio.to_thread(serve.run, app, name=APP, route_prefix=f"/{APP}")
    try:
        yield region
    finally:
        await asyncio.to_thread(serve.delete, APP)


class Router:
    """A router's snapshot of the store (the region alone) and its decisions."""

    def __init__(self, stack: LocalStack, region: RegionConfig) -> None:
        self.builder = SnapshotBuilder(compile_fleet((region,)), compile_policy(load_checked_fleet().policy("default")))
        self.stack = stack
        self.scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(0))

    async def pool(self) -> PoolLiveState | None:
        store = open_store(self.stack.state_url, self.stack.namespace)
        try:
            snapshot = await SnapshotRefresher(self.builder, store).refresh()
        finally:
            await store.close()
        state = snapshot.fresh_live(APP)
        return None if state is None else state.pools.get(POOL)

    async def decide(self, model: str) -> Decision:
        store = open_store(self.stack.state_url, self.stack.namespace)
        try:
            snapshot = await SnapshotRefresher(self.builder, store).refresh()
        finally:
            await store.close()
        return self.scheduler.schedule(Request(request_id="models", model=model, prompt_tokens=64, max_tokens=16,
                                               workload_class="interactive"), snapshot)

    async def published(self, wanted: dict[str, ModelReplicas]) -> PoolLiveState:
        deadline = time.monotonic() + PUBLISHED_TIMEOUT_S
        while True:
            pool = await self.pool()
            if pool is not None and pool.model_replicas == wanted:
                return pool
            assert time.monotonic() < deadline, f"the region never published {wanted}; last: {pool}"
            await asyncio.sleep(0.5)


@pytest.mark.timeout(WAKE_TIMEOUT_S + 3 * PUBLISHED_TIMEOUT_S + 60)
async def test_each_model_of_a_pool_runs_in_its_own_deployment_and_the_router_sees_its_warmth(
        stack: LocalStack, models_app: RegionConfig) -> None:
    router = Router(stack, models_app)
    started = time.monotonic()
    # Both at their minimum, zero: the pool is published serving both models, neither warm.
    at_zero = await router.published({FIRST: ModelReplicas(0, 0), SECOND: ModelReplicas(0, 0)})
    assert at_zero.models == {FIRST: 512, SECOND: 256}
    print(f"\npublished at zero after {time.monotonic() - started:.0f} s: {at_zero}")

    # A request for the second model wakes its deployment only, and runs there.
    body = {"model": SECOND, "prompt": "Wake up, second model.", "max_tokens": 8, "stream": True,
            "x_scheduler": {"pool": POOL}}
    async with (httpx.AsyncClient(timeout=WAKE_TIMEOUT_S) as client,
                client.stream("POST", f"{stack.endpoint(APP)}/v1/completions", json=body) as response):
        assert response.status_code == 200, await response.aread()
        chunks = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: {")]
    woke_s = time.monotonic() - started
    assert chunks and {c["model"] for c in chunks} == {SECOND}
    replicas = await asyncio.to_thread(running_replicas)
    print(f"woken by a request after {woke_s:.0f} s: {replicas}")
    assert replicas[f"LLMServer:{APP}:{POOL}:llama-3_2-3b"].get("RUNNING") == 1
    assert not replicas[f"LLMServer:{APP}:{POOL}:llama-3_1-8b"].get("RUNNING")

    # The region publishes the pool warm for the second model and at zero for the first ...
    warm = await router.published({FIRST: ModelReplicas(0, 0), SECOND: ModelReplicas(1, 0)})
    assert (warm.replicas, warm.starting_replicas) == (1, 0)
    # ... so an interactive request for the second model goes there, and one for the first
    # (its budget shorter than a cold start) is kept away by the cold-pool filter.
    second = await router.decide(SECOND)
    assert second.chosen is not None and second.chosen.candidate.pool.name == POOL, explain_table(second)
    first = await router.decide(FIRST)
    print(explain_table(first))
    assert [r.plugin for r in first.rejected if r.candidate.pool.name == POOL] == ["cold-pool"]

    # A model the pool does not declare: the region's 404.
    async with httpx.AsyncClient(timeout=30.0) as client:
        refused = await client.post(f"{stack.endpoint(APP)}/v1/completions",
                                    json={**body, "model": "qwen3-32b"})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
