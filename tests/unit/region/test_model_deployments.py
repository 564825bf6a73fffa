"""One deployment per model of a pool (issue 31): the app's check of a pool's deployments, the
gateway's routing of a request to its model's deployment, and the live state it publishes
per model. The gateway is the real ``RegionGateway`` over stub engines (``tests.region_host``);
Serve's replica counts come as Ray Serve's own status objects."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger, ReplicaState
from ray.serve.schema import ApplicationStatus, ApplicationStatusOverview, DeploymentStatusOverview, ServeStatus

from scheduler.config.autoscaling import ReplicaRange
from scheduler.config.loader import load_fleet
from scheduler.region.app import EngineOptions, check_deployments
from scheduler.region.gateway import GatewaySettings, PoolEngine
from scheduler.types import ModelReplicas, RegionLiveState
from tests.region_host import EngineTally, LocalHandle, StubEngine, asgi, gateway_class
from tests.unit.region.fake_nvml import FakeNvml

REGION = next(r for r in load_fleet().regions if r.name == "eu-north")
POOL = "a100-batch"  # count 128: llama-3.1-8b and llama-3.2-3b
FIRST, SECOND = "llama-3.1-8b", "llama-3.2-3b"
APP = "eu-north"


def deployments(first: ReplicaRange, second: ReplicaRange) -> dict[str, tuple[EngineOptions, ...]]:
    return {POOL: (EngineOptions(served_model=FIRST, autoscaling=first),
                   EngineOptions(served_model=SECOND, autoscaling=second))}


@pytest.mark.timeout(30)
def test_a_pool_serves_each_of_its_models_from_one_deployment_whose_maxima_fit_its_gpus() -> None:
    check_deployments(REGION, deployments(ReplicaRange(0, 100), ReplicaRange(1, 28)))  # 128 GPUs: fits
    with pytest.raises(ValueError, match=rf"pool {POOL}: autoscaling.max_replicas x tensor_parallel sums to 129 GPUs "
                                         rf"\({FIRST}: 100 x 1, {SECOND}: 29 x 1\) but the pool has count=128"):
        check_deployments(REGION, deployments(ReplicaRange(0, 100), ReplicaRange(1, 29)))
    with pytest.raises(ValueError, match=rf"pool {POOL}: each of its models \({FIRST}, {SECOND}\) needs one "
                                         rf"deployment; not served: {SECOND}"):
        check_deployments(REGION, {POOL: deployments(ReplicaRange(1, 1), ReplicaRange(1, 1))[POOL][:1]})
    twice = deployments(ReplicaRange(1, 1), ReplicaRange(1, 1))[POOL]
    with pytest.raises(ValueError, match=f"served twice: {FIRST}"):
        check_deployments(REGION, {POOL: (*twice, twice[0])})
    # The local stand-in (the tiny model) serves every model of its pool, as its only deployment.
    check_deployments(REGION, {POOL: (EngineOptions(),)})
    with pytest.raises(ValueError, match="stands in for all of them and must be the pool's only deployment"):
        check_deployments(REGION, {POOL: (EngineOptions(), twice[0])})


class NamedHandle(LocalHandle):
    """A stub engine's handle under its deployment's name in Serve, counting the gateway's
    ``live_stats`` calls (a call to a deployment at zero would wake it)."""

    def __init__(self, engine: StubEngine, deployment_name: str) -> None:
        super().__init__(engine)
        self.deployment_name = deployment_name
        self.stats_calls = 0

    def __getattr__(self, name: str) -> Any:
        if name == "live_stats":
            self.stats_calls += 1
        return super().__getattr__(name)


def serve_status(first: dict[str, int], second: dict[str, int]) -> ServeStatus:
    def overview(states: dict[str, int]) -> DeploymentStatusOverview:
        return DeploymentStatusOverview(status=DeploymentStatus.HEALTHY, message="",
                                        status_trigger=DeploymentStatusTrigger.AUTOSCALING,
                                        replica_states={ReplicaState(s): n for s, n in states.items()})

    return ServeStatus(applications={APP: ApplicationStatusOverview(
        status=ApplicationStatus.RUNNING, message="", last_deployed_time_s=0.0,
        deployments={f"LLMServer:{APP}:{POOL}:{FIRST}": overview(first),
                     f"LLMServer:{APP}:{POOL}:{SECOND}": overview(second)})})


async def complete(client: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "the grid at noon", "max_tokens": 3, "stream": True,
            "x_scheduler": {"pool": POOL}}
    return await client.post("/v1/completions", json=body)


@pytest.mark.timeout(60)
def test_the_gateway_runs_each_request_on_its_models_deployment_and_publishes_each_models_warmth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: FakeNvml(library_found=False))
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(library_found=False))
    tally = EngineTally(APP, None)
    engines = {FIRST: StubEngine(POOL, tally), SECOND: StubEngine(POOL, tally)}
    handles = {model: NamedHandle(engine, f"LLMServer:{APP}:{POOL}:{model}") for model, engine in engines.items()}
    settings = GatewaySettings(region=REGION, pools={POOL: (PoolEngine(FIRST, 2048), PoolEngine(SECOND, 1024))},
                               tickets="disabled")
    # Serve's controller as the gateway's replica sees it (``serve.status()``).
    status = {"now": serve_status({"RUNNING": 2}, {"RUNNING": 1})}
    monkeypatch.setattr("scheduler.region.gateway.serve.get_replica_context", lambda: type("C", (), {"app_name": APP}))
    monkeypatch.setattr("scheduler.region.gateway.serve.status", lambda: status["now"])

    async def run() -> tuple[list[httpx.Response], list[RegionLiveState]]:
        cls = gateway_class()
        gateway = cls.__new__(cls)
        await gateway.__init__({POOL: handles}, settings)
        # From here on, as in a Serve replica: the gateway reads Serve's replica counts.
        monkeypatch.setattr("scheduler.region.gateway.ray.is_initialized", lambda: True)
        try:
            transport = httpx.ASGITransport(app=asgi(gateway))
            async with httpx.AsyncClient(transport=transport, base_url="http://region") as client:
                answers = [await complete(client, SECOND), await complete(client, "qwen3-32b")]
                states = [await gateway.live_state()]
                # The second model's deployment scaled to zero, the first's still serving.
                status["now"] = serve_status({"RUNNING": 2}, {"STOPPING": 1})
                calls = handles[SECOND].stats_calls
                states.append(await gateway.live_state())
                assert handles[SECOND].stats_calls == calls, "a deployment at zero gets no call (it would wake)"
                status["now"] = serve_status({"RUNNING": 2}, {"STARTING": 1})
                states.append(await gateway.live_state())
        finally:
            await gateway.stop()
        return answers, states

    (served, unknown), (both_warm, second_at_zero, second_starting) = asyncio.run(run())
    # The request ran on its model's deployment, asked for by the model's own name, and its
    # chunks carry the model asked for.
    assert served.status_code == 200, served.text
    assert engines[SECOND].prompt_tokens_total > 0 and engines[FIRST].prompt_tokens_total == 0
    chunks = [json.loads(line[6:]) for line in served.text.splitlines() if line.startswith("data: {")]
    assert chunks and all(c["model"] == SECOND for c in chunks)
    # A model the pool does not declare: the region's 404, as for any model it does not serve.
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert f"(served: {FIRST}, {SECOND})" in unknown.json()["error"]["message"]
    # Live state: each model with its own deployment's counts and its own engine's context limit.
    pool = both_warm.pools[POOL]
    assert pool.models == {FIRST: 2048, SECOND: 1024}
    assert (pool.replicas, pool.starting_replicas) == (3, 0)
    assert pool.model_replicas == {FIRST: ModelReplicas(2, 0), SECOND: ModelReplicas(1, 0)}
    pool = second_at_zero.pools[POOL]
    assert (pool.replicas, pool.starting_replicas) == (2, 0)  # the pool serves ...
    assert pool.model_replicas == {FIRST: ModelReplicas(2, 0), SECOND: ModelReplicas(0, 0)}  # ... not the second
    assert pool.replicas_of(SECOND) == (0, 0) and pool.replicas_of(FIRST) == (2, 0)
    assert second_at_zero.pools[POOL].models == {FIRST: 2048, SECOND: 1024}  # still served: a request wakes it
    assert second_starting.pools[POOL].model_replicas == {FIRST: ModelReplicas(2, 0), SECOND: ModelReplicas(0, 1)}
    assert second_starting.pools[POOL].starting_replicas == 1
