"""How many replicas of each deployment (one per model of a pool) are warm (serving) and how
many are starting, as Ray Serve's controller counts them (``serve.status()``): what the region
publishes so that the router knows a model at zero from one that serves (docs/objective.md,
"Cold pools").

A replica is warm while it is RUNNING (or PENDING_MIGRATION: it still serves while Serve moves
it); starting while STARTING, UPDATING or RECOVERING (its engine is loading or restarting).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

WARM_STATES = ("RUNNING", "PENDING_MIGRATION")
STARTING_STATES = ("STARTING", "UPDATING", "RECOVERING")

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True, slots=True)
class DeploymentReplicas:
    warm: int
    starting: int


def deployment_replicas(status: Any, app: str, deployments: Mapping[Key, str]) -> dict[Key, DeploymentReplicas]:
    """Deployment -> its replicas, from a ``serve.status()`` answer: ``app`` is the region's
    application, ``deployments`` maps each deployment's key (the gateway's: pool and model) to
    its name in Serve. A deployment Serve does not list (its application deleted, or not
    deployed) is left out: Serve runs nothing for it, neither warm nor starting, so it is not
    served (not a cold deployment a request could wake)."""
    application = status.applications.get(app)
    listed = application.deployments if application is not None else {}
    counts = {}
    for key, name in deployments.items():
        deployment = listed.get(name)
        if deployment is None:
            continue
        # ReplicaState is a str Enum: its members hash and compare as their names.
        states: Mapping[str, int] = deployment.replica_states
        counts[key] = DeploymentReplicas(warm=sum(int(states.get(s, 0)) for s in WARM_STATES),
                                         starting=sum(int(states.get(s, 0)) for s in STARTING_STATES))
    return counts
