"""``PrefixKeyRouter``: inside a pool, requests sharing a prefix key go to the replica that
holds that prefix warm (docs/affinity.md, "Inside a region").

Ray Serve's request router for a pool's LLM deployment (``request_router_config``). The
gateway calls a replica with the request's prefix key as the ``prefix_key`` keyword
(``RegionLLMServer.stream_completions(body, prefix_key=...)``); the router reads it there, not
the prompt (Ray Serve LLM's ``PrefixCacheAffinityRouter`` matches prompt text held by a
prefix-tree actor: a blocking ``ray.get`` per request, and an argument shape the gateway does
not send).

    home(key) = argmax over the pool's replicas r of  blake2b(key, r's id)

(rendezvous hashing): no state to keep or lose, every gateway replica agrees on a key's home,
and a replica that leaves moves only the keys it was home to. A request with a key goes to its
home first, then to the power-of-two choice over the others, unless the home is overloaded:

    queue(home) - min over the others of queue(r) > imbalanced_threshold   (queue lengths as
                                                                            Serve last saw them)

then it gets the power-of-two choice like a request without a key (a cold cache costs
less than a long queue). A home that is full (``max_ongoing_requests``) rejects the request
and Serve tries the next rank. Requests without a key: power of two choices, as Serve's
default router.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

DEFAULT_IMBALANCED_THRESHOLD = 8


def home_rank(key: str, replica_id: str) -> bytes:
    """The rendezvous weight of ``replica_id`` for ``key`` (the highest is the key's home)."""
    return hashlib.blake2b(f"{key}\x00{replica_id}".encode(), digest_size=8).digest()


def home_of(key: str, replica_ids: list[str]) -> str:
    return max(replica_ids, key=lambda replica_id: home_rank(key, replica_id))


class PrefixKeyRouter(PowerOfTwoChoicesRequestRouter):  # type: ignore[misc]
    def initialize_state(self, imbalanced_threshold: int = DEFAULT_IMBALANCED_THRESHOLD, **kwargs: Any) -> None:
        super().initialize_state(**kwargs)  # type: ignore[no-untyped-call]
        if imbalanced_threshold < 0:
            raise ValueError(f"request_router_kwargs.imbalanced_threshold must be >= 0, got {imbalanced_threshold}")
        self._imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        fallback: list[list[RunningReplica]] = await super().choose_replicas(candidate_replicas, pending_request)
        key = pending_request.kwargs.get("prefix_key") if pending_request is not None else None
        if not key or len(candidate_replicas) < 2:
            return fallback
        by_id = {replica.replica_id.to_full_id_str(): replica for replica in candidate_replicas}
        home = by_id[home_of(str(key), list(by_id))]
        if self._overloaded(home, candidate_replicas):
            return fallback
        others = [replica for rank in fallback for replica in rank if replica.replica_id != home.replica_id]
        return [[home], others] if others else [[home]]

    def _overloaded(self, home: RunningReplica, replicas: list[RunningReplica]) -> bool:
        cache = self._replica_queue_len_cache
        home_queue = cache.get(home.replica_id)
        if home_queue is None:
            return False  # not seen yet: Serve probes it when it tries the home
        queues = [q for r in replicas if r.replica_id != home.replica_id
                  and (q := cache.get(r.replica_id)) is not None]
        return bool(queues) and home_queue - min(queues) > self._imbalanced_threshold
