"""How many replicas of each pool's deployment are warm (serving) and how many are starting,
as Ray Serve's controller counts them (``serve.status()``): what the region publishes so that
the router knows a pool at zero from one that serves (docs/objective.md, "Cold pools").

A replica is warm while it is RUNNING (or PENDING_MIGRATION: it still serves while Serve moves
it); starting while STARTING, UPDATING or RECOVERING (its engine is loading or restarting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WARM_STATES = ("RUNNING", "PENDING_MIGRATION")
STARTING_STATES = ("STARTING", "UPDATING", "RECOVERING")


@dataclass(frozen=True, slots=True)
class PoolReplicas:
    warm: int
    starting: int


def pool_replicas(status: Any, app: str, deployments: Mapping[str, str]) -> dict[str, PoolReplicas]:
    """Pool -> its deployment's replicas, from a ``serve.status()`` answer: ``app`` is the
    region's application, ``deployments`` maps pool -> deployment name. A pool whose deployment
    Serve does not list (its application deleted, or not deployed) is left out: Serve runs
    nothing for it, neither warm nor starting, so it is not served (not a cold pool a request
    could wake)."""
    application = status.applications.get(app)
    listed = application.deployments if application is not None else {}
    counts = {}
    for pool, name in deployments.items():
        deployment = listed.get(name)
        if deployment is None:
            continue
        # ReplicaState is a str Enum: its members hash and compare as their names.
        states: Mapping[str, int] = deployment.replica_states
        counts[pool] = PoolReplicas(warm=sum(int(states.get(s, 0)) for s in WARM_STATES),
                                    starting=sum(int(states.get(s, 0)) for s in STARTING_STATES))
    return counts
