"""Honest billing through a real router and stub regions: a stream that relayed text and then
ended early (client cancel, client deadline, the router's max stream duration, the region
dying) books exactly one partial receipt in the ledger and one in the audit stream; a hard
budget refuses interactive work under the shipped default policy."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from scheduler.client import AsyncSchedulerClient, SchedulerRpcError
from scheduler.client.common import build_request
from scheduler.ledger.budget import TenantBudget
from scheduler.ledger.ledger import Ledger
from scheduler.server.app import RunningRouter
from scheduler.state import keys
from scheduler.state.memory_store import MemoryStore
from scheduler.v1 import router_pb2_grpc

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration

# With the slow fleet (conftest.SLOW_TOKEN_S between two words), a stream long enough to end early on purpose.
MAX_TOKENS = 200



async def billed(router: RunningRouter, store: MemoryStore, wait_s: float = 3.0) -> tuple[list[dict[str, str]], float]:
    """The audit entries and the ledger's request count once the first of each arrived, plus a
    quiet period (so a second booking would show)."""
    ledger = Ledger(store)
    audit: list[dict[str, str]] = []
    requests = 0.0
    for _ in range(int(wait_s / 0.05)):
        audit = [fields for _, fields in await store.xrange(keys.AUDIT, 100)]
        requests = (await ledger.usage("local"))[0].requests
        if audit and requests:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # the ledger writes every ~1 s: a double booking would land by now
    audit = [fields for _, fields in await store.xrange(keys.AUDIT, 100)]
    return audit, (await ledger.usage("local"))[0].requests


def assert_one_partial(audit: list[dict[str, str]], requests: float, end_reason: str) -> None:
    print(f"\naudit entries: {[(a['end_reason'], a['partial'], a['energy_j']) for a in audit]}; "
          f"ledger requests: {requests:.0f}")
    assert len(audit) == 1 and requests == 1
    assert audit[0]["partial"] == "1" and audit[0]["end_reason"] == end_reason
    assert float(audit[0]["energy_j"]) > 0 and float(audit[0]["carbon_g"]) > 0


async def test_a_client_cancel_mid_stream_books_one_partial_receipt(
    slow_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        call = router_pb2_grpc.GlobalRouterStub(channel).Generate(
            build_request(prompt="hello", model="llama-3.1-8b", max_tokens=MAX_TOKENS))
        chunks = 0
        async for event in call:
            chunks += event.WhichOneof("event") == "chunk"
            if chunks == 5:
                break
        call.cancel()
    audit, requests = await billed(router, store)
    assert_one_partial(audit, requests, "cancelled")


async def test_a_client_deadline_mid_stream_books_one_partial_receipt(
    slow_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={})
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate("hello", model="llama-3.1-8b", max_tokens=MAX_TOKENS, timeout_s=1.0)
        with pytest.raises(SchedulerRpcError) as caught:
            await generation.text()
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    audit, requests = await billed(router, store)
    assert_one_partial(audit, requests, "deadline")


async def test_the_routers_max_stream_duration_ends_the_stream_with_a_partial_receipt(
    slow_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={})
    dispatcher = router.deps.dispatcher
    dispatcher.settings = dataclasses.replace(dispatcher.settings, max_stream_s=0.6)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate("hello", model="llama-3.1-8b", max_tokens=MAX_TOKENS, timeout_s=30.0)
        parts: list[str] = []
        with pytest.raises(SchedulerRpcError) as caught:
            async for part in generation:
                parts.append(part)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "max_stream_s" in caught.value.message
        # The client still got the partial receipt, before the status.
        receipt = generation.receipt
        assert receipt is not None and receipt.partial and receipt.end_reason == "deadline"
        relayed = len("".join(parts).split())
        print(f"\n{relayed} words relayed in 0.6 s; receipt bills {receipt.completion_tokens} completion tokens")
        assert 0 < receipt.completion_tokens < MAX_TOKENS and receipt.completion_tokens == relayed
    audit, requests = await billed(router, store)
    assert_one_partial(audit, requests, "deadline")
    assert audit[0]["decision_id"] == receipt.decision_id


async def test_a_region_dying_mid_stream_books_one_partial_receipt(
    slow_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={})
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate("hello", model="llama-3.1-8b", max_tokens=MAX_TOKENS, timeout_s=30.0)
        parts = 0
        with pytest.raises(SchedulerRpcError) as caught:
            async for _ in generation:
                parts += 1
                if parts == 5:
                    for stub in slow_fleet.regions.values():
                        await stub.stop()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
        receipt = generation.receipt
        assert receipt is not None and receipt.partial and receipt.end_reason == "region-error"
        assert receipt.completion_tokens >= 5
    audit, requests = await billed(router, store)
    assert_one_partial(audit, requests, "region-error")


async def test_an_interactive_request_past_a_hard_budget_is_refused(
    slow_fleet: Fleet, make_router: RouterFactory
) -> None:
    store = MemoryStore()
    router = await make_router(slow_fleet.configs, store=store, budgets={"local": TenantBudget(hard_energy_j=1e-6)})
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        assert await client.generate("hello", model="llama-3.1-8b", max_tokens=2).text()
        refused = None
        for _ in range(60):
            try:
                # The SDK's default class is interactive; the default policy exempts nothing.
                await client.generate("again", model="llama-3.1-8b", max_tokens=2,
                                      workload_class="interactive").text()
            except SchedulerRpcError as exc:
                refused = exc
                break
            await asyncio.sleep(0.1)
        assert refused is not None and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
