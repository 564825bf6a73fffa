"""A store that answers reads but refuses writes is not a region outage.

Redis that reached ``maxmemory`` under ``noeviction`` answers every write with OOM; a replica
left behind by a failover answers READONLY; a region's ACL user whose password changed gets
NOAUTH. In each case the regions cannot publish their live state while the routers still read
the store fine: without another source every region goes stale after ``max_age.region_state``
(5 s) and nothing is schedulable. The routers then judge regions by their own probes
(scheduler.plugins.filters.region_health), and receipts they cannot book wait in the ledger's
queue until the store takes writes again.

Real parts: a private ``redis-server`` turned full (``CONFIG SET maxmemory 1``) or read-only
(``REPLICAOF`` an address nobody answers), three stub regions (real HTTP servers) publishing
through the real ``RegionStatePublisher``, and a live router (real gRPC on port 0) with its
probes. Run alone with the figures: ``.venv/bin/python -m pytest
tests/faults/test_store_refuses_writes.py -p no:cacheprovider -s``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence

import pytest
import redis

from scheduler.client import AsyncSchedulerClient
from scheduler.client.errors import SchedulerRpcError
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import STATE_STORE
from scheduler.ledger.ledger import Ledger
from scheduler.ledger.service import LedgerService
from scheduler.server.app import RunningRouter, build_deps, start_router, with_services
from scheduler.state.redis_store import RedisStore
from tests.faults.redis_server import PrivateRedis, free_port
from tests.faults.test_store_outage import REGIONS, stack_on, until_all_live

pytestmark = pytest.mark.integration


async def router_on(redis_url: str, namespace: str, configs: Sequence[RegionConfig]) -> RunningRouter:
    """A router with its ledger (no carbon pollers: the test's store is refusing writes)."""
    store = RedisStore.from_url(redis_url, namespace)
    deps = build_deps(SnapshotBuilder(compile_fleet(tuple(configs)),
                                      compile_policy(load_fleet().policy("default"))), store, "redis",
                      rate_limit_rps=1000.0)
    return await start_router("127.0.0.1:0", with_services(deps, carbon_pollers=False))

REFUSING_S = 15.0  # writes refused this long: three times the regions' max_age of 5 s
STOP_REGION_AT_S = 8.0  # then a region dies: its probe fails and it leaves the ranking


def make_full(client: redis.Redis) -> Callable[[], None]:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")

    def undo() -> None:
        client.config_set("maxmemory", "0")

    return undo


def make_read_only(client: redis.Redis) -> Callable[[], None]:
    # A replica of an address nobody answers: it keeps its data and refuses every write.
    client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))

    def undo() -> None:
        client.execute_command("REPLICAOF", "NO", "ONE")

    return undo


@pytest.mark.timeout(120)
@pytest.mark.parametrize("refuse", [make_full, make_read_only], ids=["maxmemory-reached", "read-only-replica"])
async def test_routing_goes_on_on_probes_and_no_receipt_is_lost(
    own_redis: PrivateRedis, refuse: Callable[[redis.Redis], Callable[[], None]],
) -> None:
    namespace = f"test-refuses-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis(port=own_redis.port, socket_timeout=5)
    async with stack_on(own_redis.url, namespace) as stack:
        router = await router_on(own_redis.url, namespace, stack.configs)
        try:
            await until_all_live(router, REGIONS)
            async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
                before = await client.route("hi", model="llama-3.1-8b", max_tokens=8, jurisdictions=["EU"])
                victim = before.ranked[0].region
                survivor = next(r for r in ("eu-north", "eu-central") if r != victim)
                undo = refuse(admin)
                with pytest.raises(redis.ResponseError):  # the store really refuses writes now
                    admin.set("probe-write", "x")
                started = time.monotonic()
                codes: dict[str, int] = {}
                rankings: list[tuple[float, tuple[str, ...]]] = []
                receipts = []
                stopped_at: float | None = None
                while (now := time.monotonic() - started) < REFUSING_S:
                    if stopped_at is None and now >= STOP_REGION_AT_S:
                        await stack.stubs[victim].stop()
                        stopped_at = now
                    try:
                        decision = await client.route("hi", model="llama-3.1-8b", max_tokens=8,
                                                      jurisdictions=["EU"], timeout_s=10)
                        generation = client.generate("hi", model="llama-3.1-8b", max_tokens=4,
                                                     jurisdictions=["EU"], timeout_s=10)
                        text = await generation.text()
                    except SchedulerRpcError as exc:
                        codes[type(exc).__name__] = codes.get(type(exc).__name__, 0) + 1
                    else:
                        codes["OK"] = codes.get("OK", 0) + 1
                        assert STATE_STORE not in {f.signal for f in decision.fallbacks}  # reads work
                        rankings.append((now, tuple(c.region for c in decision.ranked)))
                        assert text and generation.receipt is not None
                        receipts.append(generation.receipt)
                    await asyncio.sleep(0.5)
                stale = router.deps.refresher.current()
                pending = next(task.pending for task in router.deps.background if isinstance(task, LedgerService))
                undo()
                # Once the store takes writes again, every receipt reaches the ledger.
                ledger = Ledger(RedisStore.from_url(own_redis.url, namespace))
                deadline = time.monotonic() + 20
                while True:
                    usage, _ = await ledger.usage("local")
                    if usage.requests >= len(receipts) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                await ledger.store.close()
        finally:
            await router.stop(grace_s=0.5)
            admin.close()

    ages = {r: stale.now - s.observed_at for r, s in stale.live.items()}
    print(f"\n{refuse.__name__}: {sum(codes.values())} Route + Generate pairs over {REFUSING_S:.0f} s of refused "
          f"writes: {codes}; region state ages at the end {', '.join(f'{r} {a:.0f} s' for r, a in ages.items())}; "
          f"{victim} stopped at {stopped_at:.1f} s; receipts queued then booked: {len(receipts)} -> ledger "
          f"requests {usage.requests} (pending while refused: {pending})")
    assert codes == {"OK": sum(codes.values())}, codes
    assert min(ages.values()) > 5.0, "the regions' state should have gone stale: they could not publish"
    assert all(survivor in ranked for _, ranked in rankings), "a region whose probe answers was dropped"
    assert stopped_at is not None
    assert not any(victim in ranked for at, ranked in rankings if at >= stopped_at + 3.0)
    assert usage.requests == len(receipts)
    assert usage.energy_j == pytest.approx(sum(r.energy_j for r in receipts))
