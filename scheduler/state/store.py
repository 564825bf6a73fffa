"""The ``StateStore`` protocol: the small set of primitives every shared-state user builds on.

Routers, regions and pollers share one store (``RedisStore`` in production, ``MemoryStore``
for a single process). The protocol is deliberately generic (bytes values, float hashes,
sorted sets, locks, streams, counters); typed access (region state, signals, flags, the
ledger, the deferral queue) lives in small modules beside their users, on top of these verbs,
and every key passed here is relative: the store prefixes ``sched:{namespace}:``. A user
that must check and write several keys at once brings its own ``Atomic`` operation.

Both implementations pass one contract test suite (tests/integration/test_state_contract.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class StateUnavailable(Exception):
    """The store cannot be reached (Redis down, timeout). Callers decide what to do."""


# What an atomic operation takes as arguments and gives back (bytes for strings, int for
# integers, None for nothing, lists of these).
AtomicArg = str | bytes | int | float


@dataclass(frozen=True, eq=False)
class Atomic:
    """A read-check-write over several keys that must happen all at once, or not at all: a
    user's own small transaction on the store, written twice.

    ``lua`` is what ``RedisStore`` runs (a script: all of it happens before any other client's
    command). It gets the prefixed ``keys`` as KEYS, and as ARGV the store's key prefix
    (``sched:{namespace}:``, for keys it names itself) followed by ``args``; it returns what
    Redis scripts return (strings, integers, nil, tables of these; a Lua number is truncated to
    an integer: return fractions as strings).

    ``local`` is what ``MemoryStore`` runs: the same operation as a coroutine over the store's
    own verbs, given the relative ``keys`` and ``args``; it must give back what the script does
    (bytes for strings). The in-process store never awaits inside a verb, so a body that only
    awaits that store's verbs runs with nothing in between. Both are checked against each
    other by their user's tests, which run on both stores.
    """

    name: str
    lua: str
    local: Callable[[StateStore, Sequence[str], Sequence[AtomicArg]], Awaitable[Any]]


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

    async def zadd(self, key: str, members: Mapping[str, float], ttl_s: float | None = None) -> None:
        """Set each member's score in sorted set ``key``. With ``ttl_s`` the key lives at least
        that long from now: its TTL is extended to it, never shortened."""
        ...

    async def zrem(self, key: str, members: Sequence[str]) -> None:
        """Remove members from sorted set ``key`` (an emptied set is gone)."""
        ...

    async def zscore(self, key: str, member: str) -> float | None: ...

    async def zcard(self, key: str) -> int: ...

    async def zrange_by_score(self, key: str, low: float = float("-inf"), high: float = float("inf"),
                              count: int | None = None) -> list[tuple[str, float]]:
        """Members with low <= score <= high, lowest score first (ties by member), at most ``count``."""
        ...

    async def run_atomic(self, op: Atomic, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
        """Run ``op`` (``Atomic``) over the relative ``keys`` with ``args``, all at once."""
        ...

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float: ...

    async def hgetall(self, key: str) -> dict[str, str]: ...

    async def window_add(self, key: str, fields: Mapping[str, float], ttl_s: float, once_key: str | None = None,
                         once_ttl_s: float = 600.0) -> bool:
        """Add each amount of ``fields`` to hash ``key`` (HINCRBYFLOAT) and set its TTL to
        ``ttl_s``, atomically, all or none, and only if ``once_key`` did not exist (it is then set
        for ``once_ttl_s``): the counters of a time window, shared by every user of the store,
        that expire with it; a retried batch counts once. True if added."""
        ...

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lock, or extend it when ``owner`` already holds it; False if another does."""
        ...

    async def release_lock(self, name: str, owner: str) -> None:
        """Release only if ``owner`` holds it."""
        ...

    async def xadd(self, stream: str, fields: Mapping[str, str], maxlen: int) -> str: ...

    async def xadd_once(self, stream: str, fields: Mapping[str, str], maxlen: int, once_key: str,
                        once_ttl_s: float) -> str | None:
        """``xadd`` only if ``once_key`` did not exist (it is then set for ``once_ttl_s``),
        atomically: a retried append lands once. The entry id, or None if already appended."""
        ...

    async def xrange(self, stream: str, count: int, after: str | None = None) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` entries, oldest first; with ``after``, only those with a later id."""
        ...

    async def incr_window(self, key: str, window_s: float) -> int:
        """Increment a counter that expires ``window_s`` after its first increment."""
        ...

    async def close(self) -> None: ...

    async def take_tokens(self, key: str, wanted: int, rate_per_s: float, capacity: float) -> tuple[int, float]:
        """Take up to ``wanted`` whole tokens from a token bucket shared by every user of the
        store, refilled at ``rate_per_s`` up to ``capacity`` (a new bucket starts full), atomically.
        Returns ``(granted, tokens_left)``; ``granted`` is 0 when the bucket holds less than one."""
        ...

    async def ledger_add(self, key: str, fields: Mapping[str, float], entry_key: str | None,
                         entry_ttl_s: float, rank: int = 0) -> bool:
        """Book ``fields`` (hash field -> amount) into hash ``key`` (HINCRBYFLOAT) atomically, all
        or none, as the entry ``entry_key``, which remembers them for ``entry_ttl_s``. A new entry
        adds its amounts. An entry booked before at a lower ``rank`` is replaced: its amounts are
        taken back from the hash it was booked in, then these are added. An entry booked at the
        same or a higher rank stays as it is (a retried entry counts once). True if anything
        was written; ``entry_key`` None: always added, nothing remembered."""
        ...
