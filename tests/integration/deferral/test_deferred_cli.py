"""``scheduler deferred list|release|purge`` against the queue in Redis."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from scheduler.cli import main
from scheduler.deferral.queue import DeferralQueue, HeldRequest
from scheduler.state.redis_store import RedisStore

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"test-deferred-cli-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    try:
        found = list(client.scan_iter(match=f"sched:{name}:*", count=1000))
        if found:
            client.delete(*found)
    finally:
        client.close()


def hold(namespace: str, *items: HeldRequest) -> None:
    async def go() -> None:
        store = RedisStore.from_url(REDIS_URL, namespace)
        try:
            for item in items:
                await DeferralQueue(store).submit(item, b"ack")
        finally:
            await store.close()

    asyncio.run(go())


def due(namespace: str) -> list[str]:
    async def go() -> list[str]:
        store = RedisStore.from_url(REDIS_URL, namespace)
        try:
            return [i.request_id for i in await DeferralQueue(store).due()]
        finally:
            await store.close()

    return asyncio.run(go())


def hold_at(namespace: str, item: HeldRequest, now: float) -> None:
    async def go() -> None:
        store = RedisStore.from_url(REDIS_URL, namespace)
        try:
            await DeferralQueue(store, clock=lambda: now).submit(item, b"ack")
        finally:
            await store.close()

    asyncio.run(go())


def held_now(namespace: str) -> list[HeldRequest]:
    async def go() -> list[HeldRequest]:
        store = RedisStore.from_url(REDIS_URL, namespace)
        try:
            return await DeferralQueue(store).held()
        finally:
            await store.close()

    return asyncio.run(go())


def held(request_id: str, tenant: str, release_in: float) -> HeldRequest:
    now = time.time()
    return HeldRequest(request_id, tenant, now, now + 6 * 3600.0, now + release_in, "window",
                       "held for the forecast's lowest window before the deadline (21 against 30 now)",
                       region="eu-north", forecast_value=21.0, now_value=30.0, payload=b"x")


def test_list_and_release(namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    hold(namespace, held("a", "acme", 3600.0), held("b", "acme", 7200.0), held("c", "other", 1800.0))
    state = ["--state", REDIS_URL, "--namespace", namespace]
    assert main(["deferred", "list", *state, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    listed = listing["held"]
    assert [i["request_id"] for i in listed] == ["c", "a", "b"]
    assert listing["usage"]["acme"]["held"] == 2 and listing["usage"]["acme"]["bytes"] > 0
    assert {i["status"] for i in listed} == {"held"}
    assert listed[0]["reason"] == "window" and listed[0]["region"] == "eu-north"
    assert main(["deferred", "list", *state, "--tenant", "acme"]) == 0
    table = capsys.readouterr().out
    rows = [line.split()[0] for line in table.splitlines()[1:-2]]
    assert rows == ["a", "b"] and table.splitlines()[-2] == "2 held"
    assert table.splitlines()[-1].startswith("tenant acme: 2 held, ")

    assert due(namespace) == []
    assert main(["deferred", "release", *state, "a"]) == 2  # ids are a tenant's
    assert "--tenant" in capsys.readouterr().err
    assert main(["deferred", "release", *state, "--tenant", "other", "a"]) == 1  # other's "a": none
    assert main(["deferred", "release", *state, "--tenant", "acme", "a"]) == 0
    assert "released early (operator)" in capsys.readouterr().out
    assert due(namespace) == ["a"]
    assert main(["deferred", "release", *state, "--all", "--tenant", "other"]) == 0
    assert sorted(due(namespace)) == ["a", "c"]
    assert main(["deferred", "release", *state, "--tenant", "acme", "nobody"]) == 1
    assert "nobody: not held" in capsys.readouterr().err


def test_purge_a_tenant_and_what_expired(namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    late = HeldRequest("late", "other", now - 7200.0, now - 60.0, now - 3600.0, "window", "held", payload=b"x")
    hold(namespace, held("a", "acme", 3600.0), held("b", "acme", 7200.0), held("c", "other", 1800.0))
    state = ["--state", REDIS_URL, "--namespace", namespace]
    with pytest.raises(SystemExit) as refused:
        main(["deferred", "purge", *state])  # --tenant or --all-expired
    assert refused.value.code == 2 and "--all-expired" in capsys.readouterr().err
    assert main(["deferred", "purge", *state, "--tenant", "acme"]) == 0
    assert "purged 2 deferred requests and answers of tenant acme" in capsys.readouterr().out
    assert [i.request_id for i in held_now(namespace)] == ["c"]
    # A request past its deadline (its router never ran), held by a queue whose clock was then.
    hold_at(namespace, late, now - 7200.0)
    assert main(["deferred", "purge", *state, "--all-expired"]) == 0
    assert "purged 1 expired" in capsys.readouterr().out
    assert [i.request_id for i in held_now(namespace)] == ["c"]
