"""``RedisStore``: the shared ``StateStore`` every router, region and poller uses in production.

Every key is prefixed ``sched:<namespace>:`` here, so callers pass the relative names of
``scheduler.state.keys``. Three deployments of Redis (``from_url``, by the URL's scheme):

- one server (``redis://``, ``rediss://`` for TLS, ``unix://``), ACL users as
  ``redis://USER:PASSWORD@host``;
- Sentinel (``redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``, or
  ``rediss+sentinel://``): the current master of SERVICE, found again after a failover;
- Cluster (``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]``, ``rediss+cluster://``):
  keys are prefixed ``sched:{<namespace>}:``, a hash tag, so every key of a namespace maps to
  one slot. MGET and the scripts that touch two keys (the ledger and its marker, a stream and
  its marker) then work unchanged. The trade-off: one namespace lives on one shard (its
  primary and replicas, with the cluster's failover); the store's working set is bounded by
  design (docs/state-keys.md) and far below one shard's capacity, and separate namespaces
  spread over the shards.

TLS options ride on the URL's query as redis-py reads them (``?ssl_ca_certs=/path&
ssl_certfile=...&ssl_keyfile=...``). Locks are ``SET NX PX`` plus Lua compare-and-extend and
compare-and-delete, so only the owner extends or releases a lock. Connection failures,
timeouts and error answers (OOM, READONLY ...) surface as ``StateUnavailable``; callers
decide whether to keep their last value (the snapshot refresher) or queue (the ledger).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.commands.core import AsyncScript

from scheduler.state import keys
from scheduler.state.store import Atomic, AtomicArg, StateUnavailable
from scheduler.tasks import Interrupted, isolated

# Every Redis failure: unreachable (connection, timeout, loading) and error answers alike
# (OOM, READONLY replica, MISCONF, NOSCRIPT ...): the store cannot take the call right now.
# Callers keep their data queued and retry; none may lose it or die on an error answer.
_UNAVAILABLE = (redis_errors.RedisError, OSError)

# KEYS[1] lock key; ARGV[1] owner; ARGV[2] ttl ms. Extends only the owner's lock.
_EXTEND_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] lock key; ARGV[1] owner. Deletes only the owner's lock.
_DELETE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] counter; ARGV[1] window ms. The window starts at the first increment.
_INCR_WINDOW = """
local n = redis.call('INCR', KEYS[1])
if n == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
"""
# KEYS[1] bucket hash; ARGV[1] wanted; ARGV[2] rate per s; ARGV[3] capacity. One atomic token
# bucket on the server's clock (TIME), so routers' clocks need not agree. Returns {granted, left}.
_TAKE_TOKENS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = capacity
  at = now
end
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local granted = math.max(0, math.min(math.floor(tokens), tonumber(ARGV[1])))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return {granted, tostring(tokens)}
"""

# KEYS[1] ledger hash; KEYS[2] entry hash (absent: none); ARGV[1] entry ttl ms; ARGV[2] rank;
# ARGV[3..] field, amount pairs. The entry holds its rank ('.rank'), the ledger hash it was
# booked in ('.hash': another month's when a replacement crosses a month's end; every key of
# a namespace lives on one server) and the amounts booked. A replaced entry's amounts are
# taken back as strings (a Lua number would pass through '%.14g' and lose digits); amounts
# are never negative. (No empty key for "none": a cluster hashes every key passed to a
# script, and all must share one slot.)
_LEDGER_ADD = """
local entry = KEYS[2] or ''
if entry ~= '' then
  local booked = redis.call('HGET', entry, '.rank')
  if booked then
    if tonumber(booked) >= tonumber(ARGV[2]) then
      return 0
    end
    local hash = redis.call('HGET', entry, '.hash')
    local old = redis.call('HGETALL', entry)
    for i = 1, #old, 2 do
      if string.sub(old[i], 1, 1) ~= '.' then
        redis.call('HINCRBYFLOAT', hash, old[i], '-' .. old[i + 1])
      end
    end
    redis.call('DEL', entry)
  end
  redis.call('HSET', entry, '.rank', ARGV[2], '.hash', KEYS[1])
end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  if entry ~= '' then
    redis.call('HSET', entry, ARGV[i], ARGV[i + 1])
  end
end
if entry ~= '' then
  redis.call('PEXPIRE', entry, ARGV[1])
end
return 1
"""

# KEYS[1] window hash; KEYS[2] once marker (absent: none); ARGV[1] hash ttl ms; ARGV[2] marker
# ttl ms; ARGV[3..] field, amount pairs. The counters of one time window: added together (or not
# at all, once per marker), and the hash expires with its window. (No empty key for "none": a
# cluster hashes every key passed to a script, and all must share one slot.)
_WINDOW_ADD = """
if #KEYS > 1 and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then
  return 0
end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1] stream; KEYS[2] once marker; ARGV[1] marker ttl ms; ARGV[2] maxlen; ARGV[3..] field,
# value pairs. Appends only when the marker is new: an entry whose XADD timed out on the client
# but reached Redis is not appended again by the retry.
_XADD_ONCE = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return false
end
local body = {}
for i = 3, #ARGV do body[#body + 1] = ARGV[i] end
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(body))
"""

# KEYS[1] sorted set; ARGV[1] ttl ms; ARGV[2..] score, member pairs. The key's TTL is extended
# to ARGV[1], never shortened (a set without one gets it).
_ZADD_TTL = """
redis.call('ZADD', KEYS[1], unpack(ARGV, 2))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""

# Redis glob metacharacters that must be escaped in a SCAN MATCH prefix.
_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisStore:
    """A ``StateStore`` over one ``redis.asyncio.Redis`` client (its connection pool is shared
    by every caller in the process)."""

    def __init__(self, client: aioredis.Redis | RedisCluster, namespace: str, *, hash_tag: bool = False) -> None:
        self.namespace = namespace
        self._client = client
        self._prefix = key_prefix(namespace, hash_tag)
        self._extend = client.register_script(_EXTEND_IF_OWNER)
        self._delete_if_owner = client.register_script(_DELETE_IF_OWNER)
        self._incr_window = client.register_script(_INCR_WINDOW)
        self._take_tokens = client.register_script(_TAKE_TOKENS)
        self._ledger_add = client.register_script(_LEDGER_ADD)
        self._xadd_once = client.register_script(_XADD_ONCE)
        self._window_add = client.register_script(_WINDOW_ADD)
        self._zadd_ttl = client.register_script(_ZADD_TTL)
        # Each Atomic operation's script, registered at its first use.
        self._atomics: dict[Atomic, AsyncScript] = {}

    @classmethod
    def from_url(cls, url: str, namespace: str, timeout_s: float = 3.0, connect_timeout_s: float = 1.0) -> RedisStore:
        """A store on the Redis deployment ``url`` names (the module docstring). A dead Redis
        fails fast (connect timeout); a slow answer gets ``timeout_s``: every store call is off
        the request path, and on a loaded host a 1 s read timeout turned scheduling hiccups
        into spurious "store unavailable"."""
        scheme, _, rest = url.partition("://")
        options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": connect_timeout_s}
        if scheme.endswith("+cluster"):
            return cls(_cluster_client(scheme, rest, options), namespace, hash_tag=True)
        if scheme.endswith("+sentinel"):
            return cls(_sentinel_client(scheme, rest, options), namespace)
        client = aioredis.Redis.from_url(url, health_check_interval=30, decode_responses=False, **options)
        return cls(client, namespace)

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def _call(self, make: Callable[[], Awaitable[Any]]) -> Any:
        # redis-py's return types depend on decode_responses; this store never decodes, so
        # each caller states the type it gets.
        # In a child task: redis-py's socket timeouts can leave a stray cancel behind on
        # Python 3.11 (scheduler.tasks); there it fails this call, not the caller's task.
        try:
            return await isolated(make)
        except (*_UNAVAILABLE, Interrupted) as exc:
            raise StateUnavailable(f"redis ({self._prefix}*): {type(exc).__name__}: {exc}") from exc

    async def ping(self) -> bool:
        try:
            return bool(await self._call(self._client.ping))
        except StateUnavailable:
            return False

    async def get(self, key: str) -> bytes | None:
        value: bytes | None = await self._call(lambda: self._client.get(self._key(key)))
        return value

    async def mget(self, keys_: Sequence[str]) -> list[bytes | None]:
        if not keys_:
            return []
        values: list[bytes | None] = await self._call(lambda: self._client.mget([self._key(k) for k in keys_]))
        return values

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        px = _ms(ttl_s) if ttl_s is not None else None
        await self._call(lambda: self._client.set(self._key(key), value, px=px))

    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool:
        done = await self._call(lambda: self._client.set(self._key(key), value, px=_ms(ttl_s), nx=True))
        return bool(done)

    async def delete(self, key: str) -> None:
        await self._call(lambda: self._client.delete(self._key(key)))

    async def keys(self, prefix: str) -> list[str]:
        pattern = (self._prefix + prefix).translate(_GLOB_SPECIAL) + "*"

        async def scan() -> list[str]:
            found = [raw async for raw in self._client.scan_iter(match=pattern, count=1000)]
            return sorted({_text(raw)[len(self._prefix):] for raw in found})

        found: list[str] = await self._call(scan)
        return found

    async def zadd(self, key: str, members: Mapping[str, float], ttl_s: float | None = None) -> None:
        if not members:
            return
        if ttl_s is None:
            await self._call(lambda: self._client.zadd(self._key(key), dict(members)))
            return
        args: list[Any] = [_ms(ttl_s)]
        for member, score in members.items():
            args += [repr(float(score)), member]
        await self._call(lambda: self._zadd_ttl(keys=[self._key(key)], args=args))

    async def zrem(self, key: str, members: Sequence[str]) -> None:
        if members:
            await self._call(lambda: self._client.zrem(self._key(key), *members))

    async def zscore(self, key: str, member: str) -> float | None:
        score: float | None = await self._call(lambda: self._client.zscore(self._key(key), member))
        return score

    async def zcard(self, key: str) -> int:
        count: int = await self._call(lambda: self._client.zcard(self._key(key)))
        return count

    async def zrange_by_score(self, key: str, low: float = float("-inf"), high: float = float("inf"),
                              count: int | None = None) -> list[tuple[str, float]]:
        start, num = (None, None) if count is None else (0, count)
        raw: list[tuple[bytes, float]] = await self._call(lambda: self._client.zrangebyscore(
            self._key(key), _bound(low), _bound(high), start=start, num=num, withscores=True))
        return [(_text(member), float(score)) for member, score in raw]

    async def run_atomic(self, op: Atomic, keys_: Sequence[str], args: Sequence[AtomicArg]) -> Any:
        script = self._atomics.get(op)
        if script is None:
            script = self._atomics[op] = self._client.register_script(op.lua)
        full = [self._key(k) for k in keys_]
        return await self._call(lambda: script(keys=full, args=[self._prefix, *args]))

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float:
        value = await self._call(lambda: self._client.hincrbyfloat(self._key(key), field, amount))
        return float(value)

    async def hgetall(self, key: str) -> dict[str, str]:
        raw: Mapping[Any, Any] = await self._call(lambda: self._client.hgetall(self._key(key)))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def window_add(self, key: str, fields: Mapping[str, float], ttl_s: float, once_key: str | None = None,
                         once_ttl_s: float = 600.0) -> bool:
        args: list[Any] = [_ms(ttl_s), _ms(once_ttl_s)]
        for name, amount in fields.items():
            args += [name, repr(float(amount))]
        keys_ = [self._key(key)] if once_key is None else [self._key(key), self._key(once_key)]
        added = await self._call(lambda: self._window_add(keys=keys_, args=args))
        return bool(added)

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        key = self._key(keys.lock(name))
        ms = _ms(ttl_s)
        taken = await self._call(lambda: self._client.set(key, owner.encode(), nx=True, px=ms))
        if taken:
            return True
        extended = await self._call(lambda: self._extend(keys=[key], args=[owner.encode(), ms]))
        return bool(extended)

    async def release_lock(self, name: str, owner: str) -> None:
        key = self._key(keys.lock(name))
        await self._call(lambda: self._delete_if_owner(keys=[key], args=[owner.encode()]))

    async def xadd(self, stream: str, fields: Mapping[str, str], maxlen: int) -> str:
        # Approximate trimming (MAXLEN ~): Redis trims whole nodes, so the stream may hold a
        # few more than ``maxlen`` entries, never fewer.
        body: dict[Any, Any] = dict(fields)
        entry_id = await self._call(
            lambda: self._client.xadd(self._key(stream), body, maxlen=maxlen, approximate=True)
        )
        return _text(entry_id)

    async def xadd_once(self, stream: str, fields: Mapping[str, str], maxlen: int, once_key: str,
                        once_ttl_s: float) -> str | None:
        args: list[Any] = [_ms(once_ttl_s), maxlen]
        for name, value in fields.items():
            args += [name, value]
        entry_id = await self._call(
            lambda: self._xadd_once(keys=[self._key(stream), self._key(once_key)], args=args))
        return None if entry_id is None else _text(entry_id)

    async def xrange(self, stream: str, count: int, after: str | None = None) -> list[tuple[str, dict[str, str]]]:
        # "(" makes the start exclusive (Redis >= 6.2).
        start = "-" if after is None else f"({after}"
        raw: list[tuple[bytes, dict[bytes, bytes]]] = await self._call(
            lambda: self._client.xrange(self._key(stream), min=start, count=count)
        )
        return [(_text(entry_id), {_text(k): _text(v) for k, v in body.items()}) for entry_id, body in raw]

    async def incr_window(self, key: str, window_s: float) -> int:
        value = await self._call(lambda: self._incr_window(keys=[self._key(key)], args=[_ms(window_s)]))
        return int(value)

    async def close(self) -> None:
        await self._client.aclose()

    async def take_tokens(self, key: str, wanted: int, rate_per_s: float, capacity: float) -> tuple[int, float]:
        raw: list[Any] = await self._call(
            lambda: self._take_tokens(keys=[self._key(key)], args=[wanted, repr(rate_per_s), repr(capacity)]))
        return int(raw[0]), float(_text(raw[1]))

    async def ledger_add(self, key: str, fields: Mapping[str, float], entry_key: str | None,
                         entry_ttl_s: float, rank: int = 0) -> bool:
        args: list[Any] = [_ms(entry_ttl_s), rank]
        for name, amount in fields.items():
            args += [name, repr(float(amount))]
        keys_ = [self._key(key)] if entry_key is None else [self._key(key), self._key(entry_key)]
        added = await self._call(lambda: self._ledger_add(keys=keys_, args=args))
        return bool(added)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def key_prefix(namespace: str, hash_tag: bool = False) -> str:
    """``sched:<namespace>:``, or with the namespace as a hash tag (Redis Cluster)."""
    return f"sched:{{{namespace}}}:" if hash_tag else f"sched:{namespace}:"


def _hosts(rest: str) -> tuple[str, str, list[tuple[str, int]], str]:
    """(user, password, [(host, port)...], path) of ``[USER:PASSWORD@]H:P[,H:P...][/PATH]``."""
    userinfo, _, hosts_path = rest.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts, _, path = hosts_path.partition("/")
    path, _, _query = path.partition("?")
    nodes = []
    for entry in hosts.split(","):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"state URL: expected HOST:PORT, got {entry!r}")
        nodes.append((host.strip("[]"), int(port)))
    return unquote(user), unquote(password), nodes, path


def _tls(scheme: str, rest: str) -> dict[str, Any]:
    """TLS options of a ``rediss+...`` URL: on, with the CA and client files its query names."""
    if not scheme.startswith("rediss"):
        return {}
    query = parse_qs(rest.partition("?")[2])
    allowed = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
    return {"ssl": True, **{name: query[name][0] for name in allowed if name in query}}


def _cluster_client(scheme: str, rest: str, options: dict[str, Any]) -> RedisCluster:
    user, password, nodes, _ = _hosts(rest)
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in nodes], username=user or None,
                        password=password or None, decode_responses=False, **_tls(scheme, rest), **options)


def _sentinel_client(scheme: str, rest: str, options: dict[str, Any]) -> aioredis.Redis:
    user, password, nodes, path = _hosts(rest)
    service, _, db = path.partition("/")
    if not service:
        raise ValueError("state URL: redis+sentinel:// needs the service name: HOST:PORT/SERVICE[/DB]")
    auth: dict[str, Any] = {"username": user or None, "password": password or None}
    sentinel = Sentinel(nodes, sentinel_kwargs={**auth, **options}, **_tls(scheme, rest), **options)
    master: aioredis.Redis = sentinel.master_for(service, db=int(db or 0), decode_responses=False, **auth)
    return master


def _bound(score: float) -> str:
    """A score range bound as Redis spells it (-inf, +inf, or the number)."""
    if score == float("inf"):
        return "+inf"
    if score == float("-inf"):
        return "-inf"
    return repr(float(score))


async def delete_namespace(url: str, namespace: str) -> int:
    """Delete every key of ``namespace`` at ``url`` (what a local stack or a test leaves); how many."""
    store = RedisStore.from_url(url, namespace)
    client = store._client
    pattern = store._prefix.translate(_GLOB_SPECIAL) + "*"
    try:
        found = [key async for key in client.scan_iter(match=pattern, count=1000)]
        for key in found:  # one by one: a cluster refuses a DEL of keys in several slots
            await client.delete(key)
        return len(found)
    finally:
        await store.close()
