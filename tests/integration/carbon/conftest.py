"""Fixtures for the carbon provider and poller tests: provider API servers, an injected sleep
that records instead of waiting, and a Redis store on this area's DB (2) in a unique
namespace, emptied afterwards."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from scheduler.datalayer.carbon.http import PROVIDER_RETRY
from scheduler.datalayer.carbon.providers import ProviderOptions
from scheduler.state.redis_store import RedisStore
from tests.integration.carbon.carbon_apis import ApiServer, Seen

REDIS_URL = "redis://127.0.0.1:6379/2"


class RecordedSleeps:
    """An injected ``sleep``: records each delay and returns at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def sleeps() -> RecordedSleeps:
    return RecordedSleeps()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Seen], Any]], ApiServer]]:
    started: list[ApiServer] = []

    def start(route: Callable[[Seen], Any]) -> ApiServer:
        server = ApiServer(route).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def options(sleeps: RecordedSleeps) -> Callable[..., ProviderOptions]:
    def make(server: ApiServer, env: dict[str, str] | None = None, **overrides: Any) -> ProviderOptions:
        values: dict[str, Any] = {
            "base_url": server.url, "env": env or {}, "timeout_s": 5.0, "retry": PROVIDER_RETRY,
            "rng": random.Random(7), "sleep": sleeps, "clock": time.time,
        }
        values.update(overrides)
        return ProviderOptions(**values)

    return make


@pytest.fixture
async def redis_store() -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(REDIS_URL, f"carbon-test-{uuid.uuid4().hex[:10]}")
    if not await store.ping():
        await store.close()
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: these tests need the real one")
    yield store
    for key in await store.keys(""):
        await store.delete(key)
    await store.close()
