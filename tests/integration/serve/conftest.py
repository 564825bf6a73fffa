"""One session-wide local stack for the Ray tests: Ray in-process, ONE region (eu-north) with
the vLLM CPU engine and the tiny model, and the router, sharing Redis DB 4 under a fresh
namespace. Teardown stops the router, Serve and Ray, deletes the namespace and checks that
no child process is left behind."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator

import psutil
import pytest_asyncio

from scheduler.serve.stack import LocalStack, StackOptions, live_children

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_REGIONS", "redis://127.0.0.1:6379/4")
REGION = "eu-north"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _wait_for_no_new_children(before: set[int], timeout_s: float) -> set[int]:
    """Processes started since ``before`` (other fixtures' processes are theirs) still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = live_children() - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _describe(pids: set[int]) -> list[str]:
    described = []
    for pid in sorted(pids):
        try:
            described.append(f"{pid} {' '.join(psutil.Process(pid).cmdline()[:4])}")
        except psutil.NoSuchProcess:
            described.append(f"{pid} (gone)")
    return described


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack() -> AsyncIterator[LocalStack]:
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)
    local = LocalStack(StackOptions(
        only=(REGION,), state_url=REDIS_URL, namespace=f"test-serve-{uuid.uuid4().hex[:8]}",
        dashboard=False, http_port=0, carbon=True,
    ))
    before = live_children()
    try:
        await local.start()
        yield local
    finally:
        await local.stop()
        leftovers = _wait_for_no_new_children(before, 30.0)
        assert not leftovers, f"processes left behind by Ray: {_describe(leftovers)}"
