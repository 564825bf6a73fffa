"""Warm and starting replicas per deployment (one per model of a pool) from Ray Serve's own
status objects (scheduler.region.warmth): what the region publishes so that the router knows a
model at zero."""

from __future__ import annotations

import pytest
from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger, ReplicaState
from ray.serve.schema import ApplicationStatus, ApplicationStatusOverview, DeploymentStatusOverview, ServeStatus

from scheduler.region.warmth import DeploymentReplicas, deployment_replicas


def deployment(**states: int) -> DeploymentStatusOverview:
    return DeploymentStatusOverview(
        status=DeploymentStatus.HEALTHY, status_trigger=DeploymentStatusTrigger.AUTOSCALING, message="",
        replica_states={ReplicaState(name): count for name, count in states.items()})


STATUS = ServeStatus(applications={"eu-north": ApplicationStatusOverview(
    status=ApplicationStatus.RUNNING, message="", last_deployed_time_s=0.0, deployments={
        "LLMServer:eu-north:h200-long:llama-3.1-8b": deployment(RUNNING=2, STARTING=1),
        "LLMServer:eu-north:h200-long:qwen3-32b": deployment(STOPPING=1),
        "LLMServer:eu-north:a100-batch:tiny": deployment(STOPPING=1),
        "LLMServer:eu-north:h100-chat:tiny": deployment(PENDING_MIGRATION=1, RECOVERING=1, UPDATING=1),
        "RegionGateway:eu-north": deployment(RUNNING=1),
    })})
DEPLOYMENTS = {("h200-long", "llama-3.1-8b"): "LLMServer:eu-north:h200-long:llama-3.1-8b",
               ("h200-long", "qwen3-32b"): "LLMServer:eu-north:h200-long:qwen3-32b",
               ("a100-batch", "tiny"): "LLMServer:eu-north:a100-batch:tiny",
               ("h100-chat", "tiny"): "LLMServer:eu-north:h100-chat:tiny", ("l4", "tiny"): "LLMServer:eu-north:l4:tiny"}


@pytest.mark.timeout(30)
def test_deployment_replicas_counts_serving_and_starting_replicas_of_each_model() -> None:
    assert deployment_replicas(STATUS, "eu-north", DEPLOYMENTS) == {
        ("h200-long", "llama-3.1-8b"): DeploymentReplicas(warm=2, starting=1),
        # the pool's other model, going down: at zero for the router while the first serves
        ("h200-long", "qwen3-32b"): DeploymentReplicas(warm=0, starting=0),
        ("a100-batch", "tiny"): DeploymentReplicas(warm=0, starting=0),
        ("h100-chat", "tiny"): DeploymentReplicas(warm=1, starting=2),
    }  # l4: not deployed, so not listed: left out (not served)


@pytest.mark.timeout(30)
def test_an_application_serve_does_not_list_serves_no_pool() -> None:
    """A deleted application's pools are not cold (a request cannot wake them): not served."""
    assert deployment_replicas(STATUS, "us-west", {("h100-chat", "tiny"): "LLMServer:us-west:h100-chat:tiny"}) == {}
