"""Fixtures for the ledger's integration tests: the shared Redis (db 3, a namespace per test,
cleaned up after) and a Redis server of the test's own (``redis_server.OwnRedis``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.ledger.redis_server import OwnRedis

SHARED_REDIS = "redis://127.0.0.1:6379/3"


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = f"test-ledger-{uuid.uuid4().hex[:12]}"
    yield ns
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        for key in client.scan_iter(match=f"sched:{ns}:*"):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()
