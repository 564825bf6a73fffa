"""``open_store(url, namespace)``: a store from a ``--state`` argument.

``memory`` -> ``MemoryStore`` (one process); ``redis://host:port/db`` (or ``rediss://``,
``unix://``, ``redis+sentinel://``, ``redis+cluster://`` and their TLS forms: see
``scheduler.state.redis_store``) -> ``RedisStore``. Opening connects lazily: the first call
that needs Redis raises ``StateUnavailable`` when it is down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from urllib.parse import urlsplit

from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import StateStore


def _memory(url: str, namespace: str) -> StateStore:
    return MemoryStore(namespace=namespace)


def _redis(url: str, namespace: str) -> StateStore:
    return RedisStore.from_url(url, namespace)


OPENERS: Mapping[str, Callable[[str, str], StateStore]] = MappingProxyType(
    {"memory": _memory, "redis": _redis, "rediss": _redis, "unix": _redis, "redis+sentinel": _redis,
     "rediss+sentinel": _redis, "redis+cluster": _redis, "rediss+cluster": _redis}
)


def open_store(url: str, namespace: str) -> StateStore:
    scheme = "memory" if url == "memory" else urlsplit(url).scheme
    opener = OPENERS.get(scheme)
    if opener is None:
        raise ValueError(f"state URL {url!r}: expected 'memory', redis://HOST:PORT/DB, "
                         "redis+sentinel://HOST:PORT/SERVICE or redis+cluster://HOST:PORT[,HOST:PORT]")
    return opener(url, namespace)
