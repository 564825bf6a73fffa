"""``MemoryStore``: the embedded ``StateStore`` for a single process (tests, demo, simulator).

Same semantics as ``RedisStore`` (one key space shared by strings, hashes, sorted sets and
streams; TTLs; owner-checked locks; streams trimmed to ``maxlen``), checked by the same
contract suite. The clock is injected so tests move TTLs forward without sleeping. No
operation awaits inside, so each is atomic on the event loop, and so is an ``Atomic``
operation's ``local`` body, which awaits only these.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.state import keys
from scheduler.state.store import Atomic, AtomicArg

# A ledger entry's rank, among its booked amounts (as Redis keeps it).
_RANK = ".rank"

@dataclass
class MemoryStore:
    namespace: str = "local"
    clock: Callable[[], float] = time.monotonic
    _strings: dict[str, bytes] = field(default_factory=dict, init=False, repr=False)
    _hashes: dict[str, dict[str, float]] = field(default_factory=dict, init=False, repr=False)
    _zsets: dict[str, dict[str, float]] = field(default_factory=dict, init=False, repr=False)
    _streams: dict[str, list[tuple[str, dict[str, str]]]] = field(default_factory=dict, init=False, repr=False)
    _expires: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _last_stream_id: tuple[int, int] = field(default=(0, 0), init=False, repr=False)
    # The ledger hash each ledger entry was booked in (Redis keeps it in the entry, as '.hash').
    _entry_hashes: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def _live(self, key: str) -> bool:
        """Drop ``key`` if its TTL passed; True if it still exists."""
        deadline = self._expires.get(key)
        if deadline is not None and self.clock() >= deadline:
            self._drop(key)
        return key in self._strings or key in self._hashes or key in self._zsets or key in self._streams

    def _drop(self, key: str) -> None:
        self._strings.pop(key, None)
        self._hashes.pop(key, None)
        self._streams.pop(key, None)
        self._zsets.pop(key, None)
        self._expires.pop(key, None)
        self._entry_hashes.pop(key, None)

    async def ping(self) -> bool:
        return True

    async def get(self, key: str) -> bytes | None:
        return self._strings.get(key) if self._live(key) else None

    async def mget(self, keys_: Sequence[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys_]

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._drop(key)
        self._strings[key] = bytes(value)
        if ttl_s is not None:
            self._expires[key] = self.clock() + ttl_s

    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool:
        if await self.get(key) is not None:
            return False
        await self.set(key, value, ttl_s)
        return True

    async def delete(self, key: str) -> None:
        self._drop(key)

    async def keys(self, prefix: str) -> list[str]:
        every = [*self._strings, *self._hashes, *self._zsets, *self._streams]
        return sorted({key for key in every if key.startswith(prefix) and self._live(key)})

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float:
        self._live(key)
        table = self._hashes.setdefault(key, {})
        table[field] = table.get(field, 0.0) + amount
        return table[field]

    async def hgetall(self, key: str) -> dict[str, str]:
        if not self._live(key):
            return {}
        return {name: _redis_float(value) for name, value in self._hashes.get(key, {}).items()}

    async def zadd(self, key: str, members: Mapping[str, float], ttl_s: float | None = None) -> None:
        self._live(key)
        self._zsets.setdefault(key, {}).update((member, float(score)) for member, score in members.items())
        if ttl_s is not None:
            until = self.clock() + ttl_s
            self._expires[key] = max(until, self._expires.get(key, until))

    async def zrem(self, key: str, members: Sequence[str]) -> None:
        if not self._live(key):
            return
        scores = self._zsets.get(key, {})
        for member in members:
            scores.pop(member, None)
        if not scores:
            self._drop(key)

    async def zscore(self, key: str, member: str) -> float | None:
        return self._zsets.get(key, {}).get(member) if self._live(key) else None

    async def zcard(self, key: str) -> int:
        return len(self._zsets.get(key, {})) if self._live(key) else 0

    async def zrange_by_score(self, key: str, low: float = float("-inf"), high: float = float("inf"),
                              count: int | None = None) -> list[tuple[str, float]]:
        if not self._live(key):
            return []
        inside = ((score, member) for member, score in self._zsets.get(key, {}).items() if low <= score <= high)
        found = sorted(inside) if count is None else heapq.nsmallest(count, inside)
        return [(member, score) for score, member in found]

    async def run_atomic(self, op: Atomic, keys_: Sequence[str], args: Sequence[AtomicArg]) -> Any:
        return await op.local(self, keys_, args)

    async def window_add(self, key: str, fields: Mapping[str, float], ttl_s: float, once_key: str | None = None,
                         once_ttl_s: float = 600.0) -> bool:
        if once_key is not None and not await self.set_nx(once_key, b"1", once_ttl_s):
            return False
        for name, amount in fields.items():
            await self.hincrbyfloat(key, name, amount)
        self._expires[key] = self.clock() + ttl_s
        return True

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        key = keys.lock(name)
        holder = await self.get(key)
        if holder is not None and holder != owner.encode():
            return False
        await self.set(key, owner.encode(), ttl_s)
        return True

    async def release_lock(self, name: str, owner: str) -> None:
        key = keys.lock(name)
        if await self.get(key) == owner.encode():
            self._drop(key)

    async def xadd(self, stream: str, fields: Mapping[str, str], maxlen: int) -> str:
        self._live(stream)
        entries = self._streams.setdefault(stream, [])
        entry_id = self._next_stream_id()
        entries.append((entry_id, dict(fields)))
        del entries[: max(0, len(entries) - maxlen)]
        return entry_id

    async def xadd_once(self, stream: str, fields: Mapping[str, str], maxlen: int, once_key: str,
                        once_ttl_s: float) -> str | None:
        if not await self.set_nx(once_key, b"1", once_ttl_s):
            return None
        return await self.xadd(stream, fields, maxlen)

    async def xrange(self, stream: str, count: int, after: str | None = None) -> list[tuple[str, dict[str, str]]]:
        if not self._live(stream):
            return []
        entries = self._streams.get(stream, [])
        if after is not None:
            entries = [e for e in entries if _stream_id(e[0]) > _stream_id(after)]
        return [(entry_id, dict(body)) for entry_id, body in entries[:count]]

    async def incr_window(self, key: str, window_s: float) -> int:
        current = await self.get(key)
        count = int(current) + 1 if current is not None else 1
        deadline = self._expires.get(key) if current is not None else None
        self._strings[key] = str(count).encode()
        self._expires[key] = deadline if deadline is not None else self.clock() + window_s
        return count

    async def close(self) -> None:
        return None

    async def take_tokens(self, key: str, wanted: int, rate_per_s: float, capacity: float) -> tuple[int, float]:
        now = self.clock()
        state = self._hashes.get(key) if self._live(key) else None
        tokens, at = (capacity, now) if state is None else (state["tokens"], state["at"])
        tokens = min(capacity, tokens + max(0.0, now - at) * rate_per_s)
        granted = max(0, min(math.floor(tokens), wanted))
        tokens -= granted
        self._drop(key)
        self._hashes[key] = {"tokens": tokens, "at": now}
        self._expires[key] = now + capacity / rate_per_s + 1.0
        return granted, tokens

    async def ledger_add(self, key: str, fields: Mapping[str, float], entry_key: str | None,
                         entry_ttl_s: float, rank: int = 0) -> bool:
        if entry_key is not None:
            booked = self._hashes.get(entry_key) if self._live(entry_key) else None
            if booked is not None:
                if booked[_RANK] >= rank:
                    return False
                for name, amount in booked.items():
                    if name != _RANK:
                        await self.hincrbyfloat(self._entry_hashes[entry_key], name, -amount)
            self._drop(entry_key)
            self._hashes[entry_key] = {_RANK: float(rank), **fields}
            self._entry_hashes[entry_key] = key
            self._expires[entry_key] = self.clock() + entry_ttl_s
        for name, amount in fields.items():
            await self.hincrbyfloat(key, name, amount)
        return True

    def _next_stream_id(self) -> str:
        # Redis-style "<ms>-<seq>" ids, strictly increasing even within one millisecond.
        ms = int(time.time() * 1000)
        last_ms, last_seq = self._last_stream_id
        self._last_stream_id = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        return f"{self._last_stream_id[0]}-{self._last_stream_id[1]}"


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _redis_float(value: float) -> str:
    """How Redis prints a HINCRBYFLOAT result: integral values without a decimal point."""
    return str(int(value)) if value.is_integer() else repr(value)
