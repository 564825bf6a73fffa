"""The ``StateStore`` protocol: the small set of primitives every shared-state user builds on.

Routers, regions and pollers share one store (``RedisStore`` in production, ``MemoryStore``
for a single process). The protocol is deliberately generic (bytes values, float hashes,
locks, streams, counters); typed access (region state, signals, flags, the ledger) lives in
small modules beside their users, on top of these verbs, and every key passed here is
relative: the store prefixes ``sched:{namespace}:``.

Both implementations pass one contract test suite (tests/integration/test_state_contract.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class StateUnavailable(Exception):
    """The store cannot be reached (Redis down, timeout). Callers decide what to do."""


class StateStore(Protocol):
    namespace: str

    async def ping(self) -> bool: ...

    async def get(self, key: str) -> bytes | None: ...

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None: ...

    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Set ``key`` only if it does not exist; True if this call set it (single use)."""
        ...

    async def delete(self, key: str) -> None: ...

    async def keys(self, prefix: str) -> list[str]:
        """Relative keys starting with ``prefix``."""
        ...

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float: ...

    async def hgetall(self, key: str) -> dict[str, str]: ...

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lock, or extend it when ``owner`` already holds it; False if another does."""
        ...

    async def release_lock(self, name: str, owner: str) -> None:
        """Release only if ``owner`` holds it."""
        ...

    async def xadd(self, stream: str, fields: Mapping[str, str], maxlen: int) -> str: ...

    async def xrange(self, stream: str, count: int, after: str | None = None) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` entries, oldest first; with ``after``, only those with a later id."""
        ...

    async def incr_window(self, key: str, window_s: float) -> int:
        """Increment a counter that expires ``window_s`` after its first increment."""
        ...

    async def close(self) -> None: ...
