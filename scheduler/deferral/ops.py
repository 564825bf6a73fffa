"""The deferral queue's atomic operations on the store (``scheduler.state.store.Atomic``): each
written once as a Redis script and once as the same steps over the in-process store's verbs.

Every operation works on one tenant's keys: its indexes as KEYS and, as the first arguments,
the tenant, the indexes' TTL and the relative prefixes of its per-request keys (the request id
completes them; ``scheduler.deferral.queue`` builds them). The indexes:

    due     sorted set: request id -> release time (while a router runs it: the end of its lease)
    kept    sorted set: request id -> when its stored answer (or cancellation) expires
    sizes   sorted set: request id -> the bytes it keeps in the store now (values, plus an
            overhead per key)
    tenants sorted set, one for the namespace: tenant -> its earliest due score (+inf: only
            answers kept); the release loop reads the due ones, nothing else
    usage   sorted set, one for the namespace: tenant -> the sum of its sizes

They change only here, together with the keys they index, so the counts and sums a cap is
checked against are those of what is stored. Every operation extends the TTLs of all five to
the indexes' TTL (the longest any key the queue writes may live; never shortening one): an
index never expires before what it indexes, nor one before another. A request's keys expire on
their own TTLs, and the index entries of what expired are dropped the next time the tenant's
index is worked on (``claim`` drops a lapsed hold, ``room`` and ``hold`` drop expired answers).

Clock times (scores) come from the caller (its clock, which a soak fast-forwards); TTLs are
in store milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.state.store import Atomic, AtomicArg, StateStore

# What ``hold`` answers: held (first submission or a hold again), a retry of a submission that
# stands, a retry of a cancelled one (with its cancellation), or refused by one of the two caps.
HELD, RETRY, CANCELLED, OVER_COUNT, OVER_BYTES = b"held", b"retry", b"cancelled", b"count", b"bytes"

# --- Redis -------------------------------------------------------------------------------------

# KEYS: due, kept, sizes, tenants, usage. ARGV[1] the store's prefix; ARGV[2] tenant; ARGV[3] the
# indexes' TTL (ms); ARGV[4..8] the relative key prefixes of submission, record, payload, claim,
# result; the op's own arguments follow (``arg(1)``, ``arg(2)``, ...).
_PRELUDE = """
local ns, tenant, index_ttl = ARGV[1], ARGV[2], ARGV[3]
local prefixes = {sub = ARGV[4], rec = ARGV[5], pay = ARGV[6], claim = ARGV[7], res = ARGV[8]}
local due, kept, sizes, tenants, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function arg(i)
  return ARGV[8 + i]
end

local function key(kind, id)
  return ns .. prefixes[kind] .. id
end

-- The tenant's place in the tenants index, and every index's TTL extended to the indexes' TTL.
local function reindex()
  local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  if head[1] then
    redis.call('ZADD', tenants, head[2], tenant)
  elseif redis.call('EXISTS', kept) == 1 then
    redis.call('ZADD', tenants, 'inf', tenant)
  else
    redis.call('ZREM', tenants, tenant)
  end
  for _, k in ipairs({due, kept, sizes, tenants, usage}) do
    if redis.call('PTTL', k) < tonumber(index_ttl) then
      redis.call('PEXPIRE', k, index_ttl)
    end
  end
end

local function resize(id, size)
  local old = tonumber(redis.call('ZSCORE', sizes, id) or '0')
  if size > 0 then
    redis.call('ZADD', sizes, size, id)
  else
    redis.call('ZREM', sizes, id)
  end
  if size ~= old and tonumber(redis.call('ZINCRBY', usage, size - old, tenant)) <= 0 then
    redis.call('ZREM', usage, tenant)
  end
end

local function forget(id)
  redis.call('DEL', key('sub', id), key('rec', id), key('pay', id), key('claim', id), key('res', id))
  redis.call('ZREM', due, id)
  redis.call('ZREM', kept, id)
  resize(id, 0)
end
"""

# arg: 1 id, 2 now, 3 release at, 4 hold ttl ms, 5 ack, 6 record, 7 payload, 8 max held,
# 9 max bytes, 10 overhead per key, 11 expired answers to drop at most.
_HOLD = _PRELUDE + """
local id, now, ttl = arg(1), arg(2), arg(4)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', kept, '-inf', now, 'LIMIT', 0, tonumber(arg(11)))) do
  forget(gone)
end
local first = redis.call('GET', key('sub', id))
if first and (redis.call('EXISTS', key('rec', id)) == 1 or redis.call('EXISTS', key('res', id)) == 1) then
  return {'retry', first}
end
local cancelled = not first and redis.call('GET', key('res', id))
if cancelled then
  return {'cancelled', cancelled}
end
local ack = first or arg(5)
local held = redis.call('ZCARD', due)
local used = tonumber(redis.call('ZSCORE', usage, tenant) or '0')
local old = tonumber(redis.call('ZSCORE', sizes, id) or '0')
local size = #ack + #arg(6) + #arg(7) + 3 * tonumber(arg(10))
if not redis.call('ZSCORE', due, id) and held >= tonumber(arg(8)) then
  return {'count', held, tostring(used), tostring(size)}
end
if used - old + size > tonumber(arg(9)) then
  return {'bytes', held, tostring(used), tostring(size)}
end
redis.call('SET', key('sub', id), ack, 'PX', ttl)
redis.call('SET', key('rec', id), arg(6), 'PX', ttl)
redis.call('SET', key('pay', id), arg(7), 'PX', ttl)
redis.call('ZADD', due, arg(3), id)
redis.call('ZREM', kept, id)
resize(id, size)
reindex()
return {'held', ack}
"""

# arg: 1 id, 2 now, 3 expired answers to drop at most. {requests held, bytes kept, 1 if the id
# has a submission}: whether a submission could fit, read before sending its payload (``hold``
# decides; this spares the payload's transfer when it plainly cannot).
_ROOM = _PRELUDE + """
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', kept, '-inf', arg(2), 'LIMIT', 0, tonumber(arg(3)))) do
  forget(gone)
end
reindex()
return {redis.call('ZCARD', due), tostring(tonumber(redis.call('ZSCORE', usage, tenant) or '0')),
        redis.call('EXISTS', key('sub', arg(1)))}
"""

# arg: 1 now, 2 lease until (score), 3 lease ms, 4 owner, 5 lapsed holds to drop at most. The id
# claimed, or nil. A due entry whose hold lapsed (its deadline and grace passed with no router
# to release it) is dropped on the way.
_CLAIM = _PRELUDE + """
for _ = 0, tonumber(arg(5)) do
  local id = redis.call('ZRANGEBYSCORE', due, '-inf', arg(1), 'LIMIT', 0, 1)[1]
  if not id then
    break
  end
  if redis.call('EXISTS', key('rec', id)) == 1 then
    redis.call('ZADD', due, arg(2), id)
    redis.call('SET', key('claim', id), arg(4), 'PX', arg(3))
    reindex()
    return id
  end
  forget(id)
end
reindex()
return false
"""

# arg: 1 id, 2 owner, 3 lease until, 4 lease ms. 1 when the claim was the owner's.
_RENEW = _PRELUDE + """
local id = arg(1)
if redis.call('GET', key('claim', id)) ~= arg(2) then
  return 0
end
redis.call('PEXPIRE', key('claim', id), arg(4))
if redis.call('ZSCORE', due, id) then
  redis.call('ZADD', due, arg(3), id)
end
reindex()
return 1
"""

# arg: 1 id, 2 owner, 3 due again at. Another router's claim is left alone.
_GIVE_BACK = _PRELUDE + """
local id = arg(1)
local holder = redis.call('GET', key('claim', id))
if holder and holder ~= arg(2) then
  return 0
end
redis.call('DEL', key('claim', id))
if redis.call('ZSCORE', due, id) then
  redis.call('ZADD', due, arg(3), id)
end
reindex()
return 1
"""

# arg: 1 id, 2 answer, 3 keep ms, 4 keep until, 5 overhead per key, 6 '1': an answer (only if
# held; its submission stays with it, for a retry), '0': a cancellation (whatever it is; its
# submission goes, a retry gets the cancellation). The request's state before, or nil when
# nothing of it is stored ('held', 'running', 'answered', 'submitted'). Its record, payload and
# claim go; the answer (or cancellation) stays for the keep time.
_ANSWER = _PRELUDE + """
local id, ttl, answering = arg(1), arg(3), arg(6) == '1'
local was
if redis.call('EXISTS', key('rec', id)) == 1 then
  was = redis.call('EXISTS', key('claim', id)) == 1 and 'running' or 'held'
elseif answering then
  return false
elseif redis.call('EXISTS', key('res', id)) == 1 then
  was = 'answered'
elseif redis.call('EXISTS', key('sub', id)) == 1 then
  was = 'submitted'
else
  return false
end
local ack_bytes = 0
if answering then
  ack_bytes = redis.call('STRLEN', key('sub', id))
  redis.call('PEXPIRE', key('sub', id), ttl)
else
  redis.call('DEL', key('sub', id))
end
redis.call('SET', key('res', id), arg(2), 'PX', ttl)
redis.call('DEL', key('rec', id), key('pay', id), key('claim', id))
redis.call('ZREM', due, id)
redis.call('ZADD', kept, arg(4), id)
resize(id, #arg(2) + ack_bytes + (answering and 2 or 1) * tonumber(arg(5)))
reindex()
return was
"""

# arg: 1 id, 2 now, 3 the record moved to now, 4 its ttl ms. 1 if held.
_RELEASE_NOW = _PRELUDE + """
local id, now = arg(1), arg(2)
if redis.call('EXISTS', key('rec', id)) == 0 then
  return 0
end
redis.call('SET', key('rec', id), arg(3), 'PX', arg(4))
local score = redis.call('ZSCORE', due, id)
if score and redis.call('EXISTS', key('claim', id)) == 0 and tonumber(score) > tonumber(now) then
  redis.call('ZADD', due, now, id)
end
reindex()
return 1
"""

# arg: the ids. Every key of each goes, and its index entries; how many ids.
_PURGE = _PRELUDE + """
for i = 9, #ARGV do
  forget(ARGV[i])
end
reindex()
return #ARGV - 8
"""


# --- the same on the in-process store ------------------------------------------------------------

class _Local:
    """The prelude's helpers over the store's verbs (``MemoryStore``: nothing awaits inside)."""

    def __init__(self, store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> None:
        self.store = store
        self.due, self.kept, self.sizes, self.tenants, self.usage = keys
        self.tenant = str(args[0])
        self.index_ttl_s = float(args[1]) / 1000.0
        self.prefixes = {"sub": str(args[2]), "rec": str(args[3]), "pay": str(args[4]), "claim": str(args[5]),
                         "res": str(args[6])}
        self.args = args[7:]

    def key(self, kind: str, request_id: str) -> str:
        return self.prefixes[kind] + request_id

    async def exists(self, kind: str, request_id: str) -> bool:
        return await self.store.get(self.key(kind, request_id)) is not None

    async def reindex(self) -> None:
        head = await self.store.zrange_by_score(self.due, count=1)
        if head:
            await self.store.zadd(self.tenants, {self.tenant: head[0][1]})
        elif await self.store.zcard(self.kept):
            await self.store.zadd(self.tenants, {self.tenant: float("inf")})
        else:
            await self.store.zrem(self.tenants, [self.tenant])
        for key in (self.due, self.kept, self.sizes, self.tenants, self.usage):
            first = await self.store.zrange_by_score(key, count=1)
            if first:  # set again as it is, with the TTL
                await self.store.zadd(key, dict(first), ttl_s=self.index_ttl_s)

    async def resize(self, request_id: str, size: int) -> None:
        old = await self.store.zscore(self.sizes, request_id) or 0.0
        if size > 0:
            await self.store.zadd(self.sizes, {request_id: size})
        else:
            await self.store.zrem(self.sizes, [request_id])
        if size != old:
            total = (await self.store.zscore(self.usage, self.tenant) or 0.0) + size - old
            if total <= 0:
                await self.store.zrem(self.usage, [self.tenant])
            else:
                await self.store.zadd(self.usage, {self.tenant: total})

    async def set_ttl(self, key: str, ttl_ms: float) -> None:
        value = await self.store.get(key)
        if value is not None:
            await self.store.set(key, value, ttl_ms / 1000.0)

    async def forget(self, request_id: str) -> None:
        for kind in self.prefixes:
            await self.store.delete(self.key(kind, request_id))
        await self.store.zrem(self.due, [request_id])
        await self.store.zrem(self.kept, [request_id])
        await self.resize(request_id, 0)


def _bytes(value: AtomicArg) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


async def _hold(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, now, release_at, ttl_ms, ack, record, payload, max_held, max_bytes, overhead, trim = t.args
    request_id = str(request_id)
    for gone, _ in await store.zrange_by_score(t.kept, high=float(now), count=int(trim)):
        await t.forget(gone)
    first = await store.get(t.key("sub", request_id))
    if first is not None and (await t.exists("rec", request_id) or await t.exists("res", request_id)):
        return [RETRY, first]
    cancelled = await store.get(t.key("res", request_id)) if first is None else None
    if cancelled is not None:
        return [CANCELLED, cancelled]
    stands = first if first is not None else _bytes(ack)
    held = await store.zcard(t.due)
    used = int(await store.zscore(t.usage, t.tenant) or 0)
    old = int(await store.zscore(t.sizes, request_id) or 0)
    size = len(stands) + len(_bytes(record)) + len(_bytes(payload)) + 3 * int(overhead)
    if await store.zscore(t.due, request_id) is None and held >= int(max_held):
        return [OVER_COUNT, held, str(used).encode(), str(size).encode()]
    if used - old + size > int(max_bytes):
        return [OVER_BYTES, held, str(used).encode(), str(size).encode()]
    ttl_s = float(ttl_ms) / 1000.0
    await store.set(t.key("sub", request_id), stands, ttl_s)
    await store.set(t.key("rec", request_id), _bytes(record), ttl_s)
    await store.set(t.key("pay", request_id), _bytes(payload), ttl_s)
    await store.zadd(t.due, {request_id: float(release_at)})
    await store.zrem(t.kept, [request_id])
    await t.resize(request_id, size)
    await t.reindex()
    return [HELD, stands]


async def _room(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, now, trim = t.args
    for gone, _ in await store.zrange_by_score(t.kept, high=float(now), count=int(trim)):
        await t.forget(gone)
    await t.reindex()
    used = int(await store.zscore(t.usage, t.tenant) or 0)
    return [await store.zcard(t.due), str(used).encode(), int(await t.exists("sub", str(request_id)))]


async def _claim(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    now, lease_until, lease_ms, owner, lapsed = t.args
    for _ in range(int(lapsed) + 1):
        head = await store.zrange_by_score(t.due, high=float(now), count=1)
        if not head:
            break
        request_id = head[0][0]
        if await t.exists("rec", request_id):
            await store.zadd(t.due, {request_id: float(lease_until)})
            await store.set(t.key("claim", request_id), _bytes(owner), float(lease_ms) / 1000.0)
            await t.reindex()
            return request_id.encode()
        await t.forget(request_id)
    await t.reindex()
    return None


async def _renew(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, owner, lease_until, lease_ms = (str(a) for a in t.args)
    if await store.get(t.key("claim", request_id)) != owner.encode():
        return 0
    await t.set_ttl(t.key("claim", request_id), float(lease_ms))
    if await store.zscore(t.due, request_id) is not None:
        await store.zadd(t.due, {request_id: float(lease_until)})
    await t.reindex()
    return 1


async def _give_back(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, owner, at = (str(a) for a in t.args)
    holder = await store.get(t.key("claim", request_id))
    if holder is not None and holder != owner.encode():
        return 0
    await store.delete(t.key("claim", request_id))
    if await store.zscore(t.due, request_id) is not None:
        await store.zadd(t.due, {request_id: float(at)})
    await t.reindex()
    return 1


async def _answer(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, answer, ttl_ms, keep_until, overhead, mode = t.args
    request_id = str(request_id)
    answering = str(mode) == "1"
    if await t.exists("rec", request_id):
        was = b"running" if await t.exists("claim", request_id) else b"held"
    elif answering:
        return None
    elif await t.exists("res", request_id):
        was = b"answered"
    elif await t.exists("sub", request_id):
        was = b"submitted"
    else:
        return None
    ack = b""
    if answering:
        ack = await store.get(t.key("sub", request_id)) or b""
        await t.set_ttl(t.key("sub", request_id), float(ttl_ms))
    else:
        await store.delete(t.key("sub", request_id))
    await store.set(t.key("res", request_id), _bytes(answer), float(ttl_ms) / 1000.0)
    for kind in ("rec", "pay", "claim"):
        await store.delete(t.key(kind, request_id))
    await store.zrem(t.due, [request_id])
    await store.zadd(t.kept, {request_id: float(keep_until)})
    await t.resize(request_id, len(_bytes(answer)) + len(ack) + (2 if answering else 1) * int(overhead))
    await t.reindex()
    return was


async def _release_now(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    request_id, now, record, ttl_ms = t.args
    request_id = str(request_id)
    if not await t.exists("rec", request_id):
        return 0
    await store.set(t.key("rec", request_id), _bytes(record), float(ttl_ms) / 1000.0)
    score = await store.zscore(t.due, request_id)
    if score is not None and not await t.exists("claim", request_id) and score > float(now):
        await store.zadd(t.due, {request_id: float(now)})
    await t.reindex()
    return 1


async def _purge(store: StateStore, keys: Sequence[str], args: Sequence[AtomicArg]) -> Any:
    t = _Local(store, keys, args)
    for request_id in t.args:
        await t.forget(str(request_id))
    await t.reindex()
    return len(t.args)


ROOM = Atomic("deferral-room", _ROOM, _room)
HOLD = Atomic("deferral-hold", _HOLD, _hold)
CLAIM = Atomic("deferral-claim", _CLAIM, _claim)
RENEW = Atomic("deferral-renew", _RENEW, _renew)
GIVE_BACK = Atomic("deferral-give-back", _GIVE_BACK, _give_back)
ANSWER = Atomic("deferral-answer", _ANSWER, _answer)
RELEASE_NOW = Atomic("deferral-release-now", _RELEASE_NOW, _release_now)
PURGE = Atomic("deferral-purge", _PURGE, _purge)
