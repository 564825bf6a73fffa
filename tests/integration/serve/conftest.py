"""One session-wide local stack for the Ray tests: Ray in-process, ONE region (eu-north) with
two pools (h200-long, max_model_len 2048, and a100-batch, 512), each its own vLLM CPU
engine with the tiny model, and the router, sharing Redis DB 4 under a fresh
namespace. Teardown stops the router, Serve and Ray, deletes the namespace and checks that
no child process is left behind."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import psutil
import pytest_asyncio

from scheduler.region.stack import LocalStack, StackOptions, live_children
from scheduler.tickets import CHAT_COMPLETIONS, COMPLETIONS, Ticket, body_digest, sign
from scheduler.tickets import HEADER as TICKET_HEADER

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_REGIONS", "redis://127.0.0.1:6379/4")
REGION = "eu-north"
# Tests' timeouts cover their bodies only (pytest: timeout_func_only): the stack bounds its own
# start (two vLLM engines on a busy 2-core machine) and stop (Serve, Ray, reaping leftovers).
STACK_START_TIMEOUT_S = 600.0
STACK_STOP_TIMEOUT_S = 240.0

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
        await asyncio.wait_for(local.start(), STACK_START_TIMEOUT_S)
        yield local
    finally:
        await asyncio.wait_for(local.stop(), STACK_STOP_TIMEOUT_S)
        leftovers = _wait_for_no_new_children(before, 30.0)
        assert not leftovers, f"processes left behind by Ray: {_describe(leftovers)}"


def ticket_headers(stack: LocalStack, body: dict[str, Any], *, pool: str = "h200-long", region: str = REGION,
                   sign_as: str | None = None, **overrides: Any) -> dict[str, str]:
    """A dispatch ticket for ``body`` signed as the stack's router signs them (``sign_as``:
    with another region's keys), with ``overrides`` of its claims."""
    assert stack.ticket_keys is not None
    digest = body_digest(body)
    assert digest is not None
    claims: dict[str, Any] = dict(
        decision_id=uuid.uuid4().hex, request_id="test", tenant="test", region=region, pool=pool,
        model=body["model"], max_tokens=body["max_tokens"], prompt_tokens_max=max(digest[1], 4096),
        body_sha256=digest[0], expires_at=time.time() + 30,
        endpoint=CHAT_COMPLETIONS if "messages" in body else COMPLETIONS,
    )
    claims.update(overrides)
    # The low-level signer: Ticket.sign refuses another region's keys (which a forger would not).
    return {TICKET_HEADER: sign(stack.ticket_keys.of(sign_as or claims["region"]), "ticket", asdict(Ticket(**claims)))}
