"""`scheduler route --explain --state URL`: the decision on what the routers see now; pools a
region does not report live are listed as rejected, "not served"."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.state import codec, keys
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.types import PoolLiveState, RegionLiveState

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")


@pytest.mark.timeout(60)
def test_route_explain_on_live_state_lists_unserved_pools(capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"test-explain-{uuid.uuid4().hex[:8]}"

    async def publish() -> None:
        store = RedisStore.from_url(REDIS_URL, namespace)
        try:
            state = RegionLiveState("eu-north", True, time.time(),
                                    {"h200-long": PoolLiveState(models={"llama-3.1-8b": 131072}, replicas=8)})
            await store.set(keys.region_state("eu-north"), codec.encode_region_state(state), ttl_s=60)
        finally:
            await store.close()

    asyncio.run(publish())
    try:
        code = main(["route", "--explain", "--jurisdiction", "EU", "--state", REDIS_URL, "--namespace", namespace])
        out = capsys.readouterr().out
    finally:
        asyncio.run(delete_namespace(REDIS_URL, namespace))
    assert code == 0
    line = next(line for line in out.splitlines() if line.split()[:2] == ["eu-north", "a100-batch"])
    assert "pool-served" in line and "not served: the region serves pools h200-long" in line
    assert out.splitlines()[0].startswith("chosen   eu-north / h200-long")


def test_route_on_an_unreachable_store_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["route", "--state", "redis://127.0.0.1:1/0"])
    assert code == exit_codes.FAILURE
    assert "--state redis://127.0.0.1:1/0: the store cannot be read" in capsys.readouterr().err
