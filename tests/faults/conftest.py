"""Fixtures for fault scenarios: ``own_redis``, a private ``redis-server`` child process on a
free port (``tests.faults.redis_server.PrivateRedis``) that a test may kill, restart or stall
by its handle; the shared server at 127.0.0.1:6379 is never touched. Stopped at teardown if
the test left it running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.redis_server import PrivateRedis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()
