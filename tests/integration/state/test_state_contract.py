"""The ``StateStore`` contract: ``MemoryStore`` and ``RedisStore`` behave the same, and
``RedisStore`` the same on one server, on a 3-node Redis Cluster and behind Sentinel (each
started by the fixtures: ``tests.redis_deployments``)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from scheduler.state import keys
from scheduler.state.factory import open_store
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.state.store import Atomic, AtomicArg, StateStore, StateUnavailable
from tests.integration.router.conftest import _write_certs as write_certs
from tests.redis_deployments import PrivateCluster, PrivateSentinel, PrivateTlsRedis

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")


@dataclass
class ManualClock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class StoreUnderTest:
    store: StateStore
    # Let ``seconds`` pass for the store's TTLs (moves a manual clock, or really waits).
    advance: Callable[[float], Awaitable[None]]


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    cluster = PrivateCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSentinel]:
    sentinel = PrivateSentinel(tmp_path_factory.mktemp("sentinel"))
    try:
        yield sentinel.start()
    finally:
        sentinel.stop()


@pytest.fixture(scope="module")
def redis_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateTlsRedis]:
    folder = tmp_path_factory.mktemp("tls")
    certs = write_certs(folder)
    server = PrivateTlsRedis(folder)
    try:
        yield server.start(certs.ca, certs.server_cert, certs.server_key)
    finally:
        server.stop()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration),
                        pytest.param("redis-cluster", marks=pytest.mark.integration),
                        pytest.param("redis-sentinel", marks=pytest.mark.integration),
                        pytest.param("redis-tls-acl", marks=pytest.mark.integration)])
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[StoreUnderTest]:
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        clock = ManualClock()

        async def advance_clock(seconds: float) -> None:
            clock.t += seconds

        yield StoreUnderTest(MemoryStore(namespace=namespace, clock=clock), advance_clock)
        return
    url = {"redis": lambda: REDIS_URL, "redis-cluster": lambda: request.getfixturevalue("redis_cluster").url,
           "redis-sentinel": lambda: request.getfixturevalue("redis_sentinel").url,
           "redis-tls-acl": lambda: request.getfixturevalue("redis_tls").url}[request.param]()
    store = RedisStore.from_url(url, namespace)
    try:
        yield StoreUnderTest(store, asyncio.sleep)
    finally:
        await store.close()
        assert await delete_namespace(url, namespace) >= 0


async def test_ping(subject: StoreUnderTest) -> None:
    assert await subject.store.ping() is True


async def test_get_set_delete(subject: StoreUnderTest) -> None:
    store = subject.store
    assert await store.get("a") is None
    await store.set("a", b"\x00one\xff")
    assert await store.get("a") == b"\x00one\xff"
    await store.set("a", b"two")
    assert await store.get("a") == b"two"
    await store.delete("a")
    assert await store.get("a") is None
    await store.delete("never-set")  # deleting nothing is not an error


async def test_mget_keeps_order_and_gaps(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.set("x", b"1")
    await store.set("z", b"3")
    assert await store.mget(["z", "y", "x"]) == [b"3", None, b"1"]
    assert await store.mget([]) == []


async def test_ttl_expires(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.set("short", b"v", ttl_s=0.3)
    await store.set("long", b"v", ttl_s=30)
    await store.set("forever", b"v")
    assert await store.get("short") == b"v"
    await subject.advance(0.6)
    assert await store.get("short") is None
    assert await store.get("long") == b"v"
    assert await store.get("forever") == b"v"
    assert "short" not in await store.keys("")


async def test_set_without_ttl_clears_an_earlier_ttl(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.set("k", b"v", ttl_s=0.3)
    await store.set("k", b"w")
    await subject.advance(0.6)
    assert await store.get("k") == b"w"


async def test_keys_by_prefix_are_relative_and_literal(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.set(keys.region_state("eu-north"), b"{}")
    await store.set(keys.region_state("us-west"), b"{}")
    await store.set(keys.signal("carbon_intensity", "NO"), b"{}")
    await store.hincrbyfloat(keys.ledger("acme", "2026-01"), "f", 1.0)
    await store.set("odd*[key]?", b"{}")
    assert await store.keys(keys.REGION_STATE_PREFIX) == ["region:eu-north:state", "region:us-west:state"]
    assert await store.keys("ledger:") == ["ledger:acme:2026-01"]
    # Glob characters in a prefix are matched literally.
    assert await store.keys("odd*") == ["odd*[key]?"]
    assert await store.keys("od*") == []


async def test_namespaces_do_not_see_each_other(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.set("shared-name", b"mine")
    if isinstance(store, RedisStore):
        other = RedisStore.from_url(REDIS_URL, store.namespace + "-other")
        try:
            assert await other.get("shared-name") is None
            assert await other.keys("") == []
        finally:
            await other.close()
    else:
        assert await MemoryStore(namespace="other").get("shared-name") is None


async def test_hash_float_increments(subject: StoreUnderTest) -> None:
    store = subject.store
    key = keys.ledger("acme", "2026-03")
    assert await store.hgetall(key) == {}
    assert await store.hincrbyfloat(key, "eu-north|shared-v1|energy_j", 1.5) == pytest.approx(1.5)
    assert await store.hincrbyfloat(key, "eu-north|shared-v1|energy_j", 2.25) == pytest.approx(3.75)
    assert await store.hincrbyfloat(key, "eu-north|shared-v1|requests", 1) == pytest.approx(1.0)
    table = await store.hgetall(key)
    assert set(table) == {"eu-north|shared-v1|energy_j", "eu-north|shared-v1|requests"}
    assert float(table["eu-north|shared-v1|energy_j"]) == pytest.approx(3.75)
    assert table["eu-north|shared-v1|requests"] == "1"


async def test_lock_is_exclusive_extendable_and_owner_released(subject: StoreUnderTest) -> None:
    store = subject.store
    assert await store.acquire_lock("poll:NO", "router-a", ttl_s=5)
    assert not await store.acquire_lock("poll:NO", "router-b", ttl_s=5)
    # The holder re-acquiring extends its lock.
    assert await store.acquire_lock("poll:NO", "router-a", ttl_s=5)
    # Only the owner may release.
    await store.release_lock("poll:NO", "router-b")
    assert not await store.acquire_lock("poll:NO", "router-b", ttl_s=5)
    await store.release_lock("poll:NO", "router-a")
    assert await store.acquire_lock("poll:NO", "router-b", ttl_s=5)
    assert await store.keys("lock:") == ["lock:poll:NO"]


async def test_lock_expires_and_extension_moves_the_deadline(subject: StoreUnderTest) -> None:
    store = subject.store
    assert await store.acquire_lock("l", "a", ttl_s=0.4)
    await subject.advance(0.25)
    assert await store.acquire_lock("l", "a", ttl_s=0.4)  # extended: now 0.4 s from here
    await subject.advance(0.25)
    assert not await store.acquire_lock("l", "b", ttl_s=0.4)
    await subject.advance(0.3)
    assert await store.acquire_lock("l", "b", ttl_s=0.4)


async def test_stream_append_read_and_trim(subject: StoreUnderTest) -> None:
    store = subject.store
    ids = [await store.xadd(keys.AUDIT, {"decision_id": f"d{i}", "region": "eu-north"}, maxlen=1000) for i in range(5)]
    assert len(set(ids)) == 5
    entries = await store.xrange(keys.AUDIT, count=10)
    assert [entry_id for entry_id, _ in entries] == ids
    assert entries[0][1] == {"decision_id": "d0", "region": "eu-north"}
    assert [body["decision_id"] for _, body in await store.xrange(keys.AUDIT, count=2)] == ["d0", "d1"]
    assert await store.xrange("no-such-stream", count=10) == []


async def test_stream_reads_after_an_id(subject: StoreUnderTest) -> None:
    store = subject.store
    ids = [await store.xadd("s", {"n": str(i)}, maxlen=1000) for i in range(5)]
    assert [body["n"] for _, body in await store.xrange("s", count=10, after=ids[1])] == ["2", "3", "4"]
    assert await store.xrange("s", count=10, after=ids[-1]) == []
    assert [body["n"] for _, body in await store.xrange("s", count=1, after=ids[0])] == ["1"]


async def test_stream_append_once_per_marker(subject: StoreUnderTest) -> None:
    store = subject.store
    first = await store.xadd_once("s", {"decision_id": "d1"}, 1000, "once:d1", once_ttl_s=60)
    assert first is not None
    # The retry of an append that did land: not appended again.
    assert await store.xadd_once("s", {"decision_id": "d1"}, 1000, "once:d1", once_ttl_s=60) is None
    assert await store.xadd_once("s", {"decision_id": "d2", "n": "2"}, 1000, "once:d2", once_ttl_s=60) is not None
    assert [body for _, body in await store.xrange("s", count=10)] == [{"decision_id": "d1"},
                                                                      {"decision_id": "d2", "n": "2"}]


async def test_set_nx_sets_once_until_it_expires(subject: StoreUnderTest) -> None:
    store = subject.store
    assert await store.set_nx("ticket:d1", b"1", ttl_s=0.3)
    assert not await store.set_nx("ticket:d1", b"2", ttl_s=0.3)
    assert await store.get("ticket:d1") == b"1"
    await subject.advance(0.4)
    assert await store.set_nx("ticket:d1", b"3", ttl_s=0.3)


async def test_stream_maxlen_bounds_the_stream(subject: StoreUnderTest) -> None:
    store = subject.store
    for i in range(600):
        await store.xadd("s", {"n": str(i)}, maxlen=100)
    entries = await store.xrange("s", count=10_000)
    # Redis trims approximately (whole nodes of up to 100 entries): at least maxlen are kept,
    # at most one node more; the newest are always the ones kept.
    assert 100 <= len(entries) <= 200
    assert entries[-1][1] == {"n": "599"}


async def test_incr_window_counts_then_resets(subject: StoreUnderTest) -> None:
    store = subject.store
    assert [await store.incr_window("rate:acme", window_s=0.4) for _ in range(3)] == [1, 2, 3]
    await subject.advance(0.2)
    # Later increments do not push the window's end out.
    assert await store.incr_window("rate:acme", window_s=0.4) == 4
    await subject.advance(0.35)
    assert await store.incr_window("rate:acme", window_s=0.4) == 1


async def test_concurrent_lock_has_one_winner(subject: StoreUnderTest) -> None:
    store = subject.store
    won = await asyncio.gather(*(store.acquire_lock("race", f"owner-{i}", ttl_s=5) for i in range(20)))
    assert sum(won) == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.integration
async def test_redis_down_raises_state_unavailable() -> None:
    store = open_store(f"redis://127.0.0.1:{_closed_port()}/1", "down")
    try:
        assert await store.ping() is False
        with pytest.raises(StateUnavailable):
            await store.get("a")
        with pytest.raises(StateUnavailable):
            await store.set("a", b"v")
        with pytest.raises(StateUnavailable):
            await store.keys("")
        with pytest.raises(StateUnavailable):
            await store.acquire_lock("l", "me", 1.0)
    finally:
        await store.close()


@pytest.mark.integration
async def test_open_store_urls() -> None:
    assert isinstance(open_store("memory", "ns"), MemoryStore)
    store = open_store(REDIS_URL, "ns-open")
    try:
        assert isinstance(store, RedisStore)
        assert store.namespace == "ns-open"
        assert await store.ping()
    finally:
        await store.close()
    with pytest.raises(ValueError, match="expected 'memory', redis://"):
        open_store("postgres://x", "ns")
    with pytest.raises(ValueError, match="needs the service name"):
        open_store("redis+sentinel://127.0.0.1:26379", "ns")
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        open_store("redis+cluster://127.0.0.1", "ns")


@pytest.mark.integration
async def test_cluster_keys_share_the_namespaces_slot(redis_cluster: PrivateCluster) -> None:
    """On a cluster every key of a namespace carries it as a hash tag: one slot, so MGET and the
    two-key scripts work; the raw key names say so."""
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    store = RedisStore.from_url(redis_cluster.url, namespace)
    try:
        await store.set("region:a:state", b"1")
        await store.set("signal:carbon_intensity:DE", b"2")
        assert await store.mget(["region:a:state", "signal:carbon_intensity:DE", "missing"]) == [b"1", b"2", None]
        assert await store.keys("region:") == ["region:a:state"]
        raw = store._client
        assert await raw.get(f"sched:{{{namespace}}}:region:a:state") == b"1"
    finally:
        await store.close()
        assert await delete_namespace(redis_cluster.url, namespace) == 2


@pytest.mark.integration
async def test_redis_keys_carry_the_namespace_prefix() -> None:
    store = RedisStore.from_url(REDIS_URL, "prefix-check")
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        await store.set("flags", b"{}")
        assert await raw.get("sched:prefix-check:flags") == b"{}"
    finally:
        await store.delete("flags")
        await store.close()
        await raw.aclose()


async def test_take_tokens_is_one_shared_bucket(subject: StoreUnderTest) -> None:
    store = subject.store
    try:
        # A new bucket starts full (capacity 5); grants are whole tokens, never more than it holds.
        assert (await store.take_tokens("rate:acme", 3, rate_per_s=10.0, capacity=5.0))[0] == 3
        assert (await store.take_tokens("rate:acme", 5, rate_per_s=10.0, capacity=5.0))[0] == 2
        granted, left = await store.take_tokens("rate:acme", 1, rate_per_s=10.0, capacity=5.0)
        assert granted == 0 and left < 1.0
        # Another key is another bucket.
        assert (await store.take_tokens("rate:globex", 4, rate_per_s=10.0, capacity=5.0))[0] == 4
        # Refilled at the rate, up to the capacity only (1 s at 10/s would be 10).
        await subject.advance(1.0)
        assert (await store.take_tokens("rate:acme", 50, rate_per_s=10.0, capacity=5.0))[0] == 5
    finally:
        await store.delete("rate:acme")
        await store.delete("rate:globex")


async def test_take_tokens_concurrent_callers_never_overdraw(subject: StoreUnderTest) -> None:
    store = subject.store
    try:
        # 40 callers, 3 tokens each, on a bucket of 20 refilled very slowly: exactly 20 granted.
        grants = await asyncio.gather(*(store.take_tokens("rate:race", 3, rate_per_s=0.001, capacity=20.0)
                                        for _ in range(40)))
        assert sum(granted for granted, _ in grants) == 20
    finally:
        await store.delete("rate:race")


async def test_ledger_add_applies_all_fields_once_per_entry(subject: StoreUnderTest) -> None:
    store = subject.store
    key = keys.ledger("acme", "2026-03")
    fields = {"eu-north|model-v1|energy_j": 12.5, "eu-north|model-v1|carbon_g": 0.25,
              "eu-north|model-v1|requests": 1.0}
    assert await store.ledger_add(key, fields, "ledger_entry:d1:eu-north:p", 60.0) is True
    # The same entry again (a retry, a re-read batch): nothing is added.
    assert await store.ledger_add(key, fields, "ledger_entry:d1:eu-north:p", 60.0) is False
    assert await store.ledger_add(key, fields, "ledger_entry:d2:eu-north:p", 60.0) is True
    table = await store.hgetall(key)
    assert {name: float(value) for name, value in table.items()} == pytest.approx(
        {name: 2 * amount for name, amount in fields.items()})
    # Without an entry key every call adds.
    assert await store.ledger_add(key, {"eu-north|model-v1|requests": 1.0}, None, 60.0) is True
    assert float((await store.hgetall(key))["eu-north|model-v1|requests"]) == pytest.approx(3.0)


async def test_ledger_add_replaces_an_entry_only_with_a_higher_rank(subject: StoreUnderTest) -> None:
    """A router's own count (rank 1) booked first, then the engine's (rank 2) under another
    rule, in another month's hash: the first is taken back from where it was booked; a second
    rank-1 booking changes nothing after that, nor does the rank-2 one again."""
    store = subject.store
    march, april = keys.ledger("acme", "2026-03"), keys.ledger("acme", "2026-04")
    entry = "ledger_entry:d7:eu-north:p"
    estimate = {"eu-north|model-v1|energy_j": 10.0, "eu-north|model-v1|requests": 1.0,
                "eu-north|model-v1|prompt_tokens": 25.0}
    engine = {"eu-north|equal-v1|energy_j": 12.5, "eu-north|equal-v1|requests": 1.0,
              "eu-north|equal-v1|prompt_tokens": 40.0}
    other = {"eu-north|model-v1|energy_j": 5.0, "eu-north|model-v1|requests": 1.0}
    assert await store.ledger_add(march, other, "ledger_entry:d8:eu-north:p", 60.0, 1)
    assert await store.ledger_add(march, estimate, entry, 60.0, 1) is True
    assert await store.ledger_add(april, engine, entry, 60.0, 2) is True
    assert await store.ledger_add(april, estimate, entry, 60.0, 1) is False
    assert await store.ledger_add(april, engine, entry, 60.0, 2) is False
    march_table = {name: float(value) for name, value in (await store.hgetall(march)).items()}
    april_table = {name: float(value) for name, value in (await store.hgetall(april)).items()}
    assert march_table == pytest.approx({"eu-north|model-v1|energy_j": 5.0, "eu-north|model-v1|requests": 1.0,
                                         "eu-north|model-v1|prompt_tokens": 0.0})
    assert april_table == pytest.approx(engine)


async def test_ledger_add_entry_expires(subject: StoreUnderTest) -> None:
    store = subject.store
    key = keys.ledger("acme", "2026-04")
    assert await store.ledger_add(key, {"x|r|requests": 1.0}, "ledger_entry:d9:x:p", 0.2)
    await subject.advance(0.4)
    assert await store.ledger_add(key, {"x|r|requests": 1.0}, "ledger_entry:d9:x:p", 0.2)
    assert float((await store.hgetall(key))["x|r|requests"]) == pytest.approx(2.0)


async def test_window_add_counts_once_per_batch_and_expires_with_its_window(subject: StoreUnderTest) -> None:
    store = subject.store
    key = keys.canary_window("steady", "thrifty", "0", 10.0, 17)
    fields = {"canary|requests": 2.0, "canary|ttft_ok": 1.0, "control|energy_j": 12.5}
    assert await store.window_add(key, fields, 0.6, keys.canary_once("w1:1"), 60.0) is True
    # The same batch again (a write that timed out on our side but landed): nothing is added.
    assert await store.window_add(key, fields, 0.6, keys.canary_once("w1:1"), 60.0) is False
    assert await store.window_add(key, {"canary|requests": 1.0}, 0.6) is True  # no marker: always added
    table = {name: float(value) for name, value in (await store.hgetall(key)).items()}
    assert table == pytest.approx({"canary|requests": 3.0, "canary|ttft_ok": 1.0, "control|energy_j": 12.5})
    await subject.advance(0.9)
    assert await store.hgetall(key) == {}  # the window's counts expire with it


async def test_sorted_set_scores_ranges_and_removal(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.zadd("z", {"b": 2.0, "a": 1.5, "c": 3.0, "tie": 2.0})
    assert await store.zcard("z") == 4
    assert await store.zscore("z", "a") == 1.5 and await store.zscore("z", "nobody") is None
    assert await store.zrange_by_score("z") == [("a", 1.5), ("b", 2.0), ("tie", 2.0), ("c", 3.0)]
    assert await store.zrange_by_score("z", 2.0, 2.5) == [("b", 2.0), ("tie", 2.0)]
    assert await store.zrange_by_score("z", high=2.0, count=1) == [("a", 1.5)]
    await store.zadd("z", {"a": 9.0})  # moved, not added
    assert await store.zrange_by_score("z", low=5.0) == [("a", 9.0)]
    await store.zrem("z", ["a", "b", "nobody"])
    assert await store.zcard("z") == 2
    await store.zrem("z", ["c", "tie"])
    assert await store.zcard("z") == 0 and await store.zrange_by_score("z") == []
    assert await store.keys("z") == []  # an emptied set is gone


async def test_sorted_set_ttl_is_extended_never_shortened(subject: StoreUnderTest) -> None:
    store = subject.store
    await store.zadd("zt", {"a": 1.0}, ttl_s=0.6)
    await store.zadd("zt", {"b": 2.0}, ttl_s=0.1)  # does not shorten it
    await subject.advance(0.3)
    assert await store.zcard("zt") == 2
    await store.zadd("zt", {"c": 3.0})  # no ttl_s: the TTL stays
    await subject.advance(0.5)
    assert await store.zcard("zt") == 0


def _counter_local(store: StateStore, keys_: Sequence[str], args: Sequence[AtomicArg]) -> Awaitable[Any]:
    async def body() -> Any:
        current = await store.get(keys_[0])
        if current is not None and int(current) >= int(args[0]):
            return [b"full", int(current)]
        value = 1 if current is None else int(current) + 1
        await store.set(keys_[0], str(value).encode())
        await store.zadd(keys_[1], {str(value): float(value)})
        return [b"ok", value]

    return body()


# A bounded counter and a log of its values, together: the contract of ``Atomic``.
_COUNTER = Atomic("test-counter", """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current >= tonumber(ARGV[2]) then
  return {'full', current}
end
redis.call('SET', KEYS[1], current + 1)
redis.call('ZADD', KEYS[2], current + 1, tostring(current + 1))
-- ARGV[1] is the store's prefix: a key named here is the namespace's too
redis.call('SET', ARGV[1] .. 'counter-named-inside', 'x', 'PX', 60000)
return {'ok', current + 1}
""", _counter_local)


async def test_atomic_operations_run_whole_and_answer_alike(subject: StoreUnderTest) -> None:
    store = subject.store
    results = await asyncio.gather(*(store.run_atomic(_COUNTER, ["counter", "counter-log"], [5]) for _ in range(8)))
    assert sorted(r[1] for r in results if r[0] == b"ok") == [1, 2, 3, 4, 5]
    assert [r for r in results if r[0] == b"full"] == [[b"full", 5]] * 3
    assert [m for m, _ in await store.zrange_by_score("counter-log")] == ["1", "2", "3", "4", "5"]
    if isinstance(store, RedisStore):
        assert await store.get("counter-named-inside") == b"x"
