"""Inside a pool, requests sharing a prefix key go to the replica that holds the prefix
(scheduler.region.prefix_router, docs/affinity.md "Inside a region"): on real Ray Serve, a
two-replica deployment routed by ``PrefixKeyRouter`` answers every call of one key from one
replica, the key's rendezvous home; calls without a key spread over both."""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest

from scheduler.region.app import PREFIX_ROUTER_CLASS
from scheduler.region.prefix_router import home_of
from scheduler.region.stack import LocalStack

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.timeout(240)]

# Enough keys that all of them landing on one of the two (random) replica ids is out of reach:
# with rendezvous hashing each key picks a replica as a fair coin would, so six keys did so
# once in 32 runs; twenty do so once in ~500,000.
KEYS = [f"auto:{i:024x}" for i in range(20)]
CALLS_PER_KEY = 3


async def test_a_prefix_key_is_served_by_its_home_replica(stack: LocalStack) -> None:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0},
                      request_router_config=RequestRouterConfig(request_router_class=PREFIX_ROUTER_CLASS))
    class WhichReplica:
        async def stream_completions(self, body: dict[str, object], prefix_key: str | None = None) -> str:
            return str(serve.get_replica_context().replica_id.to_full_id_str())

    name = f"prefix-router-{uuid.uuid4().hex[:6]}"
    handle = serve.run(WhichReplica.bind(), name=name, route_prefix=None)  # type: ignore[attr-defined]
    try:
        served: dict[str, set[str]] = defaultdict(set)
        for _ in range(CALLS_PER_KEY):
            for key in KEYS:
                served[key].add(await handle.stream_completions.remote({}, prefix_key=key))
        unkeyed = {await handle.stream_completions.remote({}) for _ in range(24)}
    finally:
        serve.delete(name)
    replicas = sorted(unkeyed | {r for rs in served.values() for r in rs})
    print(f"\nreplicas {replicas}\nby key: { {k[-4:]: sorted(v) for k, v in served.items()} }")
    assert len(replicas) == 2
    assert all(len(where) == 1 for where in served.values()), served
    assert {key: next(iter(where)) for key, where in served.items()} == {key: home_of(key, replicas) for key in KEYS}
    assert len({next(iter(where)) for where in served.values()}) == 2, "every key homed on one replica"
    assert unkeyed == set(replicas)
