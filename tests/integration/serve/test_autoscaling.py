"""A pool scales to zero and back on Ray Serve's own autoscaler (issue 31.1), and the router's
explanation follows it (31.2): real Ray Serve + a vLLM CPU engine with the tiny model.

One more region application on the session stack's Serve ("autoscale-test", eu-north's pools,
its local pool h200-long allowed 0..1 replicas with a 3 s downscale delay), so that this test
costs one Serve application start. It starts at zero replicas: ``serve status`` lists none, the
region publishes the pool cold, and ``route --explain``'s decision (a deferrable request, whose
budget allows the cold start) shows it cold with the cold start priced, while an interactive
request is refused by the cold-pool filter. A request wakes it: Serve runs a replica, the
explanation shows it warm. With no traffic for the downscale delay Serve takes it back to
zero, and the explanation shows it cold again."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import pytest_asyncio

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import Autoscaling, LocalPool, LocalProfile, RegionConfig
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.explain import explain_table
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.app import EngineOptions, build_region_app, local_pools
from scheduler.region.stack import LocalStack
from scheduler.state.factory import open_store
from scheduler.types import Decision, Request

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

APP = "autoscale-test"
POOL = "h200-long"
DOWNSCALE_DELAY_S = 3.0
# A cold CPU engine starts in 20-60 s on a busy 2-core machine; Serve's scale-down follows the
# delay within its control loop and look-back window.
WAKE_TIMEOUT_S = 300.0
SCALE_DOWN_TIMEOUT_S = 120.0


def scaling_region(stack: LocalStack) -> RegionConfig:
    """eu-north as a second region: its pool h200-long served locally, 0..1 replicas."""
    base = next(r for r in load_checked_fleet().regions if r.name == "eu-north")
    scaling = Autoscaling(min_replicas=0, max_replicas=1, target_ongoing_requests=1, upscale_delay_s=0,
                          downscale_delay_s=DOWNSCALE_DELAY_S, metrics_interval_s=0.5, look_back_period_s=1.0)
    return base.model_copy(update={
        "name": APP, "endpoint": stack.endpoint(APP),
        "local": LocalProfile(pools=(LocalPool(pool=POOL, max_model_len=512, autoscaling=scaling),)),
    })


def running_replicas() -> tuple[int, str]:
    """(RUNNING replicas of the pool's deployment, its replica states) as ``serve status`` says."""
    from ray import serve

    deployments = serve.status().applications[APP].deployments
    (name,) = [n for n in deployments if n.startswith(f"LLMServer:{APP}:{POOL}:")]
    states = {str(getattr(k, "value", k)): v for k, v in deployments[name].replica_states.items()}
    return states.get("RUNNING", 0), str(states)


async def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.5)


@pytest_asyncio.fixture(loop_scope="session")
async def scaling_app(stack: LocalStack) -> AsyncIterator[RegionConfig]:
    from ray import serve

    region = scaling_region(stack)
    pools = local_pools(region, EngineOptions(omp_core=0))
    (options,) = pools[POOL]  # the local stand-in: one engine for every model of the pool
    assert options.autoscaling.min_replicas == 0
    app = build_region_app(region, pools, store_url=stack.state_url, namespace=stack.namespace, tickets="disabled")
    await asyncio.to_thread(serve.run, app, name=APP, route_prefix=f"/{APP}")
    try:
        yield region
    finally:
        await asyncio.to_thread(serve.delete, APP)


class Explainer:
    """``scheduler route --explain --state``: a router's snapshot of the store, one decision."""

    def __init__(self, stack: LocalStack, region: RegionConfig) -> None:
        policy = load_checked_fleet().policy("default")
        self.builder = SnapshotBuilder(compile_fleet((region,)), compile_policy(policy))
        self.stack = stack
        self.scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(0))

    async def decide(self, workload_class: str) -> Decision:
        store = open_store(self.stack.state_url, self.stack.namespace)
        try:
            snapshot = await SnapshotRefresher(self.builder, store).refresh()
        finally:
            await store.close()
        request = Request(request_id="explain", model="llama-3.1-8b", prompt_tokens=64, max_tokens=16,
                          workload_class=workload_class)  # type: ignore[arg-type]
        return self.scheduler.schedule(request, snapshot)

    async def warmth(self) -> tuple[str, str]:
        decision = await self.decide("deferrable")
        chosen = decision.chosen
        assert chosen is not None, explain_table(decision)
        return decision.perf[chosen.candidate.index].warmth, explain_table(decision)


@pytest.mark.timeout(WAKE_TIMEOUT_S + SCALE_DOWN_TIMEOUT_S + 120)
async def test_an_idle_pool_scales_to_zero_and_wakes_on_traffic(stack: LocalStack, scaling_app: RegionConfig) -> None:
    explainer = Explainer(stack, scaling_app)
    started = time.monotonic()
    # At its minimum from the start: no replica, and the router sees the pool cold.
    assert (await asyncio.to_thread(running_replicas))[0] == 0
    last: list[str] = ["", ""]

    async def warmth_is(wanted: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            last[:] = await explainer.warmth()
            if last[0] == wanted:
                return last[1]
            assert time.monotonic() < deadline, f"pool never {wanted} in the explanation:\n{last[1]}"
            await asyncio.sleep(0.5)

    cold_table = await warmth_is("cold", 30.0)
    print(f"\nat zero:\n{cold_table}")
    assert f"{APP:<14} {POOL:<12}" in cold_table and "cold +" in cold_table and "wakes the pool" in cold_table
    interactive = await explainer.decide("interactive")
    assert not interactive.schedulable
    assert [r.plugin for r in interactive.rejected if r.candidate.pool.name == POOL] == ["cold-pool"]

    # Traffic wakes it (the request waits for the replica to start).
    body = {"model": "llama-3.1-8b", "prompt": "Wake up, pool.", "max_tokens": 8, "stream": True}
    async with (httpx.AsyncClient(timeout=WAKE_TIMEOUT_S) as client,
                client.stream("POST", f"{stack.endpoint(APP)}/v1/completions", json=body) as response):
        assert response.status_code == 200, await response.aread()
        lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
    woke_s = time.monotonic() - started
    assert lines
    assert (await asyncio.to_thread(running_replicas))[0] == 1
    warm_table = await warmth_is("warm", 30.0)
    print(f"woken by a request after {woke_s:.0f} s:\n{warm_table}")
    assert (await explainer.decide("interactive")).schedulable

    # No traffic for the downscale delay: back to its minimum, and cold again for the router.
    idle_from = time.monotonic()
    await wait_for("the pool to scale back to zero",
                   lambda: running_replicas()[0] == 0, SCALE_DOWN_TIMEOUT_S)
    print(f"back at zero {time.monotonic() - idle_from:.0f} s after the last request "
          f"(downscale delay {DOWNSCALE_DELAY_S:g} s): {running_replicas()[1]}")
    await warmth_is("cold", 30.0)
